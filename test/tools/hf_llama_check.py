#!/usr/bin/env python3
"""The Llama family's side of test/test_hf_interop.sh.

NumPy only:
    hf_llama_check.py make DIR --arch llama|qwen2 --dtype F32|F16|BF16 [--shards N] [--seed S]
        a small Hugging Face folder written with numpy: config.json and random tensors in model.safetensors (or N
        shards and model.safetensors.index.json). llama: 2 query heads sharing 1 key/value head, an untied head,
        llama3 rope scaling; qwen2: q/k/v biases, a tied head, theta 1e6, eps 1e-6.
    hf_llama_check.py make-bnb SRC DST [--single] [--dequantized DIR]
        SRC (one model.safetensors) as bitsandbytes saves it quantized to 4-bit NF4 (load_in_4bit, nf4, double
        quantization unless --single): each q/k/v/o/gate/up/down weight as Linear4bit's state dict (the packed codes,
        U8 ((n + 1) / 2, 1); absmax, U8 codes or F32; quant_map; nested_absmax, nested_quant_map; the quant state's JSON
        in quant_state.bitsandbytes__nf4), quantized by scripts/reference/nf4_reference.py, config.json's
        quantization_config; --dequantized: also DIR, SRC with those weights dequantized (F32)
    hf_llama_check.py exact-requantize SRC
        each q/k/v/o/gate/up/down weight of SRC, and nf4_reference.py's fixture arrays, NF4-quantized (double and
        single), dequantized, quantized again without double quantization and dequantized: the same weights bit for
        bit, but in blocks whose absmax dequantizes negative (none in SRC)
    hf_llama_check.py same-tensors DIR_A DIR_B [--values]
        every tensor of the two folders (single or sharded) has the same name, dtype, shape and bytes (--values: the
        same values, whatever the dtypes: an F16 folder imported to fp32 and exported as F32)
With torch and transformers (fp32, on the CPU):
    hf_llama_check.py random DIR --arch llama|qwen2 [--seed S]
        LlamaForCausalLM / Qwen2ForCausalLM of the same shapes built from a config (no download), every parameter
        perturbed, saved with save_pretrained
    hf_llama_check.py ours-vs-hf MODEL.bin DIR
        logits of our model file (scripts/reference/llama_reference.py's model read from it) against the folder's
        from_pretrained model: max |difference| / max |transformers| (llama_reference.py's tolerance is 1e-4)
    hf_llama_check.py hf-vs-hf DIR_A DIR_B      max |logit difference| of two folders (0: the same model)
With peft too:
    hf_llama_check.py peft-vs-merged BASE_DIR ADAPTER_DIR MERGED_DIR
        PeftModel.from_pretrained(base, ADAPTER_DIR)'s logits against the merged folder's (train_gpt --lora-merge,
        exported): max |difference| / max |merged|
With torch (fp32, on the CPU):
    hf_llama_check.py masked-loss MODEL.bin SHARD WINDOWS
        the mean cross-entropy over the counted targets (SHARD.mask, docs/formats.md) of SHARD's first WINDOWS windows,
        each a row of its mask's T tokens whose targets are the next tokens, as train_gpt's validation loss reads them
        (llama_reference.py's model read from MODEL.bin; F.cross_entropy with ignore_index): "LOSS COUNTED"
Each prints one line on stdout; errors one line on stderr, exit 1.
"""
import argparse
import json
import os
import sys

# a package that cannot be imported: one line that names it and how to install it, no traceback
for _module, _pip in (("numpy", "numpy"),):
    try:
        __import__(_module)
    except ImportError as e:
        _why = "" if e.name == _module else f" (importing it failed: {(str(e).splitlines() or [repr(e)])[0]})"
        sys.exit(f"error: test/tools/hf_llama_check.py needs {_module}{_why}: pip install {_pip}")
import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts", "hf"))
from export_hf import InputError, bf16_bits, load_tensor, read_safetensors, read_safetensors_header, write_safetensors  # noqa: E402

SHAPES = {  # layers, channels, heads, kv heads, ffn, vocab, max positions
    "llama": (2, 128, 2, 1, 256, 300, 64),
    "qwen2": (2, 128, 2, 1, 192, 200, 64),
}


def hf_config(arch):
    L, C, NH, KV, F, V, T = SHAPES[arch]
    common = dict(vocab_size=V, hidden_size=C, intermediate_size=F, num_hidden_layers=L, num_attention_heads=NH,
                  num_key_value_heads=KV, hidden_act="silu", max_position_embeddings=T, initializer_range=0.02,
                  use_cache=False, attention_dropout=0.0, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if arch == "llama":
        return dict(common, architectures=["LlamaForCausalLM"], model_type="llama", rms_norm_eps=1e-5,
                    tie_word_embeddings=False, attention_bias=False, mlp_bias=False, head_dim=C // NH,
                    rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
    return dict(common, architectures=["Qwen2ForCausalLM"], model_type="qwen2", rms_norm_eps=1e-6,
                tie_word_embeddings=True, rope_theta=1000000.0, rope_scaling=None, use_sliding_window=False,
                sliding_window=None, max_window_layers=L)


def hf_shapes(arch):
    L, C, NH, KV, F, V, T = SHAPES[arch]
    D = C // NH
    shapes = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,)}
    for l in range(L):
        p = f"model.layers.{l}."
        shapes.update({p + "input_layernorm.weight": (C,), p + "self_attn.q_proj.weight": (C, C),
                       p + "self_attn.k_proj.weight": (KV * D, C), p + "self_attn.v_proj.weight": (KV * D, C),
                       p + "self_attn.o_proj.weight": (C, C), p + "post_attention_layernorm.weight": (C,),
                       p + "mlp.gate_proj.weight": (F, C), p + "mlp.up_proj.weight": (F, C),
                       p + "mlp.down_proj.weight": (C, F)})
        if arch == "qwen2":
            shapes.update({p + "self_attn.q_proj.bias": (C,), p + "self_attn.k_proj.bias": (KV * D,),
                           p + "self_attn.v_proj.bias": (KV * D,)})
    if arch == "llama":
        shapes["lm_head.weight"] = (V, C)
    return shapes


def cmd_make(a):
    rng = np.random.default_rng(a.seed)
    named = []
    for name, shape in hf_shapes(a.arch).items():
        x = rng.standard_normal(shape).astype(np.float32) * 0.02 + (1.0 if name.endswith("norm.weight") else 0.0)
        named.append((name, bf16_bits(x) if a.dtype == "BF16" else x))
    os.makedirs(a.dir, exist_ok=True)
    config = dict(hf_config(a.arch), torch_dtype="bfloat16" if a.dtype == "BF16" else "float32")
    with open(os.path.join(a.dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    if a.shards <= 1:
        write_safetensors(os.path.join(a.dir, "model.safetensors"), named, a.dtype, {"format": "pt"})
    else:
        weight_map = {}
        for i in range(a.shards):
            file = f"model-{i + 1:05d}-of-{a.shards:05d}.safetensors"
            part = named[i::a.shards]
            write_safetensors(os.path.join(a.dir, file), part, a.dtype, {"format": "pt"})
            weight_map.update({name: file for name, _ in part})
        with open(os.path.join(a.dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2)
    print(f"{sum(x.size for _, x in named)} parameters, {a.dtype}, {max(a.shards, 1)} file(s)")


LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def nf4_reference():
    sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts", "reference"))
    import nf4_reference
    return nf4_reference


def linear_weights(tensors):
    return [name for name in tensors if name.split(".")[-2] in LINEAR and name.endswith(".weight")]


def cmd_make_bnb(a):
    nf4 = nf4_reference()
    tensors = read_safetensors(os.path.join(a.src, "model.safetensors"))
    double = not a.single
    linear = set(linear_weights(tensors))
    named, dtypes, dequantized = [], {}, []
    for name, w in tensors.items():
        if name not in linear:
            named.append((name, w))
            dtypes[name] = "F32"
            dequantized.append((name, w))
            continue
        state = nf4.quantize(w, double)
        dequantized.append((name, nf4.dequantize(state).reshape(w.shape)))
        quant_state = {"quant_type": "nf4", "blocksize": nf4.BLOCK, "dtype": "float32", "shape": list(w.shape)}
        parts = [("", state["packed"].reshape(-1, 1), "U8"), (".quant_map", nf4.NF4, "F32")]
        if double:
            parts += [(".absmax", state["absmax_codes"], "U8"), (".nested_absmax", state["nested_absmax"], "F32"),
                      (".nested_quant_map", nf4.dynamic_map(), "F32")]
            quant_state.update(nested_blocksize=nf4.NESTED_BLOCK, nested_dtype="float32", nested_offset=float(state["offset"]))
        else:
            parts.append((".absmax", state["absmax"], "F32"))
        parts.append((".quant_state.bitsandbytes__nf4", np.frombuffer(json.dumps(quant_state).encode(), dtype=np.uint8), "U8"))
        for suffix, x, dtype in parts:
            named.append((name + suffix, x))
            dtypes[name + suffix] = dtype
    with open(os.path.join(a.src, "config.json")) as f:
        config = json.load(f)
    quantized = dict(config, quantization_config={
        "quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": False, "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": double, "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_quant_storage": "uint8"})
    for d, config_json, tensors_out, types in ((a.dst, quantized, named, dtypes), (a.dequantized, config, dequantized, "F32")):
        if d is None:
            continue
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(config_json, f, indent=2)
        write_safetensors(os.path.join(d, "model.safetensors"), tensors_out, types, {"format": "pt"})
    print(f"{len(linear)} weights in NF4 ({'double' if double else 'single'} quantization)")


def cmd_exact_requantize(a):
    nf4 = nf4_reference()
    tensors = read_safetensors(os.path.join(a.src, "model.safetensors"))
    # the folder's weights, and the reference's own fixtures (blocks of zeros, a huge weight, threshold ties, tiny and
    # subnormal absmaxes)
    folder = {name: tensors[name] for name in linear_weights(tensors)}
    weights = dict(folder, **nf4.fixture_inputs(1234))
    excluded = {}
    for name, w in weights.items():
        for double in (True, False):
            state = nf4.quantize(w, double)
            scales = nf4.block_scales(state)
            first = nf4.dequantize(state)
            again = nf4.dequantize(nf4.quantize(first, False))
            # a block whose absmax dequantizes negative (a double quantization that failed: a weight of 1e30 beside
            # ordinary ones) comes back with its weights' signs' codes: not compared, and none may be in the folder
            kept = np.repeat(scales >= 0, nf4.BLOCK)[:w.size]
            if (~kept).any():
                excluded[f"{name} ({'double' if double else 'single'})"] = int((scales < 0).sum())
            if not np.array_equal(first.view(np.uint32)[kept], again.view(np.uint32)[kept]):
                raise ValueError(f"{name} ({'double' if double else 'single'}): the weights dequantized again differ")
    if any(name.split(" ")[0] in folder for name in excluded):
        raise ValueError(f"a weight of the folder has blocks with a negative absmax: {excluded}")
    print(f"ok: {len(weights)} weights, double and single quantization: dequantized, quantized without double quantization "
          f"and dequantized again bit for bit (blocks with a negative absmax left out: " +
          ", ".join(f"{k} {v}" for k, v in excluded.items()) + ")")


def folder_tensors(d, values=False):
    """{name: (dtype, shape, bytes)} of a folder's safetensors (single or sharded)."""
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for file in files:
        path = os.path.join(d, file)
        with open(path, "rb") as f:
            data = f.read()
        for name, (dtype, shape, offset) in read_safetensors_header(path).items():
            if values:
                out[name] = ("value", shape, load_tensor(path, (dtype, shape, offset)).tobytes())
                continue
            size = int(np.prod(shape)) * {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}[dtype]
            out[name] = (dtype, shape, data[offset:offset + size])
    return out


def cmd_same_tensors(a):
    ta, tb = folder_tensors(a.dir_a, a.values), folder_tensors(a.dir_b, a.values)
    if set(ta) != set(tb):
        only = sorted(set(ta) ^ set(tb))
        raise InputError(f"the folders hold different tensors ({only[0]}{' ...' if len(only) > 1 else ''})")
    for name in sorted(ta):
        if ta[name] != tb[name]:
            (da, sa, _), (db, sb, _) = ta[name], tb[name]
            raise InputError(f"tensor {name} differs ({da} {list(sa)} vs {db} {list(sb)}"
                             f"{', bytes differ' if (da, sa) == (db, sb) else ''})")
    print(f"ok: {len(ta)} tensors {'of the same values' if a.values else 'bit for bit'}")


# ---- torch and transformers

def transformers_model(arch):
    """The model of hf_config(arch), RoPE set as llama_reference.py sets it: transformers 5 reads
    config.rope_parameters (theta included), 4.x rope_theta and rope_scaling."""
    import transformers
    config = dict(hf_config(arch), attn_implementation="eager")
    for key in ("architectures", "model_type"):
        config.pop(key)
    theta, scaling = config.pop("rope_theta"), config.pop("rope_scaling")
    cls, config_cls = ((transformers.LlamaForCausalLM, transformers.LlamaConfig) if arch == "llama" else
                       (transformers.Qwen2ForCausalLM, transformers.Qwen2Config))
    hf_config_object = config_cls(**config)
    if hasattr(hf_config_object, "rope_parameters"):
        hf_config_object.rope_parameters = dict(scaling or {"rope_type": "default"}, rope_theta=theta)
    else:
        hf_config_object.rope_theta, hf_config_object.rope_scaling = theta, scaling
    return cls(hf_config_object)


def load_hf(d):
    import transformers
    return transformers.AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager").float().eval()


def tokens(vocab, T):
    import torch
    return torch.randint(0, vocab, (2, T), generator=torch.Generator().manual_seed(1))


def cmd_random(a):
    import torch
    torch.manual_seed(a.seed)
    model = transformers_model(a.arch).float()
    with torch.no_grad():
        for p in model.parameters():  # norm weights too (they start at 1), so that a mixed-up tensor shows
            p.add_(0.02 * torch.randn_like(p))
    model.save_pretrained(a.dir)
    print(sum(p.numel() for p in model.parameters()))


def no_tf32():
    import torch
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False


def cmd_ours_vs_hf(a):
    import torch
    sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts", "reference"))
    import llama_reference
    no_tf32()
    ours = llama_reference.read_model(a.model).eval()
    hf = load_hf(a.dir)
    ids = tokens(hf.config.vocab_size, min(32, hf.config.max_position_embeddings))
    with torch.no_grad():
        mine, _ = ours(ids)
        theirs = hf(input_ids=ids, use_cache=False).logits.float()
    ratio = ((mine - theirs).abs().max() / theirs.abs().max()).item()
    print(f"{ratio:.3g}")


def cmd_hf_vs_hf(a):
    import torch
    no_tf32()
    m1, m2 = load_hf(a.dir_a), load_hf(a.dir_b)
    ids = tokens(m1.config.vocab_size, min(32, m1.config.max_position_embeddings))
    with torch.no_grad():
        l1 = m1(input_ids=ids, use_cache=False).logits
        l2 = m2(input_ids=ids, use_cache=False).logits
    print(f"{(l1 - l2).abs().max().item():.3g}")


def cmd_peft_vs_merged(a):
    import torch
    from peft import PeftModel
    no_tf32()
    peft = PeftModel.from_pretrained(load_hf(a.base), a.adapters).eval()
    merged = load_hf(a.merged)
    ids = tokens(merged.config.vocab_size, min(32, merged.config.max_position_embeddings))
    with torch.no_grad():
        theirs = peft(input_ids=ids, use_cache=False).logits.float()
        ours = merged(input_ids=ids, use_cache=False).logits.float()
    print(f"{((theirs - ours).abs().max() / ours.abs().max()).item():.3g}")


def read_token_shard(path):
    header = np.fromfile(path, dtype="<i4", count=256)
    formats = {(20240520, 1): "<u2", (20240801, 7): "<u4"}
    if len(header) < 256 or (int(header[0]), int(header[1])) not in formats:
        raise InputError(f"{path}: not a token shard (docs/formats.md)")
    return np.fromfile(path, dtype=formats[(int(header[0]), int(header[1]))], offset=1024, count=int(header[2]))


def read_mask_shard(path):
    header = np.fromfile(path, dtype="<i4", count=256)
    if len(header) < 256 or int(header[0]) != 20261215 or int(header[1]) != 1:
        raise InputError(f"{path}: not a mask shard (docs/formats.md)")
    return np.fromfile(path, dtype=np.uint8, offset=1024, count=int(header[2])), int(header[3])


def cmd_masked_loss(a):
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts", "reference"))
    import llama_reference
    tokens = read_token_shard(a.shard)
    mask, T = read_mask_shard(a.shard + ".mask")
    n = a.windows * T
    if n + 1 > len(tokens):
        raise InputError(f"{a.shard}: {len(tokens)} tokens, fewer than {a.windows} windows of {T} and one")
    inputs = torch.from_numpy(tokens[:n].astype("int64")).view(a.windows, T)
    targets = torch.from_numpy(tokens[1:n + 1].astype("int64")).view(a.windows, T)
    targets[torch.from_numpy(mask[1:n + 1] == 0).view(a.windows, T)] = -1
    model = llama_reference.read_model(a.model).float().eval()
    total, counted = 0.0, int((targets >= 0).sum())
    with torch.no_grad():
        for rows in range(0, a.windows, 8):  # 8 windows at a time bound the logits' memory
            logits, _ = model(inputs[rows:rows + 8])
            total += F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets[rows:rows + 8].reshape(-1),
                                     ignore_index=-1, reduction="sum").item()
    print(f"{total / counted:.7f} {counted}")


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("make")
    s.add_argument("dir")
    s.add_argument("--arch", choices=sorted(SHAPES), required=True)
    s.add_argument("--dtype", choices=["F32", "F16", "BF16"], default="F32")
    s.add_argument("--shards", type=int, default=1)
    s.add_argument("--seed", type=int, default=1)
    s = sub.add_parser("make-bnb")
    s.add_argument("src")
    s.add_argument("dst")
    s.add_argument("--single", action="store_true")
    s.add_argument("--dequantized")
    s = sub.add_parser("exact-requantize")
    s.add_argument("src")
    s = sub.add_parser("same-tensors")
    s.add_argument("dir_a")
    s.add_argument("dir_b")
    s.add_argument("--values", action="store_true")
    s = sub.add_parser("random")
    s.add_argument("dir")
    s.add_argument("--arch", choices=sorted(SHAPES), required=True)
    s.add_argument("--seed", type=int, default=1)
    s = sub.add_parser("ours-vs-hf")
    s.add_argument("model")
    s.add_argument("dir")
    s = sub.add_parser("hf-vs-hf")
    s.add_argument("dir_a")
    s.add_argument("dir_b")
    s = sub.add_parser("peft-vs-merged")
    s.add_argument("base")
    s.add_argument("adapters")
    s.add_argument("merged")
    s = sub.add_parser("masked-loss")
    s.add_argument("model")
    s.add_argument("shard")
    s.add_argument("windows", type=int)
    a = p.parse_args(argv)
    try:
        {"make": cmd_make, "make-bnb": cmd_make_bnb, "exact-requantize": cmd_exact_requantize, "same-tensors": cmd_same_tensors,
         "random": cmd_random, "ours-vs-hf": cmd_ours_vs_hf,
         "hf-vs-hf": cmd_hf_vs_hf, "peft-vs-merged": cmd_peft_vs_merged,
         "masked-loss": cmd_masked_loss}[a.cmd](a)
    except (InputError, OSError, ValueError, KeyError, ImportError) as e:
        print(f"hf_llama_check.py: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
