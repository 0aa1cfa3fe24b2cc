#!/usr/bin/env python3
"""transformers' side of test/test_hf_interop.sh (needs torch and transformers; runs on the CPU, in fp32).

    hf_interop_check.py random DIR --layers L --channels C --heads NH --positions T --seed S
        a randomly initialised GPT2LMHeadModel (vocab 50257, every parameter perturbed so that a mixed-up
        tensor shows), saved with save_pretrained as model.safetensors
    hf_interop_check.py logits DIR_A DIR_B      max |logit difference| of two folders on random tokens
    hf_interop_check.py val-loss DIR --val-data GLOB --batch-size B --seq-len T --batches N
        mean cross-entropy over the first N validation batches in train_gpt's order (docs/formats.md)
    hf_interop_check.py tokenizer DIR           AutoTokenizer of the folder encodes as GPT-2 does
    hf_interop_check.py greedy DIR --new-tokens N
        generate(do_sample=False) of at most N tokens after <|endoftext|>, stopping at the generation config's end
        token, decoded (as train_gpt --generate N --temperature 0 prints it: the text, then a newline)
Each prints one number or line on stdout.
"""
import argparse
import os
import sys

# a package that cannot be imported: one line that names it and how to install it, no traceback
for _module, _pip in (("torch", "torch"), ("transformers", "transformers"), ("safetensors", "safetensors"),
                      ("numpy", "numpy")):
    try:
        __import__(_module)
    except ImportError as e:
        _why = "" if e.name == _module else f" (importing it failed: {(str(e).splitlines() or [repr(e)])[0]})"
        sys.exit(f"error: test/tools/hf_interop_check.py needs {_module}{_why}: pip install {_pip}")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel  # noqa: E402

REFERENCE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "reference")
sys.path.insert(0, REFERENCE_DIR)
from gpt2_reference import ShardLoader  # noqa: E402  (the batch order train_gpt's dataloader follows)


def load(path):
    return GPT2LMHeadModel.from_pretrained(path).float().eval()  # a bf16 export upcasts exactly


def cmd_random(a):
    torch.manual_seed(a.seed)
    config = GPT2Config(vocab_size=50257, n_positions=a.positions, n_embd=a.channels, n_layer=a.layers, n_head=a.heads)
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        for p in model.parameters():  # LayerNorm weights and biases too (they start at 1 and 0)
            p.add_(0.02 * torch.randn_like(p))
    try:
        model.save_pretrained(a.dir, safe_serialization=True)
    except TypeError:  # versions where safetensors is the only format
        model.save_pretrained(a.dir)
    assert os.path.exists(os.path.join(a.dir, "model.safetensors")), "save_pretrained wrote no model.safetensors"
    print(sum(p.numel() for p in model.parameters()))


@torch.no_grad()
def cmd_logits(a):
    m1, m2 = load(a.dir_a), load(a.dir_b)
    T = m1.config.n_positions
    ids = torch.randint(0, m1.config.vocab_size, (2, T), generator=torch.Generator().manual_seed(1))
    print(f"{(m1(ids).logits - m2(ids).logits).abs().max().item():.3g}")


@torch.no_grad()
def cmd_val_loss(a):
    model = load(a.dir)
    loader = ShardLoader(a.val_data, a.batch_size, a.seq_len, model.config.vocab_size)
    total, count = 0.0, 0
    for _ in range(a.batches):
        x, y = loader.next_batch()
        logits = model(x).logits.float()
        losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
        total += losses.double().sum().item()
        count += losses.numel()
    print(f"{total / count:.9f}")


def cmd_tokenizer(a):
    tok = AutoTokenizer.from_pretrained(a.dir)
    text = "Hello world<|endoftext|> ROMEO: O, she doth teach the torches to burn bright!"
    ids = tok(text)["input_ids"]
    ok = ids[:3] == [15496, 995, 50256] and tok.decode(ids) == text and tok.eos_token_id == 50256
    print(f"{'ok' if ok else 'wrong'} {type(tok).__name__}: {len(ids)} tokens {ids[:6]}...")


@torch.no_grad()
def cmd_greedy(a):
    model = load(a.dir)
    assert model.generation_config.eos_token_id == 50256, f"the exported generation config's eos_token_id is {model.generation_config.eos_token_id}, not 50256"
    start = torch.tensor([[50256]])
    ids = model.generate(start, attention_mask=torch.ones_like(start), do_sample=False, max_new_tokens=a.new_tokens, pad_token_id=50256)
    sys.stdout.write(AutoTokenizer.from_pretrained(a.dir).decode(ids[0, 1:].tolist()) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("random")
    r.add_argument("dir")
    for flag in ("--layers", "--channels", "--heads", "--positions", "--seed"):
        r.add_argument(flag, type=int, required=True)
    g = sub.add_parser("logits")
    g.add_argument("dir_a")
    g.add_argument("dir_b")
    v = sub.add_parser("val-loss")
    v.add_argument("dir")
    v.add_argument("--val-data", required=True)
    for flag in ("--batch-size", "--seq-len", "--batches"):
        v.add_argument(flag, type=int, required=True)
    t = sub.add_parser("tokenizer")
    t.add_argument("dir")
    n = sub.add_parser("greedy")
    n.add_argument("dir")
    n.add_argument("--new-tokens", type=int, required=True)
    a = p.parse_args()
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    {"random": cmd_random, "logits": cmd_logits, "val-loss": cmd_val_loss, "tokenizer": cmd_tokenizer, "greedy": cmd_greedy}[a.cmd](a)


if __name__ == "__main__":
    main()
