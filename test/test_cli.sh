#!/usr/bin/env bash
# train_gpt's command line and input checks, without a GPU: --help, bad flags and values, bad model files,
# bad shards, sizes that don't divide. Each case must exit non-zero with a one-line error naming the
# flag or file.
set -u
cd "$(dirname "$0")/.."
BIN=./train_gpt
W=build/test_work/cli
rm -rf "$W"; mkdir -p "$W"

# expect_error NAME TEXT ARGS...: non-zero exit, and the first stderr line contains TEXT (a fixed string)
expect_error() {
    local name=$1 pattern=$2; shift 2
    local err rc
    err=$("$BIN" "$@" 2>&1 >/dev/null); rc=$?
    local first=$(printf '%s\n' "$err" | head -n 1)
    if [ $rc -ne 0 ] && printf '%s' "$first" | grep -qF -- "$pattern" && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ]; then
        echo "PASS cli $name"
    else
        echo "FAIL cli $name: rc=$rc, stderr: $err"
    fi
}

help=$($BIN --help); rc=$?
missing=""
for flag in $(grep -o '{"--[a-z0-9-]*"' train_options.h | tr -d '{"'); do
    printf '%s' "$help" | grep -q -- "$flag" || missing="$missing $flag"
done
if [ $rc -eq 0 ] && [ -z "$missing" ]; then echo "PASS cli --help lists every flag"; else echo "FAIL cli --help: rc=$rc missing:$missing"; fi
# --help shows each flag's accepted values after its default (from the table the parser checks them with)
wrong=""
for entry in "--beta1|[0.9; in [0, 1)]" "--zero-stage, -z|[1; one of 0, 1, 2, 3]" "--precision|[\"bf16\"; one of bf16, fp16, fp32, fp8]" \
             "--steps, -x|[-1; -1 or >= 0]" "--eps|[1e-08; > 0]" "--layers|[-1; -1 or in [1, 1024]]" "--nccl-timeout|[600; >= 1]"; do
    flag=${entry%%|*} shown=${entry#*|}
    printf '%s\n' "$help" | grep -F -- "  $flag " | grep -qF -- "$shown" || wrong="$wrong $flag"
done
if [ -z "$wrong" ]; then echo "PASS cli --help shows ranges and choices"; else echo "FAIL cli --help ranges and choices:$wrong"; fi

# shards: one good, one with a wrong magic, one truncated
python3 - "$W" <<'PY'
import struct, sys
d = sys.argv[1]
def shard(path, tokens, magic=20240520, version=1, count=None, cut=0):
    header = [magic, version, len(tokens) if count is None else count] + [0] * 253
    data = struct.pack("<256i", *header) + struct.pack(f"<{len(tokens)}H", *tokens)
    open(path, "wb").write(data[:len(data) - cut] if cut else data)
shard(f"{d}/good.bin", [i % 1000 for i in range(5000)])
shard(f"{d}/badmagic.bin", list(range(100)), magic=1234)
shard(f"{d}/truncated.bin", list(range(100)), cut=10)
open(f"{d}/badmodel.bin", "wb").write(struct.pack("<256i", *([999] + [0] * 255)))
# an adapter file header (docs/lora.md) of rank 4, alpha 8, target gate (128), 2 layers of 64 channels
alpha = struct.unpack("<i", struct.pack("<f", 8.0))[0]
open(f"{d}/gate_adapters.bin", "wb").write(struct.pack("<256i", *([20261127, 1, 4, alpha, 128, 2, 64, 4] + [0] * 248)))
PY
SMALL="--layers 2 --heads 1 --channels 64 --max-seq-len 64 --seq-len 32 --batch-size 2 --val-data="
expect_error "unknown flag" "unknown flag '--bogus'" --bogus 1
expect_error "flag without value" "flag --steps needs a value" --steps
expect_error "integer flag with text" "flag -b expects an integer, got 'x'" -b x
expect_error "float flag with text" "flag --lr expects a number" --lr fast
expect_error "bad precision" "--precision must be one of bf16, fp16, fp32, fp8, got 'fp4'" --precision fp4
expect_error "bad schedule" "--lr-schedule must be one of cosine, linear, constant, got 'step'" --lr-schedule step
expect_error "heads do not divide channels" "channels (100) must be divisible by heads (3)" --channels 100 --heads 3
expect_error "seq-len above max" "--seq-len must be in 1..64" --layers 2 --heads 1 --channels 64 --max-seq-len 64 --seq-len 128
expect_error "unsupported head size" "head size channels/heads = 96/3 must be 64" --channels 96 --heads 3
expect_error "missing model file" "cannot open model file" --model "$W/none.bin"
expect_error "bad model magic" "badmodel.bin: bad magic 999" --model "$W/badmodel.bin"
expect_error "no shards match" "no shard files match" $SMALL --train-data "$W/nothing_*.bin"
expect_error "shard with bad magic" "badmagic.bin" $SMALL --train-data "$W/badmagic.bin"
expect_error "truncated shard" "truncated.bin" $SMALL --train-data "$W/truncated.bin"
expect_error "total batch not a multiple" "--total-batch-tokens 100 is not a multiple of --batch-size x --seq-len = 64" $SMALL --train-data "$W/good.bin" --total-batch-tokens 100
expect_error "resume without output dir" "--resume needs --output-dir" $SMALL --resume 1
expect_error "bad ZeRO stage" "--zero-stage must be one of 0, 1, 2, 3, got 4" $SMALL --zero-stage 4
expect_error "bad recompute level" "--recompute must be one of 0, 1, 2, 3, got 5" $SMALL --recompute 5
expect_error "bad GELU fusion" "--gelu-fusion must be one of 0, 1, got 2" $SMALL --gelu-fusion 2
expect_error "bad deterministic" "--deterministic must be one of 0, 1, got 3" $SMALL --deterministic 3
expect_error "bad LoRA targets" "--lora-targets 'qkv,mlp': expected a comma list of qkv, attn-proj (o), fc, fc-proj (down), q, k, v, gate, up" $SMALL --lora-rank 4 --lora-targets qkv,mlp
expect_error "LoRA gate on GPT-2" "--lora-targets 'q,gate': gate and up adapt the Llama family's SwiGLU MLP; GPT-2's MLP input is one product, fc" $SMALL --lora-rank 4 --lora-targets q,gate
expect_error "adapter file with gate on GPT-2" "gate_adapters.bin: adapter targets 128: gate and up adapt the Llama family's SwiGLU MLP; GPT-2's MLP input is one product, fc" $SMALL --lora-load "$W/gate_adapters.bin"
expect_error "LoRA save without LoRA" "--lora-save and --lora-merge need LoRA" $SMALL --lora-save "$W/a.bin"
expect_error "bad base quantization" "--base-quant must be one of none, nf4, got 'nf8'" $SMALL --lora-rank 4 --base-quant nf8
expect_error "NF4 base without LoRA" "--base-quant nf4 quantizes the frozen base of a LoRA run: add --lora-rank (or --lora-load)" $SMALL --base-quant nf4
expect_error "NF4 base in fp16" "--base-quant nf4 runs in --precision bf16 (or fp32), got fp16" $SMALL --lora-rank 4 --base-quant nf4 --precision fp16
expect_error "packed NF4 products in bf16, not fp32" "--nf4-products packed multiplies in bf16, got --precision fp32: use --nf4-products dequantized" \
    $SMALL --lora-rank 4 --base-quant nf4 --nf4-products packed --precision fp32
expect_error "NF4 absmaxes with an NF4 base" "--nf4-double-quant 0 chooses how the NF4 base keeps its absmaxes: add --base-quant nf4" \
    $SMALL --lora-rank 4 --nf4-double-quant 0
expect_error "NF4 products with an NF4 base" "--nf4-products packed chooses how the products read an NF4 base: add --base-quant nf4" \
    $SMALL --lora-rank 4 --nf4-products packed
expect_error "NF4 base in fp8" "--base-quant nf4 runs in --precision bf16 (or fp32), got fp8" $SMALL --lora-rank 4 --base-quant nf4 --precision fp8
expect_error "missing adapter file" "none.bin: cannot open adapter file" $SMALL --lora-load "$W/none.bin"
expect_error "adapter file with bad magic" "badmodel.bin: bad adapter magic 999 (expected 20261127)" $SMALL --lora-load "$W/badmodel.bin"
# PEFT folders (a --lora-save path ending in '/'): the Llama family's per-projection targets only, refused before any GPU work
expect_error "PEFT folder for GPT-2" "--lora-save $W/peft/: a PEFT folder holds adapters of a Llama-family model (q_proj .. down_proj); this model is GPT-2: save an adapter file" $SMALL --lora-rank 4 --lora-targets q,v --lora-save "$W/peft/"
expect_error "PEFT folder with qkv" "--lora-save $W/peft/: PEFT has no module for the fused target qkv: use q,k,v" $SMALL --arch llama --lora-rank 4 --lora-targets qkv --lora-save "$W/peft/"
mkdir -p "$W/empty_peft"
expect_error "PEFT folder without config" "$W/empty_peft/adapter_config.json: cannot open: No such file or directory" $SMALL --arch llama --lora-load "$W/empty_peft"
expect_error "LoRA dropout out of range" "--lora-dropout must be in [0, 1), got 1.5" $SMALL --lora-rank 4 --lora-dropout 1.5
# ZeRO-Offload: what it runs with, refused before any GPU work
expect_error "bad offload" "--offload must be one of none, optimizer, optimizer,parameters, got 'gpu'" $SMALL --offload gpu
expect_error "offload at ZeRO-0" "--offload optimizer runs with --zero-stage 1, 2 or 3 (got 0)" $SMALL --offload optimizer --zero-stage 0
expect_error "offloaded parameters below ZeRO-3" "--offload optimizer,parameters runs with --zero-stage 3 (got 2)" $SMALL --offload optimizer,parameters --zero-stage 2
expect_error "offloaded parameters on one rank" "--offload optimizer,parameters needs at least 2 data-parallel ranks (got 1)" $SMALL --offload optimizer,parameters --zero-stage 3
expect_error "offload with LoRA" "--offload runs without LoRA" $SMALL --offload optimizer --lora-rank 4
expect_error "host budget 0" "--host-memory-gib must be -1 or a finite number > 0, got 0" $SMALL --offload optimizer --host-memory-gib 0
expect_error "host budget without offload" "--host-memory-gib bounds the pinned host memory of --offload, which is none" $SMALL --host-memory-gib 64
expect_error "bad delayed update" "--offload-delayed-update must be one of 0, 1, got 2" $SMALL --offload optimizer --offload-delayed-update 2
expect_error "fp8 refuses LoRA" "--precision fp8 runs without LoRA" $SMALL --precision fp8 --lora-rank 4
expect_error "fp8 rows not a multiple of 16" "--precision fp8 needs --batch-size x --seq-len to be a multiple of 16, got 1 x 31 = 31" $SMALL --batch-size 1 --seq-len 31 --precision fp8
expect_error "fp8 stats without fp8" "--fp8-stats 1 runs with --precision fp8 (got bf16)" $SMALL --fp8-stats 1
expect_error "fp8 scaling without fp8" "--fp8-scaling delayed runs with --precision fp8 (got bf16): it chooses the FP8 products' scales" $SMALL --fp8-scaling delayed
expect_error "fp8 amax history without delayed scaling" "--fp8-amax-history 8 runs with --fp8-scaling delayed (got current): current scaling keeps no history" $SMALL --precision fp8 --fp8-amax-history 8
expect_error "bad fp8 scaling" "--fp8-scaling must be one of current, delayed, got 'late'" --fp8-scaling late
expect_error "bad fp8 amax history" "--fp8-amax-history must be -1 or in [1, 1024], got 0" --fp8-amax-history 0
expect_error "delayed update without offload" "--offload-delayed-update 1 runs with --offload optimizer (got none)" $SMALL --offload-delayed-update 1
# the delayed update with --offload optimizer is accepted: the run stops at a later check
expect_error "delayed update accepted" "--resume needs --output-dir" $SMALL --offload optimizer --offload-delayed-update 1 --resume 1
# fp32 offloads too (no master weights: the host holds Adam's m and v): the run stops at a later check
expect_error "offload in fp32 accepted" "--resume needs --output-dir" $SMALL --offload optimizer --precision fp32 --host-memory-gib 8 --resume 1
# the NVMe tier (--offload-dir): with --offload, without the delayed update, a writable folder with room for the file
mkdir -p "$W/offload_dir"; touch "$W/offload_file"
expect_error "offload dir without offload" "--offload-dir runs with --offload optimizer or optimizer,parameters (got none)" $SMALL --offload-dir "$W/offload_dir"
expect_error "offload dir with the delayed update" "--offload-dir runs with --offload-delayed-update 0" $SMALL --offload optimizer --offload-dir "$W/offload_dir" --offload-delayed-update 1
expect_error "offload dir missing" "--offload-dir $W/missing: No such file or directory" $SMALL --offload optimizer --offload-dir "$W/missing"
expect_error "offload dir not a folder" "--offload-dir $W/offload_file is not a folder" $SMALL --offload optimizer --offload-dir "$W/offload_file"
expect_error "offload dir accepted" "--resume needs --output-dir" $SMALL --offload optimizer --offload-dir "$W/offload_dir" --resume 1
# a folder without room, and a read-only one: a private tmpfs (unshare -rm), where the system allows one
if unshare -rm true 2> /dev/null; then
    mkdir -p "$W/offload_small"
    # expect_line NAME START STDERR: STDERR is one line that starts with START
    expect_line() {
        if [[ $3 == "$2"* ]] && [ "$(printf '%s\n' "$3" | wc -l)" -eq 1 ]; then echo "PASS cli $1"; else echo "FAIL cli $1: $3"; fi
    }
    err=$(unshare -rm sh -c 'mount -t tmpfs -o size=64k none "$1" && shift && exec "$@"' sh "$W/offload_small" \
          "$BIN" $SMALL --offload optimizer --offload-dir "$W/offload_small" --resume 1 2>&1 >/dev/null)
    expect_line "offload dir without room" "error: --offload-dir $W/offload_small has 0.00 GiB free but the optimizer files need 0.04 GiB (1 rank x 0.04 GiB)" "$err"
    err=$(unshare -rm sh -c 'mount -t tmpfs -o size=64k,ro none "$1" && shift && exec "$@"' sh "$W/offload_small" \
          "$BIN" $SMALL --offload optimizer --offload-dir "$W/offload_small" --resume 1 2>&1 >/dev/null)
    expect_line "offload dir read-only" "error: --offload-dir $W/offload_small is not writable (Read-only file system)" "$err"
else
    echo "SKIP cli offload dir without room, read-only: no user and mount namespace (unshare -rm)"
fi

# every flag's range: integers parsed whole, never cut to fit an int; floats finite and in range
expect_error "integer above int" "--batch-size must be in [1, 2147483647], got 4294967297" --batch-size 4294967297
expect_error "integer above long" "--steps must be -1 or in [0, 2147483647], got 99999999999999999999" --steps 99999999999999999999
expect_error "ZeRO stage above int" "--zero-stage must be one of 0, 1, 2, 3, got 4294967305" --zero-stage 4294967305
expect_error "alias named with its flag" "-z (--zero-stage) must be one of 0, 1, 2, 3, got 9" -z 9
expect_error "lr nan" "--lr must be a finite number >= 0, got nan" --lr nan
expect_error "lr inf" "--lr must be a finite number >= 0, got inf" --lr inf
expect_error "lr beyond float" "--lr must be a finite number >= 0, got 1e39" --lr 1e39
expect_error "grad-clip nan" "--grad-clip must be a finite number >= 0, got nan" --grad-clip nan
expect_error "beta1 above 1" "--beta1 must be in [0, 1), got 5" --beta1 5
expect_error "beta2 of 1" "--beta2 must be in [0, 1), got 1" --beta2 1
expect_error "LoRA dropout nan" "--lora-dropout must be in [0, 1), got nan" --lora-dropout nan
expect_error "fp16 initial scale 0" "--fp16-initial-scale must be a finite number > 0, got 0" --fp16-initial-scale 0
expect_error "fp16 growth interval 0" "--fp16-growth-interval must be in [1, 2147483647], got 0" --fp16-growth-interval 0
expect_error "temperature negative" "--temperature must be a finite number >= 0, got -1" --temperature -1
expect_error "LoRA alpha 0" "--lora-alpha must be -1 or a finite number > 0, got 0" --lora-alpha 0
expect_error "eps that is 0 as a float" "--eps must be a finite number > 0, got 1e-50" --eps 1e-50
# 1e-40 is a float (a denormal) that strtof refused: the flags after it are read, and the run stops at a later check
expect_error "eps 1e-40 accepted" "--resume needs --output-dir" $SMALL --eps 1e-40 --resume 1
expect_error "steps negative" "--steps must be -1 or in [0, 2147483647], got -7" --steps -7
expect_error "generate negative" "--generate must be in [0, 2147483647], got -3" --generate -3
expect_error "top-k negative" "--top-k must be in [0, 2147483647], got -5" --top-k -5
expect_error "val-batches negative" "--val-batches must be in [1, 2147483647], got -1" --val-batches -1
expect_error "nccl-timeout negative" "--nccl-timeout must be in [1, 2147483647], got -1" --nccl-timeout -1
expect_error "total batch tokens 0" "--total-batch-tokens must be -1 or in [1, 2147483647], got 0" --total-batch-tokens 0
expect_error "layers 0" "--layers must be -1 or in [1, 1024], got 0" --layers 0
expect_error "seq-len 0" "--seq-len must be in [1, 1048576], got 0" --seq-len 0
expect_error "virtual stages negative" "--virtual-stages must be in [0, 2147483647], got -1" --virtual-stages -1
expect_error "sequence parallel switch" "--sequence-parallel must be one of 0, 1, got 2" --sequence-parallel 2
expect_error "keep-checkpoints negative" "--keep-checkpoints must be in [0, 2147483647], got -1" --keep-checkpoints -1
# --model: a dN whose N would overflow the shape, a dN whose width is too large, a directory
expect_error "model depth overflows" "--model d33554432: dN takes N (the number of layers) in 1..1024" --model d33554432
expect_error "model too wide" "model d300: channels (19200) must be at most 16384" --model d300
expect_error "model is a directory" "--model $W: is a directory; expected dN (e.g. d12) or an llm.c model file" --model "$W"
# the Llama family's flags and shapes (docs/errors.md): each flag's range, and the combinations refused
expect_error "bad arch" "--arch must be one of gpt2, llama, got 'opt'" --arch opt
expect_error "kv-heads 0" "--kv-heads must be -1 or in [1, 256], got 0" --kv-heads 0
expect_error "ffn below 8" "--ffn must be -1 or in [8, 65536], got 4" --ffn 4
expect_error "vocab 1" "--vocab must be -1 or in [2, 1048576], got 1" --vocab 1
expect_error "bad qkv-bias" "--qkv-bias must be one of -1, 0, 1, got 2" --qkv-bias 2
expect_error "bad tied-head" "--tied-head must be one of -1, 0, 1, got 2" --tied-head 2
expect_error "norm-eps 0" "--norm-eps must be -1 or in (0, 1), got 0" --norm-eps 0
expect_error "rope-theta 1" "--rope-theta must be -1 or a finite number > 1, got 1" --rope-theta 1
expect_error "Llama shape flag on a GPT-2 model" "--kv-heads/--ffn/--vocab/--qkv-bias/--tied-head/--norm-eps/--rope-theta/--rope-scaling shape a Llama-family model: add --arch llama or use a preset (llama3-1b, llama3-3b, llama3-8b, smollm2-135m, smollm2-360m, qwen2.5-0.5b, qwen2.5-7b)" --kv-heads 2
expect_error "preset with arch gpt2" "--arch gpt2: --model llama3-1b is a Llama-family preset" --model llama3-1b --arch gpt2
expect_error "bad rope scaling" "--rope-scaling 8: expected off or FACTOR,LOW,HIGH,POSITIONS (Llama 3.1: 8,1,4,8192)" --model d2 --arch llama --rope-scaling 8
expect_error "fp8 needs MLP widths of 16" "--precision fp8 needs the MLP's hidden units per tensor-parallel rank to be a multiple of 16 (FP8 products' widths), got 360 / 1" --model d2 --arch llama --ffn 360 --precision fp8
expect_error "kv heads that do not divide the heads" "model d2: key/value heads (3) must divide the 4 attention heads" --model d2 --arch llama --channels 256 --heads 4 --kv-heads 3
expect_error "micro-batch tokens above int" "--batch-size x --seq-len = 68719476736 tokens per micro-batch must be at most 2147483647" $SMALL --batch-size 1073741824 --seq-len 64 --train-data "$W/nothing_*.bin"
# checkpoint retention flags
expect_error "keep-every without keep-checkpoints" "--keep-every 5 needs --keep-checkpoints K" $SMALL --keep-every 5 -o "$W/ck"
expect_error "checkpoints without output dir" "--checkpoint-every needs --output-dir" $SMALL --checkpoint-every 5
# --resume 1 chooses a committed checkpoint and reads its headers before any GPU work: another shape or precision is
# refused in one line naming both values. The checkpoints are headers only (nothing else is read before the refusal),
# each file with its CRC-32C and a manifest naming them, as train_gpt commits them (docs/formats.md).
python3 - "$W" <<'PY'
import os, struct, sys
def crc32c(data):
    table = crc32c.table
    crc = 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF
crc32c.table = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ (0x82F63B78 & -(c & 1))
    crc32c.table.append(c)
def sealed(words, run, step):
    """a 1024-byte header with the run's identity in ints 240-243 and its CRC-32C in ints 254-255"""
    raw = bytearray(words + b"\0" * (1024 - len(words)))
    raw[960:976] = struct.pack("<iIIi", 0x494E5552, run & 0xFFFFFFFF, run >> 32, step)
    raw[1016:1024] = struct.pack("<iI", 0x43524343, 0)
    raw[1020:1024] = struct.pack("<I", crc32c(bytes(raw)))
    return bytes(raw)
def checkpoint(d, step, layers, heads, channels, precision, max_t=64, vocab=50257, run=0x1234567890abcdef):
    os.makedirs(d, exist_ok=True)
    model = sealed(struct.pack("<8i", 20240326, 3, max_t, vocab, layers, heads, channels, 50304), run, step)
    # state header v5: magic, version, sizeof(StateHeader), sizeof(DataLoaderState), then StateHeader (step, precision,
    # mesh 1x1x1 at 0,0,0, ZeRO stage, has_master, clean steps, loss scale, skipped steps, optimizer elements, run id);
    # at [130] the stage's block count
    state = struct.pack("<4i", 20261126, 5, 72, 64) + struct.pack("<11ifqqQ", step, precision, 1, 1, 1, 0, 0, 0, 1, 1, 0, 1.0, 0, 0, run)
    state += b"\0" * (512 - len(state)) + struct.pack("<3i", 1, 1, layers) + bytes(range(layers))
    state = sealed(state, run, step)
    files = {f"model_{step:08d}.bin": model, f"state_{step:08d}_00000.bin": state}
    lines = f"train_gpt checkpoint 1\nrun {run:016x}\nstep {step}\nprecision {'fp32 bf16 fp16'.split()[precision]}\nmesh 1 1 1 zero 1\n"
    for name, data in files.items():
        open(f"{d}/{name}", "wb").write(data)
        lines += f"file {name} {len(data)} {struct.unpack('<I', data[1020:1024])[0]:08x}\n"
    lines += f"end {crc32c(lines.encode()):08x}\n"
    open(f"{d}/manifest_{step:08d}.txt", "w").write(lines)
d = sys.argv[1]
checkpoint(f"{d}/ck_heads", 10, 2, 2, 128, 1)      # bf16 = 1
checkpoint(f"{d}/ck_heads", 5, 2, 1, 128, 1)       # older, of this run's shape: the newest one is checked
checkpoint(f"{d}/ck_layers", 10, 3, 1, 64, 1)
checkpoint(f"{d}/ck_maxt", 10, 2, 1, 64, 1, max_t=128)
checkpoint(f"{d}/ck_precision", 10, 2, 1, 64, 2)   # fp16 = 2
checkpoint(f"{d}/ck_other_run", 10, 2, 1, 64, 1)   # a fresh run must not start over it
# a byte changed in a header int no reader looks at: the file's CRC-32C no longer matches
def damage(path):
    with open(path, "r+b") as f:
        f.seek(900)
        b = f.read(1)
        f.seek(900)
        f.write(bytes([b[0] ^ 1]))
for folder in ("ck_damaged", "ck_verify"):
    checkpoint(f"{d}/{folder}", 10, 2, 1, 64, 1)
    checkpoint(f"{d}/{folder}", 5, 2, 1, 64, 1)
damage(f"{d}/ck_verify/state_00000010_00000.bin")
damage(f"{d}/ck_verify/model_00000005.bin")
# what --resume's checks before the GPU find (a byte damaged elsewhere is the load's to find: test_checkpoint_crash):
# a file whose header carries another CRC-32C than the manifest's (another attempt's), and one of another size
with open(f"{d}/ck_damaged/state_00000010_00000.bin", "r+b") as f:
    f.seek(1020)
    f.write(struct.pack("<I", 0x12345678))
with open(f"{d}/ck_damaged/model_00000005.bin", "ab") as f:
    f.write(b"\0")
L, C, T, Vp = 2, 64, 64, 50304
count = Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
with open(f"{d}/damaged_model.bin", "wb") as f:
    f.write(struct.pack("<256i", *([20240326, 3, T, 50257, L, 1, C, Vp] + [0] * 246 + [0x43524343, 0])))
    f.write(b"\0" * (4 * count))
with open(f"{d}/plain_model.bin", "wb") as f:  # a GPT-2 model file without a checksum (as llm.c writes them), all zeros
    f.write(struct.pack("<256i", *([20240326, 3, T, 50257, L, 1, C, Vp] + [0] * 248)))
    f.truncate(1024 + 4 * count)
PY
out=$(CUDA_VISIBLE_DEVICES= $BIN $SMALL --train-data "$W/good.bin" --resume 1 -o "$W/ck_damaged" 2> "$W/ck_damaged.err"); rc=$?
err=$(cat "$W/ck_damaged.err")
if [ $rc -ne 0 ] && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] &&
    printf '%s' "$err" | grep -qF -- "--resume 1: none of the 2 committed checkpoints in $W/ck_damaged is whole (the newest: $W/ck_damaged/state_00000010_00000.bin: CRC-32C 12345678, the manifest says" &&
    [ "$(printf '%s\n' "$out" | grep -c '^--resume 1: set checkpoint [0-9]* aside as \*.damaged: ')" -eq 2 ] &&
    [ -f "$W/ck_damaged/state_00000010_00000.bin.damaged" ] && [ -f "$W/ck_damaged/model_00000005.bin.damaged" ]; then
    echo "PASS cli resume with every checkpoint damaged: each named on stdout and set aside as *.damaged, one line on stderr, exit 1"
else
    echo "FAIL cli resume with every checkpoint damaged: rc=$rc, stderr: $err, stdout: $out"
fi
expect_error "damaged model file" "--model $W/damaged_model.bin: checksum mismatch" --model "$W/damaged_model.bin"
expect_error "model file with --arch" "--layers/--heads/--channels/--max-seq-len/--arch and the Llama shape flags apply to a dN model or a preset, not to a model file ($W/plain_model.bin)" \
    --model "$W/plain_model.bin" --arch llama
out=$($BIN --verify-checkpoints "$W/ck_verify" 2>&1); rc=$?
if [ $rc -eq 1 ] && [ "$(printf '%s\n' "$out" | grep -c ': damaged: .*checksum mismatch')" -eq 2 ] && [ -f "$W/ck_verify/manifest_00000010.txt" ]; then
    echo "PASS cli --verify-checkpoints: a line a checkpoint, exit 1 when the newest is damaged, nothing changed"
else echo "FAIL cli --verify-checkpoints: rc=$rc $out"; fi
out=$($BIN --verify-checkpoints "$W/none" 2>&1); rc=$?
if [ $rc -eq 1 ] && [ "$out" = "$W/none: no committed checkpoint (no manifest_NNNNNNNN.txt)" ]; then echo "PASS cli --verify-checkpoints of a folder without checkpoints"
else echo "FAIL cli --verify-checkpoints of a folder without checkpoints: rc=$rc $out"; fi
expect_error "resume another head count" "$W/ck_heads/model_00000010.bin: the checkpoint's heads is 2, this run's 1 (--model, --heads): --resume 1 continues the same model" \
    $SMALL --channels 128 --train-data "$W/good.bin" --resume 1 -o "$W/ck_heads"
expect_error "resume another depth" "the checkpoint's layers is 3, this run's 2" $SMALL --train-data "$W/good.bin" --resume 1 -o "$W/ck_layers"
expect_error "resume another maximum T" "the checkpoint's maximum sequence length is 128, this run's 64" $SMALL --train-data "$W/good.bin" --resume 1 -o "$W/ck_maxt"
expect_error "resume another precision" "$W/ck_precision/state_00000010_00000.bin: saved with --precision fp16, this run uses bf16" \
    $SMALL --train-data "$W/good.bin" --resume 1 -o "$W/ck_precision"
# a folder belongs to one run: a fresh run over another run's checkpoints is refused; --overwrite-output 1 moves them
# aside (the runs below stop at "no CUDA GPU found": CUDA_VISIBLE_DEVICES is empty); a second job is refused
expect_error "fresh run over another run's checkpoints" \
    "--output-dir $W/ck_other_run holds 1 checkpoint(s) of run 1234567890abcdef (the newest at step 10): continue that run with --resume 1, or start over there with --overwrite-output 1" \
    $SMALL --train-data "$W/good.bin" -o "$W/ck_other_run"
out=$(CUDA_VISIBLE_DEVICES= $BIN $SMALL --train-data "$W/good.bin" -o "$W/ck_other_run" --overwrite-output 1 2>&1)
aside=$(ls -d "$W"/ck_other_run/replaced_* 2> /dev/null | head -n 1)
if printf '%s' "$out" | grep -q "^--overwrite-output 1: moved 1 checkpoint(s) of run 1234567890abcdef" && [ -n "$aside" ] &&
    [ -f "$aside/manifest_00000010.txt" ] && [ -f "$aside/model_00000010.bin" ] && [ -z "$(ls "$W/ck_other_run" | grep -v '^replaced_')" ]; then
    echo "PASS cli --overwrite-output 1 moves another run's checkpoints aside, deleting nothing"
else
    echo "FAIL cli --overwrite-output 1: $out"
fi
expect_error "overwrite-output with resume" "--overwrite-output 1 and --resume 1 exclude each other" $SMALL --train-data "$W/good.bin" -o "$W/ck" --resume 1 --overwrite-output 1
expect_error "overwrite-output without output dir" "--overwrite-output 1 needs --output-dir" $SMALL --train-data "$W/good.bin" --overwrite-output 1
mkdir -p "$W/ck_locked"
flock "$W/ck_locked/.train_gpt.lock" sleep 20 & holder=$!
for _ in $(seq 100); do flock -n "$W/ck_locked/.train_gpt.lock" true 2> /dev/null || break; sleep 0.05; done
expect_error "a second job on one output dir" "--output-dir $W/ck_locked is in use by another train_gpt job" $SMALL --train-data "$W/good.bin" -o "$W/ck_locked"
kill $holder 2> /dev/null; wait $holder 2> /dev/null
# what a checkpoint cannot hold is refused at start: a state file records at most 109 blocks of a pipeline stage
expect_error "blocks per stage a checkpoint holds" "pipeline stage 0 holds 110 blocks, but a checkpoint's state file records at most 109 a stage" \
    --layers 110 --heads 1 --channels 64 --max-seq-len 64 --seq-len 32 --batch-size 2 --val-data= --train-data "$W/good.bin" -o "$W/ck_deep"
err=$(CUDA_VISIBLE_DEVICES= $BIN --layers 109 --heads 1 --channels 64 --max-seq-len 64 --seq-len 32 --batch-size 2 --val-data= --train-data "$W/good.bin" -o "$W/ck_deep109" 2>&1 >/dev/null)
if [ "$err" = "error: no CUDA GPU found" ]; then echo "PASS cli 109 blocks on a stage: accepted with --output-dir (up to the GPU)"
else echo "FAIL cli 109 blocks on a stage: $err"; fi
# no checkpoint: one line that says so, then the run goes on (here: up to the GPU, or through 0 steps on one)
mkdir -p "$W/ck_empty"
out=$($BIN $SMALL --train-data "$W/good.bin" --steps 0 --resume 1 -o "$W/ck_empty" 2> /dev/null)
if printf '%s\n' "$out" | grep -q -- "^--resume 1: no checkpoint in $W/ck_empty, starting from scratch (run [0-9a-f]\{16\})$"; then
    echo "PASS cli resume without a checkpoint says so in one line"
else
    echo "FAIL cli resume without a checkpoint: stdout: $out"
fi
# batch vs GPUs: 2 ranks x 2 rows x 32 tokens = 128 tokens per micro-step
export WORLD_SIZE=2 RANK=0
expect_error "total batch vs GPUs" "--total-batch-tokens 64 is not a multiple of --batch-size x --seq-len x data-parallel ranks (2) = 128" $SMALL --train-data "$W/good.bin" --total-batch-tokens 64
# tensor parallelism: the mesh and the split are checked before any GPU is touched
expect_error "tensor parallel does not divide the ranks" "--tensor-parallel 3 x --pipeline-parallel 1 = 3 does not divide the 2 ranks" $SMALL --tensor-parallel 3
expect_error "tensor parallel below 1" "--tensor-parallel must be in [1, 2147483647], got 0" $SMALL --tensor-parallel 0
expect_error "tensor parallel splits whole heads" "--tensor-parallel 2: the 3 attention heads do not split into 2 equal groups" --model d3 --tensor-parallel 2
expect_error "tensor parallel splits whole key/value heads" "--tensor-parallel 2: the 1 key/value heads do not split into 2 equal groups (a degree above the key/value heads would need them replicated, which tensor parallelism here does not do)" --model d2 --arch llama --channels 256 --heads 4 --kv-heads 1 --tensor-parallel 2
expect_error "sequence parallel splits the sequence evenly" "--sequence-parallel 1: --seq-len 33 must be a multiple of --tensor-parallel 2" $SMALL --heads 2 --channels 128 --tensor-parallel 2 --sequence-parallel 1 --seq-len 33
expect_error "tensor parallel refuses LoRA" "LoRA runs with --tensor-parallel 1 (got 2)" $SMALL --heads 2 --channels 128 --tensor-parallel 2 --lora-rank 4
expect_error "pipeline parallel does not divide the ranks" "--tensor-parallel 1 x --pipeline-parallel 4 = 4 does not divide the 2 ranks" $SMALL --pipeline-parallel 4
expect_error "pipeline needs a layer per stage" "--pipeline-parallel 2 x --virtual-stages 2: the 2 layers cannot fill 4 virtual stages" $SMALL --pipeline-parallel 2 --pipeline-schedule interleaved
expect_error "pipeline schedule name" "--pipeline-schedule must be one of 1f1b, interleaved, zb1, got 'gpipe'" $SMALL --pipeline-parallel 2 --pipeline-schedule gpipe
expect_error "zb1 runs one chunk per stage" "--virtual-stages 2 needs --pipeline-schedule interleaved (zb1 runs one model chunk per stage)" --layers 4 --heads 1 --channels 64 --max-seq-len 64 --seq-len 32 --batch-size 2 --val-data= --train-data "$W/good.bin" --pipeline-parallel 2 --pipeline-schedule zb1 --virtual-stages 2
expect_error "zb1 refuses ZeRO-2" "--pipeline-parallel 2 runs with --zero-stage 0 or 1 (got 2)" $SMALL --pipeline-parallel 2 --pipeline-schedule zb1 --zero-stage 2
expect_error "pipeline layers list" "--pipeline-layers" $SMALL --pipeline-parallel 2 --pipeline-layers 1,2
expect_error "pipeline refuses ZeRO-2" "--pipeline-parallel 2 runs with --zero-stage 0 or 1 (got 2)" $SMALL --pipeline-parallel 2 --zero-stage 2
expect_error "pipeline refuses offload" "--offload runs with --pipeline-parallel 1 (got 2)" $SMALL --pipeline-parallel 2 --offload optimizer
expect_error "delayed update with offloaded parameters" "--offload-delayed-update 1 runs with --offload optimizer (got optimizer,parameters)" $SMALL --zero-stage 3 --offload optimizer,parameters --offload-delayed-update 1
expect_error "interleaved micro-batch count" "--pipeline-schedule interleaved needs the 3 micro-batches (gradient-accumulation steps) to be a multiple of --pipeline-parallel 2" --layers 4 --heads 1 --channels 64 --max-seq-len 64 --seq-len 32 --batch-size 2 --val-data= --pipeline-parallel 2 --pipeline-schedule interleaved --total-batch-tokens 192
# --pipeline-layers balanced with a batch or micro-batch count that is refused: the refusal's own message, not one
# about the split
expect_error "balanced split, interleaved micro-batch count" "--pipeline-schedule interleaved needs the 3 micro-batches (gradient-accumulation steps) to be a multiple of --pipeline-parallel 2" --layers 4 --heads 1 --channels 64 --max-seq-len 64 --seq-len 32 --batch-size 2 --val-data= --pipeline-parallel 2 --pipeline-schedule interleaved --pipeline-layers balanced --total-batch-tokens 192
expect_error "balanced split, total batch" "--total-batch-tokens 100 is not a multiple of --batch-size x --seq-len = 64" --layers 4 --heads 1 --channels 64 --max-seq-len 64 --seq-len 32 --batch-size 2 --val-data= --pipeline-parallel 2 --pipeline-schedule interleaved --pipeline-layers balanced --total-batch-tokens 100
expect_error "pipeline micro-batch count above 4096" "--pipeline-parallel 2 runs at most 4096 micro-batches (gradient-accumulation steps) a step, not 4097: raise --batch-size or lower --total-batch-tokens" $SMALL --train-data "$W/good.bin" --pipeline-parallel 2 --pipeline-layers balanced --total-batch-tokens 262208
expect_error "balanced split, layers per stage" "--pipeline-parallel 2 x --virtual-stages 2: the 2 layers cannot fill 4 virtual stages" $SMALL --pipeline-parallel 2 --pipeline-schedule interleaved --pipeline-layers balanced
unset WORLD_SIZE RANK
exit 0
