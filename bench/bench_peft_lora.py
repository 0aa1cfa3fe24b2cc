#!/usr/bin/env python3
"""The PEFT baseline of bench/bench_qlora.sh: LoRA as its users run it, on transformers' LlamaForCausalLM.

The model: a preset of bench_pytorch_llama.py (model/config.h's shapes) as transformers' LlamaForCausalLM, random
weights drawn in bf16 on the GPU (no download; the throughput does not depend on the values), SDPA attention,
bf16 parameters, gradient checkpointing (non-reentrant), no KV cache. PEFT's LoraConfig with rank --rank, alpha
2 x rank, no dropout, on q, k, v, o, gate, up and down (every linear layer of the blocks), PEFT's defaults otherwise
(its adapters in fp32 over the bf16 base: autocast_adapter_dtype); fused AdamW on the adapters. Each step: one
micro-batch of B x T random tokens, labels = inputs (transformers shifts them), loss.backward(), the optimizer step.
Timed: the median of --steps steps after --warmup, with the GPU synchronized around each.

Prints one line
  RESULT tokens_per_s=... ms_per_step=... peak_mem_gib=... peak_reserved_gib=... trainable=...
peak_mem_gib: torch.cuda.max_memory_allocated over the whole run (base, adapters, optimizer, activations).

  bench_peft_lora.py --model llama3-8b -b 1 -t 2048 --rank 16 --steps 10 --warmup 3
"""
import argparse
import statistics
import sys
import time

for _module, _pip in (("numpy", "numpy"), ("torch", "torch"), ("transformers", "transformers"), ("peft", "peft")):
    try:
        __import__(_module)
    except ImportError as e:
        _why = "" if e.name == _module else f" (importing it failed: {(str(e).splitlines() or [repr(e)])[0]})"
        sys.exit(f"error: bench/bench_peft_lora.py needs {_module}{_why}: pip install {_pip}")
import peft  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from bench_pytorch_llama import PRESETS, Config  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def llama_model(cfg):
    """transformers' LlamaForCausalLM of cfg's shape, RoPE as transformers 4.x (rope_theta, rope_scaling) or 5
    (rope_parameters) reads it."""
    scaling = None
    if cfg.rope_factor:
        scaling = {"rope_type": "llama3", "factor": cfg.rope_factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192}
    config = transformers.LlamaConfig(
        vocab_size=cfg.vocab, hidden_size=cfg.channels, intermediate_size=cfg.ffn, num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads, max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.eps, tie_word_embeddings=cfg.tied, attention_bias=False, use_cache=False,
        attn_implementation="sdpa")
    if hasattr(config, "rope_parameters"):
        config.rope_parameters = dict(scaling or {"rope_type": "default"}, rope_theta=cfg.theta)
    else:
        config.rope_theta, config.rope_scaling = cfg.theta, scaling
    return transformers.LlamaForCausalLM(config)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="llama3-8b", help="a Llama preset of bench_pytorch_llama.py")
    p.add_argument("-b", "--batch-size", type=int, default=1)
    p.add_argument("-t", "--seq-len", type=int, default=2048)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--seed", type=int, default=1337)
    args = p.parse_args()
    if args.model not in PRESETS or PRESETS[args.model][11]:
        sys.exit(f"--model {args.model}: not a Llama preset of bench_pytorch_llama.py (no q/k/v biases): "
                 f"{', '.join(m for m in PRESETS if not PRESETS[m][11])}")
    for name in ("batch_size", "seq_len", "rank", "steps"):
        if getattr(args, name) < 1:
            sys.exit(f"--{name.replace('_', '-')} must be at least 1, not {getattr(args, name)}")

    if not torch.cuda.is_available():
        sys.exit("bench_peft_lora.py needs a GPU")
    cfg = Config(*PRESETS[args.model])
    device = torch.device("cuda")
    torch.manual_seed(args.seed)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}, "
          f"{torch.cuda.get_device_name(0)}; {args.model}: {cfg.text()}", flush=True)

    t0 = time.time()
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # the base drawn in bf16 on the GPU: no fp32 copy of it anywhere
    with device:
        model = llama_model(cfg)
    torch.set_default_dtype(default_dtype)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    lora = peft.LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0, target_modules=TARGETS,
                           task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, lora)
    model.train()
    trainable = [q for q in model.parameters() if q.requires_grad]
    n_trainable = sum(q.numel() for q in trainable)
    optimizer = torch.optim.AdamW(trainable, lr=args.lr, betas=(0.9, 0.999), weight_decay=0.0, fused=True)
    print(f"model built in {time.time() - t0:.1f} s: {sum(q.numel() for q in model.parameters())} parameters, "
          f"{n_trainable} trainable ({trainable[0].dtype} adapters), attention {model.config._attn_implementation}",
          flush=True)

    g = torch.Generator(device=device)
    g.manual_seed(args.seed)
    B, T = args.batch_size, args.seq_len
    times = []
    for step in range(args.warmup + args.steps):
        x = torch.randint(0, cfg.vocab, (B, T), device=device, generator=g)
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - start) * 1e3
        print(f"step {step + 1}: loss {loss.item():.4f} {ms:.1f} ms{' (warm-up)' if step < args.warmup else ''}",
              flush=True)
        if step >= args.warmup:
            times.append(ms)
    ms = statistics.median(times)
    gib = 2.0 ** 30
    print(f"RESULT tokens_per_s={B * T / ms * 1e3:.0f} ms_per_step={ms:.2f} "
          f"peak_mem_gib={torch.cuda.max_memory_allocated() / gib:.2f} "
          f"peak_reserved_gib={torch.cuda.max_memory_reserved() / gib:.2f} trainable={n_trainable}", flush=True)


if __name__ == "__main__":
    main()
