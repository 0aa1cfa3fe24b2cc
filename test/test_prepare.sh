#!/usr/bin/env bash
# Shard preparation end to end, without a GPU: the FineWeb path (prepare_fineweb.py on a small local jsonl
# sample) gives the same shards as prepare_shards on the same documents; the output does not depend on the
# thread count; --out makes the folders it names; the tinyshakespeare recipe gives llm.c's split; a tokenizer.json's
# end of text (or --eot's token) starts each document.
set -u
cd "$(dirname "$0")/.."
W=build/test_work/prepare
rm -rf "$W"; mkdir -p "$W"
BIN=build/prepare_shards
python3 - "$W" <<'PY'
import json, sys
d = sys.argv[1]
docs = [f"Document {i}: caf\u00e9 \u65e5\u672c {i * 7919} words, words\n\nand lines.  " * (1 + i % 5) for i in range(40)]
with open(f"{d}/sample.jsonl", "w") as f:
    for doc in docs:
        f.write(json.dumps({"text": doc, "id": len(doc)}) + "\n")
with open(f"{d}/sample.txt", "w") as f:
    f.write("<|endoftext|>".join(docs))
PY
python3 scripts/data/prepare_fineweb.py --input "$W/sample.jsonl" --out "$W/fw/fineweb" --val-docs 5 --shard-size 2000 \
    --prepare-shards "$BIN" > "$W/fineweb.out" 2>&1 || echo "FAIL prepare fineweb sample: $(tail -n 1 "$W/fineweb.out")"
mkdir -p "$W/direct" "$W/threads"
$BIN --out "$W/direct/fineweb" --val-docs 5 --shard-size 2000 --threads 1 "$W/sample.txt" > /dev/null 2>&1
$BIN --out "$W/threads/fineweb" --val-docs 5 --shard-size 2000 --threads 2 "$W/sample.txt" > /dev/null 2>&1
n=$(ls "$W/fw" | wc -l)
if [ "$n" -ge 3 ] && diff -r "$W/fw" "$W/direct" > /dev/null; then
    echo "PASS prepare fineweb sample: $n shards, identical to prepare_shards on the same documents"
else
    echo "FAIL prepare fineweb sample: $n shards; differs from prepare_shards: $(diff -rq "$W/fw" "$W/direct" | head -n 1)"
fi
if diff -r "$W/direct" "$W/threads" > /dev/null; then echo "PASS prepare prepare_shards output independent of thread count"
else echo "FAIL prepare prepare_shards output depends on the thread count"; fi
# --out into a folder that does not exist: made with its parents; one that cannot be made is named in one line
$BIN --out "$W/new/nested/fineweb" --val-docs 5 --shard-size 2000 --threads 1 "$W/sample.txt" > "$W/nested.out" 2>&1; rc=$?
if [ $rc -eq 0 ] && diff -r "$W/new/nested" "$W/direct" > /dev/null; then echo "PASS prepare --out creates its missing folders"
else echo "FAIL prepare --out into missing folders: rc=$rc: $(tail -n 1 "$W/nested.out")"; fi
touch "$W/a_file"
err=$($BIN --out "$W/a_file/sub/fineweb" --threads 1 "$W/sample.txt" 2>&1 > /dev/null); rc=$?
if [ $rc -ne 0 ] && [ "$err" = "error: prepare_shards: output folder $W/a_file/sub cannot be created (from --out $W/a_file/sub/fineweb): $W/a_file/sub: Not a directory" ]; then
    echo "PASS prepare --out under a file is refused in one line"
else echo "FAIL prepare --out under a file: rc=$rc: $err"; fi

PREPARE_SHARDS=$BIN bash scripts/data/prepare_tinyshakespeare.sh > "$W/tiny.out" 2>&1
count() { python3 -c "import struct,sys; print(struct.unpack('<3i', open(sys.argv[1],'rb').read(12))[2])" "$1"; }
train=$(count data/tinyshakespeare/tinyshakespeare_train_000000.bin); val=$(count data/tinyshakespeare/tinyshakespeare_val_000000.bin)
if [ "$train" = 304225 ] && [ "$val" = 33803 ]; then echo "PASS prepare tinyshakespeare shards: 304225 train + 33803 val tokens"
else echo "FAIL prepare tinyshakespeare shards: train $train val $val (expected 304225 + 33803)"; fi

# ---- replacing a shard set only when a run succeeded -----------------------------------------------------------
# sums DIR BASE: name and checksum of every file the training globs BASE_{train,val}_*.bin match, plus every other
# entry of DIR (so leftovers such as *.tmp.PID or a staging folder show up as a difference).
sums() { (cd "$1" && for f in $(ls -A); do if [ -f "$f" ]; then echo "$f $(md5sum < "$f" | cut -c1-32)"; else echo "$f (folder)"; fi; done); }
python3 - "$W" <<'PY'
import sys
d = sys.argv[1]
text = open("data/tinyshakespeare/input.txt", encoding="utf-8").read()
sections = text.replace("\n\n", "\n\n<|endoftext|>")
open(f"{d}/sections.txt", "w", encoding="utf-8").write(sections)
# 13 MB, so the first 8 MiB batch is encoded and its shards written before a failure or kill later on.
open(f"{d}/big.txt", "w", encoding="utf-8").write((sections + "<|endoftext|>") * 12)
open(f"{d}/three.txt", "w", encoding="utf-8").write(text * 3)
PY

# A second run failing on a truncated .xz (after writing shards) leaves the first run's complete set untouched.
if command -v xz > /dev/null; then
    mkdir -p "$W/xz"
    xz -c "$W/big.txt" > "$W/big.txt.xz"
    # Cut off the last 64 bytes: xz decompresses nearly all of it (so shards are written) before it fails.
    head -c $(( $(stat -c %s "$W/big.txt.xz") - 64 )) "$W/big.txt.xz" > "$W/truncated.txt.xz"
    $BIN --out "$W/xz/ts" --shard-size 50000 --val-fraction 0.1 "$W/sections.txt" > "$W/xz1.out" 2>&1
    before=$(sums "$W/xz"); n=$(ls "$W/xz" | wc -l)
    # --threads 2: the batches of documents read before the first shard is written grow with the thread count
    $BIN --out "$W/xz/ts" --shard-size 2000 --val-fraction 0.1 --threads 2 "$W/truncated.txt.xz" > "$W/xz2.out" 2>&1 &
    pid=$!; staged=0
    while kill -0 $pid 2> /dev/null; do  # how many shards it staged before failing
        s=$(ls "$W/xz/.prepare_ts.$pid" 2> /dev/null | wc -l); [ "$s" -gt "$staged" ] && staged=$s; sleep 0.02
    done
    wait $pid; rc=$?
    if [ "$n" -ge 5 ] && [ "$staged" -gt 0 ] && [ $rc = 1 ] && grep -q "Unexpected end of input" "$W/xz2.out" &&
       [ "$(sums "$W/xz")" = "$before" ]; then
        echo "PASS prepare truncated .xz: failed (exit 1) after staging $staged files; the earlier $n shards unchanged (checksums), no staging or temporary files left"
    else
        echo "FAIL prepare truncated .xz: exit $rc after staging $staged files, $n shards before; $(tail -n 1 "$W/xz2.out"); changes: $(diff <(echo "$before") <(sums "$W/xz") | tr '\n' ' ')"
    fi
else
    echo "SKIP prepare truncated .xz: no xz tool (apt-get install -y xz-utils)"
fi

# A run killed (SIGKILL) mid-way leaves the earlier set intact and nothing the training glob matches; the next run
# removes its staging folder. Its input comes through a FIFO held open, so it cannot finish before the kill.
mkdir -p "$W/kill"
$BIN --out "$W/kill/k" --shard-size 100000 --val-docs 10 "$W/sections.txt" > /dev/null 2>&1
before=$(sums "$W/kill")
globbed() { ls "$W"/kill/k_train_*.bin "$W"/kill/k_val_*.bin 2> /dev/null | tr '\n' ' '; }
globbed_before=$(globbed)
kill_run() {  # kill_run SIGNAL: starts a run, waits for its first staged shard, sends SIGNAL; sets pid, staged, rc
    rm -f "$W/fifo"; mkfifo "$W/fifo"
    $BIN --out "$W/kill/k" --shard-size 2000 --val-docs 10 --threads 2 - < "$W/fifo" > "$W/kill.out" 2>&1 &
    pid=$!
    exec 3> "$W/fifo"
    cat "$W/big.txt" >&3
    staged=0
    for _ in $(seq 300); do
        [ -f "$W/kill/.prepare_k.$pid/k_train_000000.bin" ] && { staged=$(ls "$W/kill/.prepare_k.$pid" | wc -l); break; }
        sleep 0.1
    done
    kill -"$1" "$pid"
    exec 3>&-  # the end of input comes after the signal, as from prepare_fineweb.py
    { wait "$pid"; } 2> /dev/null; rc=$?  # (no "Killed" job notice)
}
kill_run KILL
if [ "$staged" -gt 0 ] && [ "$(globbed)" = "$globbed_before" ] && [ -d "$W/kill/.prepare_k.$pid" ] &&
   [ "$(sums "$W/kill" | grep -v '^\.prepare_k\.')" = "$before" ] && ! ls -A "$W/kill" | grep -q tmp; then
    echo "PASS prepare SIGKILL mid-way: killed with $staged files staged; the earlier set unchanged (checksums), the glob matches only it, no *.tmp* files"
else
    echo "FAIL prepare SIGKILL mid-way: staged $staged, rc $rc; glob before: $globbed_before; after: $(globbed); folder: $(ls -A "$W/kill" | tr '\n' ' ')"
fi
$BIN --out "$W/kill/k" --shard-size 100000 --val-docs 10 "$W/sections.txt" > "$W/kill2.out" 2>&1
if grep -q "removed the staging folder $W/kill/.prepare_k.$pid of a run (pid $pid) that did not finish" "$W/kill2.out" &&
   [ "$(sums "$W/kill")" = "$before" ]; then
    echo "PASS prepare after a kill: the next run removed the stale staging folder .prepare_k.$pid, the set is complete"
else
    echo "FAIL prepare after a kill: $(head -n 1 "$W/kill2.out"); folder: $(ls -A "$W/kill" | tr '\n' ' ')"
fi
# SIGTERM (and SIGINT, Ctrl-C) stop after the current batch and remove the staging folder themselves.
kill_run TERM
if [ "$staged" -gt 0 ] && [ "$rc" = 143 ] && [ "$(sums "$W/kill")" = "$before" ] && grep -q "stopped by signal 15" "$W/kill.out"; then
    echo "PASS prepare SIGTERM mid-way: exit 143, staging folder removed, the earlier set unchanged"
else
    echo "FAIL prepare SIGTERM mid-way: staged $staged, rc $rc, $(tail -n 1 "$W/kill.out"); folder: $(ls -A "$W/kill" | tr '\n' ' ')"
fi

# A kill during the replacement itself (simulated: a dead run's marker, its staging folder, 3 of its 8 shards
# already renamed into place) is completed by the next run, before anything else (here a run that then fails).
mkdir -p "$W/roll/new"
$BIN --out "$W/roll/k" --shard-size 100000 --val-docs 10 "$W/sections.txt" > /dev/null 2>&1
$BIN --out "$W/roll/new/k" --shard-size 50000 --val-docs 10 "$W/sections.txt" > /dev/null 2>&1
expected=$(sums "$W/roll/new")
sh -c 'exit 0' & dead=$!; wait $dead
mkdir "$W/roll/.prepare_k.$dead" && mv "$W"/roll/new/k_* "$W/roll/.prepare_k.$dead/" && rmdir "$W/roll/new"
for i in 0 1 2; do mv "$W/roll/.prepare_k.$dead/k_train_00000$i.bin" "$W/roll/"; done
printf '# test\nstaging .prepare_k.%s\ntrain 7\nval 1\n' "$dead" > "$W/roll/k.replacing"
$BIN --out "$W/roll/k" --val-docs 100000 "$W/sections.txt" > "$W/roll.out" 2>&1; rc=$?
if [ $rc = 1 ] && grep -q "completing the replacement of $W/roll/k_{train,val}_\*.bin that process $dead began" "$W/roll.out" &&
   [ "$(sums "$W/roll")" = "$expected" ]; then
    echo "PASS prepare interrupted replacement: the next run completed it (marker and staging folder gone, the set is the new one)"
else
    echo "FAIL prepare interrupted replacement: rc $rc, $(head -n 1 "$W/roll.out"); $(diff <(echo "$expected") <(sums "$W/roll") | tr '\n' ' ')"
fi
# A staging folder of a live process: another run is writing this prefix.
mkdir "$W/roll/.prepare_k.$$"
$BIN --out "$W/roll/k" "$W/sections.txt" > "$W/live.out" 2>&1; rc=$?
rmdir "$W/roll/.prepare_k.$$"
if [ $rc = 1 ] && [ "$(wc -l < "$W/live.out")" = 1 ] && grep -q "another prepare_shards (pid $$) is writing shards for $W/roll/k" "$W/live.out" &&
   [ "$(sums "$W/roll")" = "$expected" ]; then
    echo "PASS prepare refuses a prefix another live run is writing"
else
    echo "FAIL prepare live staging folder: rc $rc, $(cat "$W/live.out")"
fi

# Unwritable output folder: a one-line error naming it, before tokenizing. root ignores chmod 555, so as root the
# run is made as user nobody through setpriv (SKIP when that is impossible).
mkdir -p "$W/ro"; chmod 555 "$W/ro"
as_user=()
if [ "$(id -u)" = 0 ]; then
    if command -v setpriv > /dev/null && setpriv --reuid=65534 --regid=65534 --clear-groups true 2> /dev/null &&
       ! setpriv --reuid=65534 --regid=65534 --clear-groups touch "$W/ro/probe" 2> /dev/null; then
        as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups)
    else
        as_user=(skip)
    fi
fi
if [ "${as_user[0]:-}" = skip ]; then
    echo "SKIP prepare unwritable folder: running as root (chmod 555 has no effect) and cannot run as nobody"
else
    "${as_user[@]}" $BIN --out "$W/ro/x" "$W/big.txt" > "$W/ro.out" 2>&1; rc=$?
    if [ $rc = 1 ] && [ "$(wc -l < "$W/ro.out")" = 1 ] && grep -q "^error: prepare_shards: output folder $W/ro is not writable (from --out $W/ro/x)" "$W/ro.out" &&
       [ -z "$(ls -A "$W/ro")" ]; then
        echo "PASS prepare unwritable folder${as_user:+ (as nobody)}: one line, before tokenizing: $(cat "$W/ro.out")"
    else
        echo "FAIL prepare unwritable folder: rc $rc, $(cat "$W/ro.out" | tr '\n' ' ')"
    fi
fi
chmod 755 "$W/ro"

# Empty splits are errors naming the split and the input, and replace nothing.
mkdir -p "$W/empty"
$BIN --out "$W/empty/e" --val-docs 5 "$W/sample.txt" > /dev/null 2>&1
before=$(sums "$W/empty")
$BIN --out "$W/empty/e" --val-fraction 0.01 "$W/sample.txt" > "$W/empty1.out" 2>&1; rc1=$?
$BIN --out "$W/empty/e" --val-docs 40 "$W/sample.txt" > "$W/empty2.out" 2>&1; rc2=$?
if [ $rc1 = 1 ] && grep -q "^error: prepare_shards: the validation split is empty: --val-fraction 0.01 chooses none of the 40 documents of the INPUTs ($W/sample.txt)" "$W/empty1.out" &&
   [ $rc2 = 1 ] && grep -q "^error: prepare_shards: the train split is empty: --val-docs 40 takes all 40 documents of the INPUTs ($W/sample.txt)" "$W/empty2.out" &&
   [ "$(sums "$W/empty")" = "$before" ]; then
    echo "PASS prepare empty splits: empty validation and empty train splits exit 1 and replace nothing"
else
    echo "FAIL prepare empty splits: rc $rc1 $rc2: $(tail -n 1 "$W/empty1.out") / $(tail -n 1 "$W/empty2.out")"
fi
before=$(sums "$W/fw")
python3 scripts/data/prepare_fineweb.py --input "$W/sample.jsonl" --out "$W/fw/fineweb" --val-docs 100 --shard-size 2000 \
    --prepare-shards "$BIN" > "$W/fwempty.out" 2>&1; rc=$?
if [ $rc != 0 ] && grep -q "the train split is empty: --val-docs 100 takes all 40 documents of the INPUTs (stdin)" "$W/fwempty.out" &&
   grep -q "^prepare_fineweb.py: prepare_shards failed with exit status 1" "$W/fwempty.out" && [ "$(sums "$W/fw")" = "$before" ]; then
    echo "PASS prepare prepare_fineweb empty train split: exit $rc, the earlier set unchanged"
else
    echo "FAIL prepare prepare_fineweb empty train split: exit $rc: $(tr '\n' ' ' < "$W/fwempty.out")"
fi
# A bad record after some documents: prepare_fineweb stops prepare_shards before its input ends (else it would
# take the partial input for the corpus and replace the set).
{ head -n 30 "$W/sample.jsonl"; echo '{"id": 1}'; } > "$W/bad.jsonl"
python3 scripts/data/prepare_fineweb.py --input "$W/bad.jsonl" --out "$W/fw/fineweb" --val-docs 5 --shard-size 2000 \
    --prepare-shards "$BIN" > "$W/fwbad.out" 2>&1; rc=$?
if [ $rc != 0 ] && grep -q 'bad.jsonl:31: no "text" string' "$W/fwbad.out" && [ "$(sums "$W/fw")" = "$before" ]; then
    echo "PASS prepare prepare_fineweb bad record: exit $rc, prepare_shards stopped, the earlier set unchanged"
else
    echo "FAIL prepare prepare_fineweb bad record: exit $rc: $(tr '\n' ' ' < "$W/fwbad.out"); folder: $(ls -A "$W/fw" | tr '\n' ' ')"
fi

# Long documents are encoded in parts cut where the tokens do not change: three tinyshakespeares as one document
# count 3 x 338,025 tokens (tiktoken's count of one), as --count and as one --doc-per-file document.
mkdir -p "$W/long"
count3=$($BIN --count "$W/three.txt" 2> /dev/null | cut -f1)
$BIN --out "$W/long/t" --doc-per-file "$W/three.txt" > /dev/null 2>&1
long=$(count "$W/long/t_train_000000.bin")
if [ "$count3" = 1014075 ] && [ "$long" = 1014076 ]; then echo "PASS prepare long document in parts: 1014075 tokens (+ EOT), as whole"
else echo "FAIL prepare long document in parts: --count $count3, shard $long (expected 1014075 and 1014076)"; fi

# Parts lose and repeat nothing: long runs of each kind (cut into 64-byte chunks), separators right at the 1 MiB
# part limit, multi-byte characters and invalid bytes; the shards decode back to the documents.
python3 - "$W" <<'PY'
import random, sys
r = random.Random(5)
text = open("data/tinyshakespeare/input.txt", "rb").read()
open(sys.argv[1] + "/runs.txt", "wb").write(b"".join([
    b"a" * (1 << 20), b"<|endoftext|>", b"b" * ((1 << 20) - 5), b"<|endoftext|>", b" " * 1500000, b"word",
    b"\n" * 1100000, "\u00e9".encode() * 600000, b"<|endoftext|>", bytes(r.choice(b"abcdefghij") for _ in range(1200000)),
    b"'s", b"\xff" * 10, "\u65e5\u672c".encode() * 300000, b"<|endoftext|>", b"'" * 1100000, b"1" * 1100000,
    b"<|endoftext|><|endoftext|>", text, text]))
PY
$BIN --out "$W/long/runs" --shard-size 1000000 "$W/runs.txt" > "$W/runs.out" 2>&1
roundtrip=$(python3 - "$W" <<'PY'
import glob, json, struct, sys
d = sys.argv[1]
printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
byte_of = {chr(b): b for b in printable}
byte_of.update({chr(256 + k): b for k, b in enumerate(b for b in range(256) if b not in printable)})
token = {i: t.encode() if t == "<|endoftext|>" else bytes(byte_of[c] for c in t)
         for t, i in json.load(open("data/gpt2/encoder.json", encoding="utf-8")).items()}
out = []
for path in sorted(glob.glob(d + "/long/runs_train_*.bin")):
    data = open(path, "rb").read()
    n = struct.unpack("<3i", data[:12])[2]
    out += [token[t] for t in struct.unpack(f"<{n}H", data[1024:1024 + 2 * n])]
docs = [doc for doc in open(d + "/runs.txt", "rb").read().split(b"<|endoftext|>") if doc]
print("ok" if b"".join(out) == b"".join(b"<|endoftext|>" + doc for doc in docs) else f"differs ({len(docs)} documents)")
PY
)
if [ "$roundtrip" = ok ]; then echo "PASS prepare long runs in parts: the shards decode to exactly the documents ($(tail -n 1 "$W/runs.out" | cut -d: -f1))"
else echo "FAIL prepare long runs in parts: $roundtrip; $(tail -n 1 "$W/runs.out")"; fi

# Memory stays bounded on a long run without spaces (100 MB of 'a' took 2.5 GB: one 100 MB pre-token piece).
head -c 100000000 /dev/zero | tr '\0' a > "$W/a.txt"
if [ -x /usr/bin/time ]; then
    peak=$(/usr/bin/time -f "%M" $BIN --out "$W/long/a" "$W/a.txt" 2>&1 > /dev/null | tail -n 1)
else  # the largest child's peak RSS in KB, from getrusage
    peak=$(python3 -c 'import resource, subprocess, sys
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)' $BIN --out "$W/long/a" "$W/a.txt")
fi
tokens=$(count "$W/long/a_train_000000.bin")
rm -f "$W/a.txt" "$W"/long/a_*
if [ -n "$peak" ] && [ "$peak" -lt 300000 ] && [ "$tokens" = 25000001 ]; then
    echo "PASS prepare 100 MB without spaces: peak RSS $((peak / 1024)) MB (< 300 MB), $tokens tokens"
else
    echo "FAIL prepare 100 MB without spaces: peak RSS ${peak:-?} KB (bound 300000), $tokens tokens"
fi

# A vocabulary of more than 65,536 tokens gives uint32 shards (llm.c's Llama 3 format: magic 20240801, version 7):
# GPT-2's tokenizer with 70,000 tokens, " the" moved from id 262 to 69,999 (fillers in its place and from 50,257
# on), writes the GPT-2 shards' tokens with each 262 as 69,999.
python3 - "$W" <<'PY'
import json, os, sys
d = sys.argv[1] + "/wide_tokenizer"
os.makedirs(d, exist_ok=True)
encoder = json.load(open("data/gpt2/encoder.json", encoding="utf-8"))
assert encoder.pop("\u0120the") == 262 and len(encoder) == 50256
encoder.update({f"<filler_{i}>": i for i in [262] + list(range(50257, 69999))})
encoder["\u0120the"] = 69999
json.dump(encoder, open(d + "/encoder.json", "w", encoding="utf-8"), ensure_ascii=False)
PY
cp data/gpt2/vocab.bpe "$W/wide_tokenizer/"
mkdir -p "$W/width/narrow" "$W/width/wide"
$BIN --out "$W/width/narrow/t" --val-docs 10 --shard-size 200000 "$W/sections.txt" > "$W/narrow.out" 2>&1
$BIN --out "$W/width/wide/t" --val-docs 10 --shard-size 200000 --tokenizer "$W/wide_tokenizer" "$W/sections.txt" > "$W/wide.out" 2>&1
width=$(python3 - "$W/width" 2>&1 <<'PY'
import os, struct, sys
d = sys.argv[1]
def shard(path):
    data = open(path, "rb").read()
    magic, version, n = struct.unpack("<3i", data[:12])
    width = {(20240520, 1): 2, (20240801, 7): 4}.get((magic, version))
    if width is None or len(data) != 1024 + width * n:
        sys.exit(f"{path}: magic {magic} version {version}, {n} tokens in {len(data)} bytes")
    return width, list(struct.unpack(f"<{n}{'H' if width == 2 else 'I'}", data[1024:]))
names = sorted(os.listdir(d + "/narrow"))
if names != sorted(os.listdir(d + "/wide")) or len(names) < 3:
    sys.exit(f"shards {names} and {sorted(os.listdir(d + '/wide'))}")
moved = 0
for name in names:
    (narrow_width, narrow), (wide_width, wide) = shard(f"{d}/narrow/{name}"), shard(f"{d}/wide/{name}")
    if (narrow_width, wide_width) != (2, 4) or wide != [69999 if t == 262 else t for t in narrow]:
        sys.exit(f"{name}: token widths {narrow_width} and {wide_width}, or other tokens")
    moved += wide.count(69999)
print(f"ok {len(names)} {moved}")
PY
)
if [ "${width%% *}" = ok ] && [ "${width##* }" -gt 1000 ] && grep -q "(uint32 tokens)$" "$W/wide.out"; then
    echo "PASS prepare vocabulary past 65,536: uint32 shards (magic 20240801, version 7), the uint16 shards' tokens with ${width##* } ids of 69,999 ($(echo "$width" | cut -d' ' -f2) shards)"
else
    echo "FAIL prepare vocabulary past 65,536: ${width:-no result}; $(tail -n 1 "$W/wide.out")"
fi

# A Hugging Face tokenizer.json (Llama 3's pattern and special tokens, test/fixtures/tokenizer_json): each document
# starts with its end of text (<|end_of_text|>), or with --eot's token; a tokenizer that names none is refused
# without --eot, and an --eot that is not an added token is refused, each in one line
LLAMA3=test/fixtures/tokenizer_json/llama3.json
first_tokens() { python3 -c "import struct, sys; d = open(sys.argv[1], 'rb').read(); print(*struct.unpack('<4H', d[1024:1032]))" "$1"; }
$BIN --out "$W/json/a" --val-docs 2 --tokenizer "$LLAMA3" "$W/sections.txt" > "$W/json_a.out" 2>&1
$BIN --out "$W/json/b" --val-docs 2 --tokenizer "$LLAMA3" --eot '<|eot_id|>' "$W/sections.txt" > "$W/json_b.out" 2>&1
ids=$(python3 -c "import json, sys; t = {a['content']: a['id'] for a in json.load(open(sys.argv[1]))['added_tokens']}; print(t['<|end_of_text|>'], t['<|eot_id|>'])" "$LLAMA3")
a=$(first_tokens "$W/json/a_train_000000.bin" 2>&1 | cut -d' ' -f1); b=$(first_tokens "$W/json/b_train_000000.bin" 2>&1 | cut -d' ' -f1)
if [ "$a $b" = "$ids" ]; then echo "PASS prepare --tokenizer tokenizer.json: documents start with its <|end_of_text|> ($a), or --eot's <|eot_id|> ($b)"
else echo "FAIL prepare --tokenizer tokenizer.json: first tokens '$a' and '$b', expected '$ids' ($(tail -q -n 1 "$W/json_a.out" "$W/json_b.out" | tr '\n' ' '))"; fi
python3 - "$LLAMA3" "$W/no_end.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
t["added_tokens"] = [a for a in t["added_tokens"] if a["content"] == "<|begin_of_text|>"]
t["post_processor"] = None
json.dump(t, open(sys.argv[2], "w"))
PY
for case in "no end token;$W/no_end.json;;names no end-of-text token" "unknown --eot;$LLAMA3;<|nope|>;--eot <|nope|>: not an added token"; do
    IFS=';' read -r name tok eot want <<< "$case"
    err=$($BIN --out "$W/json/bad" --tokenizer "$tok" ${eot:+--eot "$eot"} "$W/sections.txt" 2>&1 > /dev/null); rc=$?
    if [ $rc -eq 1 ] && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] && [[ $err == *"$want"* ]] && [ -z "$(ls "$W/json" | grep bad)" ]; then
        echo "PASS prepare $name refused in one line: $err"
    else echo "FAIL prepare $name: exit $rc, '$err'"; fi
done
