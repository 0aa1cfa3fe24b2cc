#!/usr/bin/env bash
# Everything README.md and docs/*.md show runs, without a GPU: every command line that runs train_gpt (directly, through
# scripts/launch.sh, mpirun or srun, or through a training script that passes flags on), in a fenced block or an inline
# code span, joined over its backslash continuations, runs with --dry-run 1 appended as rank 0 of the launcher's world;
# every scripts/... and build/prepare_shards command shown runs as shown where it needs no GPU and ends in seconds. One
# line per command, naming the file and line. Then: a dry run connects to no rank, refuses a plan that does not fit,
# plans QLoRA's Llama 3 8B within 10 GiB and a 70B shape within 79 GiB (40 GiB a GPU on 2 pipeline stages),
# evaluates a validation split shorter than a batch over what it holds, and gives docs/training.md's defaults as --help
# does; on a machine with a GPU, its memory plan is the run's.
#
# The commands run from the root of a fresh folder laid out as a checkout, build/test_work/commands (links to train_gpt,
# build/prepare_shards, scripts/, data/gpt2, data/hellaswag, data/tinyshakespeare/input.txt), and write only there. What
# a user makes before a command, the test makes first:
#   - the tinyshakespeare shards: with README's own command, bash scripts/data/prepare_tinyshakespeare.sh;
#   - the Gutenberg and FineWeb shards (their recipes need ../shared/data or the Hugging Face hub): in data/gutenberg
#     the tinyshakespeare shards under its names; in data/fineweb and data/fineweb_edu shards of the tinyshakespeare
#     tokens four times over (train_gpt2.sh on 8 ranks reads 8 x 64 x 1024 + 1 tokens a step);
#   - the model files the docs name as inputs (a trained log/gutenberg/model_00000200.bin, LoRA's merged.bin, the
#     imported model.bin, the reference's init.bin and pytorch_final.bin, the placeholders FILE and MODEL.bin): an llm.c
#     model file of GPT-2's vocabulary, 2 layers, 2 heads, C = 128, all zeros (a sparse file), each under made/ (the
#     commands' NAME becomes made/NAME, so that a recipe's --output-dir is still the fresh folder its first run finds);
#   - books/*.txt.xz: tinyshakespeare's text in three files, its sections as documents (<|endoftext|> between them).
#   - conversations.jsonl: tinyshakespeare's paragraphs as conversations (a paragraph asks, the next answers).
# Placeholders: N -> 16, OUT_DIR and HF_DIR -> hf_model, HF_FOLDER -> hf_recipe (MODEL.bin exported with GPT-2's
# tokenizer.json, where numpy is at hand), DATA.jsonl -> conversations.jsonl, [--optional flags] -> the flags; --verify-checkpoints DIR needs
# a checkpoint, which only a GPU run writes (SKIP). Launchers become their environment: scripts/launch.sh [--one-gpu] N
# and mpirun -np N -> WORLD_SIZE=N (x NNODES) RANK=0 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 (unless the
# command sets them); srun --ntasks-per-node N [--nodes M] -> SLURM_PROCID=0 SLURM_NTASKS=N*M SLURM_LOCALID=0
# SLURM_JOB_ID=1.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
W=build/test_work/commands
rm -rf "$W"; mkdir -p "$W/build" "$W/data/tinyshakespeare" "$W/books"
if [ ! -x ./train_gpt ] || [ ! -x build/prepare_shards ]; then
    echo "FAIL commands setup: ./train_gpt and build/prepare_shards are needed (make all)"; exit 1
fi
ln -s "$ROOT/train_gpt" "$W/train_gpt"
ln -s "$ROOT/build/prepare_shards" "$W/build/prepare_shards"
ln -s "$ROOT/scripts" "$W/scripts"
ln -s "$ROOT/data/gpt2" "$W/data/gpt2"
ln -s "$ROOT/data/hellaswag" "$W/data/hellaswag"
ln -s "$ROOT/data/tinyshakespeare/input.txt" "$W/data/tinyshakespeare/input.txt"
# each command gets only the launcher variables it is given
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT NNODES NODE_RANK SLURM_PROCID SLURM_NTASKS SLURM_LOCALID \
      SLURM_NTASKS_PER_NODE SLURM_JOB_ID OMPI_COMM_WORLD_SIZE PMI_SIZE PMIX_RANK

if ! (cd "$W" && bash scripts/data/prepare_tinyshakespeare.sh > prepare.log 2>&1); then
    echo "FAIL commands setup: README's bash scripts/data/prepare_tinyshakespeare.sh: $(tail -n 1 "$W/prepare.log")"; exit 1
fi
mkdir -p "$W/data/gutenberg"
for split in train val; do
    ln -s "$ROOT/$W/data/tinyshakespeare/tinyshakespeare_${split}_000000.bin" "$W/data/gutenberg/gutenberg_${split}_000000.bin"
done
MADE="log/gutenberg/model_00000200.bin merged.bin model.bin init.bin pytorch_final.bin FILE MODEL.bin"
python3 - "$W" "$MADE" <<'PY'
import json, os, struct, sys
w, made = sys.argv[1], sys.argv[2].split()
for corpus in ["fineweb", "fineweb_edu"]:
    os.makedirs(f"{w}/data/{corpus}")
    for split in ["train", "val"]:
        data = open(f"{w}/data/tinyshakespeare/tinyshakespeare_{split}_000000.bin", "rb").read()
        header = list(struct.unpack("<256i", data[:1024]))
        header[2] *= 4
        open(f"{w}/data/{corpus}/fineweb_{split}_000000.bin", "wb").write(struct.pack("<256i", *header) + data[1024:] * 4)
L, H, C, T, V, Vp = 2, 2, 128, 1024, 50257, 50304
parameters = Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
for name in made:
    os.makedirs(os.path.dirname(f"{w}/made/{name}"), exist_ok=True)
    with open(f"{w}/made/{name}", "wb") as f:
        f.write(struct.pack("<256i", *([20240326, 3, T, V, L, H, C, Vp] + [0] * 248)))
        f.truncate(1024 + 4 * parameters)
sections = open("data/tinyshakespeare/input.txt", encoding="utf-8").read().split("\n\n")
for part in range(3):
    open(f"{w}/books/part{part}.txt", "w", encoding="utf-8").write("<|endoftext|>".join(sections[part::3]))
# conversations.jsonl (docs/training.md's chat data): a paragraph asks, the next answers
with open(f"{w}/conversations.jsonl", "w", encoding="utf-8") as f:
    for question, answer in zip(sections[0::2], sections[1::2]):
        f.write(json.dumps({"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}) + "\n")
PY
have_xz=0
command -v xz > /dev/null && xz "$W"/books/part*.txt && have_xz=1
have_numpy=0
python3 -c "import numpy" 2> /dev/null && have_numpy=1
# HF_FOLDER (docs/hf.md's fine-tuning recipe): MODEL.bin exported, with GPT-2's tokenizer as a tokenizer.json
if [ $have_numpy -eq 1 ] && ! (cd "$W" && python3 scripts/hf/export_hf.py made/MODEL.bin hf_recipe > hf_recipe.log 2>&1 &&
                               python3 "$ROOT/test/tools/make_tokenizer_json.py" --gpt2-dir "$ROOT/data/gpt2" --out hf_recipe/tokenizer.json >> hf_recipe.log 2>&1); then
    echo "FAIL commands setup: the HF_FOLDER stand-in: $(tail -n 1 "$W/hf_recipe.log")"; exit 1
fi

# The commands, one a line: FILE:LINE, KIND, ENV and COMMAND, separated by \x1f (KIND train_gpt: run with --dry-run 1;
# finetune: the same where numpy is at hand;
# script, numpy, xz: run as shown where that is at hand; skip: COMMAND says why), ENV the launcher's variables as
# NAME=VALUE words.
extract() {
python3 - "$MADE" README.md docs/*.md <<'PY'
import re, shlex, sys

def strip_comment(line):
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()

INLINE = re.compile(r"^([A-Z_]+=\S+ )*(\./train_gpt |scripts/launch\.sh .*\./train_gpt |scripts/train/\S+ |python3 scripts/|bash scripts/|"
                    r"build/prepare_shards )")

def commands(path):
    """(line, text) of each command line: fenced blocks' lines joined over backslashes (a commented-out command
    included, '# ' dropped), and the inline code spans of the text between them that start a command."""
    lines = open(path, encoding="utf-8").read().split("\n")
    found, fenced, prose, i = [], False, [], 0
    def spans():  # in the prose lines gathered since the last block: a span may run over a line break
        if prose:
            first, text = prose[0][0], "\n".join(line for _, line in prose)
            for m in re.finditer(r"`([^`]+)`", text):
                span = m.group(1).replace("\n", " ")
                if INLINE.match(span):
                    found.append((first + text.count("\n", 0, m.start()), span))
        prose.clear()
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            spans()
            fenced = not fenced
        elif fenced:
            start, text = i + 1, line
            commented = re.match(r"\s*#\s*(\./train_gpt\b.*)", text)
            if commented:
                text = commented.group(1)
            while text.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                following = lines[i][1:] if commented else lines[i]
                text = text.rstrip()[:-1] + " " + following.strip()
            found.append((start, strip_comment(text)))
        else:
            prose.append((i + 1, line))
        i += 1
    spans()
    return found

PLACEHOLDERS = {"N": "16", "OUT_DIR": "hf_model", "HF_DIR": "hf_model", "HF_FOLDER": "hf_recipe", "DATA.jsonl": "conversations.jsonl"}
PLACEHOLDERS.update({name: "made/" + name for name in sys.argv[1].split()})

def classify(text):
    words = shlex.split(text)
    if words and words[-1] == "&":  # started in the background
        words.pop()
    env = {}
    while words and re.match(r"^[A-Z_]+=", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    if not words:
        return None
    launcher = {}
    program = words[0]
    if program == "scripts/launch.sh":
        words.pop(0)
        if words and words[0] == "--one-gpu":
            words.pop(0)
        ranks = int(words.pop(0)) * int(env.get("NNODES", "1"))
        launcher = {"WORLD_SIZE": str(ranks), "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": env.get("MASTER_ADDR", "127.0.0.1"),
                    "MASTER_PORT": env.get("MASTER_PORT", "29500")}
    elif program == "mpirun":
        words.pop(0)
        ranks = 1
        while words and words[0].startswith("-"):
            flag = words.pop(0)
            if flag in ("-np", "-n"):
                ranks = int(words.pop(0))
        launcher = {"WORLD_SIZE": str(ranks), "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    elif program == "srun":
        words.pop(0)
        per_node, nodes = 1, 1
        while words and words[0].startswith("-"):
            flag = words.pop(0)
            value = flag.split("=", 1)[1] if "=" in flag else None
            name = flag.split("=", 1)[0]
            if value is None and name in ("--ntasks-per-node", "--nodes", "-N", "--ntasks", "-n", "--gpus-per-node", "--gpus", "-G"):
                value = words.pop(0)
            if name == "--ntasks-per-node":
                per_node = int(value)
            elif name in ("--nodes", "-N"):
                nodes = int(value)
            elif name in ("--ntasks", "-n"):
                per_node, nodes = int(value), 1
        launcher = {"SLURM_PROCID": "0", "SLURM_NTASKS": str(per_node * nodes), "SLURM_LOCALID": "0", "SLURM_JOB_ID": "1"}
    if not words:
        return None
    env.update(launcher)
    program = words[0]
    if program == "scripts/train/finetune.sh":
        kind = "finetune"  # its import and export need numpy; train_gpt's part runs as a dry run
    elif program == "./train_gpt" or program.startswith("scripts/train/"):
        kind = "train_gpt"
    elif program in ("bash", "python3") and len(words) > 1 and words[1].startswith("scripts/") or program == "build/prepare_shards":
        kind = "script"
    else:
        return None
    args = []
    for word in words:
        if word in ("--verify-checkpoints",) and kind == "train_gpt":
            return ("skip", env, "--verify-checkpoints DIR needs a checkpoint, which only a run on a GPU writes")
        word = re.sub(r"^\[|\]$", "", word)  # an optional flag: taken
        word = PLACEHOLDERS.get(word, word)
        word = re.sub(r"\$(\w+)|\$\{(\w+)\}", lambda m: env.get(m.group(1) or m.group(2), m.group(0)), word)
        args.append(word)
    line = " ".join(shlex.quote(a) for a in args)
    if kind == "script":
        script = args[1] if program in ("bash", "python3") else program
        if script == "scripts/reference/gpt2_reference.py" and "cuda" in args:
            return ("skip", env, "the PyTorch reference on the GPU (--device cuda)")
        if script == "scripts/reference/plot_losses.py":
            return ("skip", env, "plots the step logs of runs on a GPU")
        if script == "scripts/data/prepare_fineweb.py" and "--input" not in args:
            return ("skip", env, "streams FineWeb from the Hugging Face hub (hours, and the network)")
        if script.startswith("scripts/hf/"):
            kind = "numpy"
        if "*.txt.xz" in line:
            kind = "xz"
            line = line.replace("'books/*.txt.xz'", "books/*.txt.xz")
    return (kind, env, line)

for path in sys.argv[2:]:
    for number, text in commands(path):
        try:
            c = classify(text)
        except (ValueError, IndexError) as e:
            print(f"{path}:{number}\x1fbad\x1f\x1f{text}: {e}")
            continue
        if c:
            kind, env, line = c
            print(f"{path}:{number}\x1f{kind}\x1f{' '.join(f'{k}={v}' for k, v in env.items())}\x1f{line}")
PY
}

count=0
while IFS=$'\x1f' read -r where kind prefix cmd; do
    count=$((count + 1))
    case $kind in
        skip) echo "SKIP commands $where: $cmd"; continue ;;
        bad) echo "FAIL commands $where: cannot read the command: $cmd"; continue ;;
        numpy) [ $have_numpy -eq 1 ] || { echo "SKIP commands $where $cmd: no numpy"; continue; } ;;
        xz) [ $have_xz -eq 1 ] || { echo "SKIP commands $where $cmd: no xz"; continue; } ;;
        train_gpt) cmd="$cmd --dry-run 1" ;;
        finetune) [ $have_numpy -eq 1 ] || { echo "SKIP commands $where $cmd: no numpy"; continue; }; cmd="$cmd --dry-run 1" ;;
    esac
    read -ra vars <<< "$prefix"
    out=$(cd "$W" && timeout 300 env "${vars[@]}" bash -c "$cmd" 2>&1); rc=$?
    if [ $rc -eq 0 ]; then echo "PASS commands $where ${prefix:+$prefix }$cmd"
    else echo "FAIL commands $where ${prefix:+$prefix }$cmd: exit $rc: $(printf '%s\n' "$out" | tail -n 1)"; fi
done < <(extract)
if [ "$count" -ge 30 ]; then echo "PASS commands found the docs' commands ($count)"
else echo "FAIL commands found only $count commands in README.md and docs/*.md"; fi

# ---- the dry run itself ------------------------------------------------------------------------------------------
cd "$W"
SMALL=(--model d2 --batch-size 4 --seq-len 256)
# no connection: rank 1 would wait for rank 0 at MASTER_PORT, rank 0 would listen there; a listener holds the port and
# counts who comes
port=$((20000 + RANDOM % 12000))
python3 - "$port" > listener.log 2>&1 <<'PY' &
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(8)
s.settimeout(0.2)
print("listening", flush=True)
connections, end = 0, time.time() + 60
while time.time() < end:
    try:
        c, _ = s.accept()
        connections += 1
        c.close()
    except socket.timeout:
        pass
    try:
        open("listener.stop").close()
        break
    except OSError:
        pass
print("connections", connections, flush=True)
PY
listener=$!
for _ in $(seq 50); do grep -q listening listener.log 2> /dev/null && break; sleep 0.1; done
rcs=""
for rank in 1 0; do
    timeout 60 env WORLD_SIZE=2 RANK=$rank LOCAL_RANK=$rank MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        ./train_gpt "${SMALL[@]}" --dry-run 1 > "dry_rank$rank.log" 2>&1
    rcs="$rcs $?"
done
touch listener.stop; wait $listener
if [ "$rcs" = " 0 0" ] && grep -q "^connections 0$" listener.log && grep -q "NCCL id over TCP from rank 0 at 127.0.0.1:$port" dry_rank0.log; then
    echo "PASS commands a dry run on 2 ranks connects to no rank (rank 1 alone, then rank 0 with its port taken)"
else
    echo "FAIL commands a dry run on 2 ranks: exit statuses$rcs, listener: $(tail -n 1 listener.log); $(tail -n 1 dry_rank0.log)"
fi
err=$(WORLD_SIZE=2 RANK=0 ./train_gpt "${SMALL[@]}" --dry-run 1 2>&1 > /dev/null); rc=$?
if [ $rc -ne 0 ] && [ "$err" = "error: several processes without MPI need MASTER_ADDR and MASTER_PORT (TCP bootstrap) or --nccl-init-file" ]; then
    echo "PASS commands a dry run refuses 2 ranks without a bootstrap as the run does"
else echo "FAIL commands a dry run on 2 ranks without MASTER_ADDR: rc=$rc: $err"; fi

err=$(./train_gpt --model d48 --batch-size 16 --dry-run 1 --dry-run-gpu-gib 24 2>&1 > /dev/null); rc=$?
if [ $rc -ne 0 ] && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] &&
   [[ $err == "error: the plan needs "*" GiB but the GPU has 24.00 GiB free: lower --batch-size (and raise --total-batch-tokens to keep the step size)" ]]; then
    echo "PASS commands a dry run refuses a plan beyond --dry-run-gpu-gib as the run does"
else echo "FAIL commands a dry run with a plan beyond the GPU: rc=$rc: $err"; fi
# QLoRA's NF4 base (docs/lora.md): Llama 3 8B at T = 2048, B = 1, rank 16 on every linear layer plans within 10 GiB, and a
# 70B shape within one 80 GB GPU (79 GiB free), with --recompute 3; each plan's figures on the PASS line
QLORA=(--batch-size 1 --seq-len 2048 --recompute 3 --lora-rank 16 --lora-targets q,k,v,o,gate,up,down --base-quant nf4 --dry-run 1)
qlora_plan() {
    local name=$1 gib=$2 out plan; shift 2
    out=$(./train_gpt "$@" "${QLORA[@]}" --dry-run-gpu-gib "$gib" 2>&1); local rc=$?
    plan=$(printf '%s\n' "$out" | grep -m1 '^memory plan per GPU' | sed 's/^memory plan per GPU (GiB): //')
    if [ $rc -eq 0 ] && printf '%s\n' "$out" | grep -q '^base in NF4 (QLoRA, double quantization, 0.5159 bytes a weight)' && [ -n "$plan" ]; then
        echo "PASS commands QLoRA $name plans within $gib GiB: $plan; $(printf '%s\n' "$out" | grep -m1 '^base in NF4' | sed 's/.*| total/NF4 base/')"
    else echo "FAIL commands QLoRA $name within $gib GiB: rc=$rc: $(printf '%s\n' "$out" | grep -m1 'error\|^memory plan')"; fi
}
qlora_plan "llama3-8b (T 2048, B 1, r 16, every linear layer)" 10 --model llama3-8b
qlora_plan "70B shape (80 layers, C 8192, 64 heads, 8 kv heads, ffn 28672)" 79 --model llama3-8b --layers 80 --channels 8192 --heads 64 --kv-heads 8 \
    --ffn 28672
# on 2 pipeline stages each GPU holds its 40 blocks' NF4 base and their adapters: the 70B shape within 40 GiB a GPU
WORLD_SIZE=2 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 qlora_plan "70B shape on 2 pipeline stages" 40 --model llama3-8b --layers 80 \
    --channels 8192 --heads 64 --kv-heads 8 --ffn 28672 --pipeline-parallel 2 --total-batch-tokens 4096
err=$(./train_gpt "${SMALL[@]}" --dry-run-gpu-gib 40 2>&1 > /dev/null); rc=$?
if [ $rc -ne 0 ] && [ "$err" = "error: --dry-run-gpu-gib 40 runs with --dry-run 1 (got 0): a run checks its memory plan against the GPU's free memory" ]; then
    echo "PASS commands --dry-run-gpu-gib without --dry-run 1 is refused"
else echo "FAIL commands --dry-run-gpu-gib without --dry-run 1: rc=$rc: $err"; fi

# tinyshakespeare's validation split (33,803 tokens) is shorter than a batch of 4 ranks x 16 x 1024: 8 rows a rank;
# on 64 ranks not even one row of 1024 a rank: one row of 528 tokens
check_fit() {
    local ranks=$1 rows=$2 expected=$3 out
    out=$(WORLD_SIZE=$ranks RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 ./train_gpt --model d2 --batch-size "$rows" --seq-len 1024 --dry-run 1 2>&1)
    if [ $? -eq 0 ] && printf '%s\n' "$out" | grep -q "^validation every 20 steps: 1 batch(es) of $expected tokens a data-parallel rank .*evaluated over what it holds"; then
        echo "PASS commands a validation split shorter than one batch of $rows x 1024 on $ranks ranks is evaluated over $expected tokens a rank"
    else echo "FAIL commands validation shorter than one batch on $ranks ranks: $(printf '%s\n' "$out" | grep -m1 '^validation\|error')"; fi
}
check_fit 4 16 "8 x 1024"
check_fit 64 1 "1 x 528"

# docs/training.md's table of every flag: each flag's default as --help prints it
./train_gpt --help > help.txt
wrong=$(python3 - help.txt "$ROOT/docs/training.md" <<'PY'
import re, sys
shown = {}
for line in open(sys.argv[1]):
    m = re.match(r"  (--[a-z0-9-]+)(, -[a-z]+)? .*? \[(\"[^\"]*\"|[^;\]]*)(; .*)?\]$", line.rstrip("\n"))
    if m:
        shown[m.group(1)] = m.group(3)
doc = open(sys.argv[2]).read().split("\n## Every flag", 1)
rows = re.findall(r"^\| `(--[a-z0-9-]+)`[^|]*\| `([^`]*)` \|", doc[1] if len(doc) == 2 else "", re.M)
wrong = [f"{flag} ({default}; --help: {shown.get(flag)})" for flag, default in rows if shown.get(flag) != default]
print(f"{len(rows)} {' '.join(wrong)}")
PY
)
if [ "${wrong%% *}" -gt 0 ] && [ "${wrong#* }" = "" ]; then echo "PASS commands docs/training.md gives each of its ${wrong%% *} flags --help's default"
else echo "FAIL commands docs/training.md's defaults differ from --help: $wrong"; fi

# with a GPU: the dry run's memory plan is the one the run prints (and checks against the GPU's free memory), but the
# scratch and the total, which hold the reductions' scratch only where the GPU's SM count is known
plan() {
    ./train_gpt "${SMALL[@]}" --steps 0 --val-every 0 --sample-every 0 "$@" 2>&1 | grep -E '^(memory plan per GPU|host memory per rank|LoRA r=)' |
        sed -E 's/ \| scratch [0-9.]+ \| total [0-9.]+ of [0-9.]+ free$//; s/ = [0-9.]+ of [0-9.]+ \(budget.*//'
}
if [ "$(bash "$ROOT/scripts/visible_gpus.sh")" -ge 1 ]; then
    for flags in "" "--recompute 2 --offload optimizer" "--precision fp8 --fp8-scaling delayed" "--lora-rank 4 --lora-targets qkv,fc"; do
        run=$(plan $flags); dry=$(plan $flags --dry-run 1)
        if [ -n "$run" ] && [ "$run" = "$dry" ]; then echo "PASS commands the dry run's memory plan is the run's (${flags:-bf16})"
        else echo "FAIL commands the dry run's memory plan (${flags:-bf16}): run: $run; dry run: $dry"; fi
    done
else
    echo "SKIP commands the dry run's memory plan against the run's: no GPU"
fi
