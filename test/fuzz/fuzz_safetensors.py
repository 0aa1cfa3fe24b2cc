#!/usr/bin/env python3
"""Fuzzes the Hugging Face import (scripts/hf/import_hf.py: config.json and the safetensors reader, export_hf.py's
read_safetensors) with random mutations of valid inputs: a small GPT-2 folder built here (F32, F16 and BF16) and the
safetensors files of test/fuzz/corpus/safetensors/. Mutations hit the bytes of the header, its length, its JSON
(values of other types, sizes and signs, deep nesting, keys removed or added) and config.json's values.

    python3 test/fuzz/fuzz_safetensors.py [--seconds S] [--seed N] [INPUT...]

Every input goes through import_hf.main() in this process: it must return 0, or 1 with one line on stderr,
"import_hf.py: error: ...". Anything else (an exception, more lines, more than 10 s) is a crash: the input is saved
in build/fuzz/crashes/safetensors/ and the result line names it. The regression inputs
(test/fuzz/regressions/safetensors/: a .safetensors file, or a .json file read as config.json) are replayed first;
INPUTs given replay those instead of fuzzing. Prints one line, "PASS fuzz safetensors: N runs in S s, no crash",
"FAIL fuzz safetensors: ..." or "SKIP fuzz safetensors: ..." (numpy missing). Seeded (--seed, else the time,
printed on failure), so a run can be repeated.
"""
import argparse
import contextlib
import hashlib
import importlib.util
import io
import json
import os
import random
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
CORPUS = os.path.join(ROOT, "test", "fuzz", "corpus", "safetensors")
REGRESSIONS = os.path.join(ROOT, "test", "fuzz", "regressions", "safetensors")
CRASHES = os.path.join(ROOT, "build", "fuzz", "crashes", "safetensors")
CONFIG = {"model_type": "gpt2", "vocab_size": 3, "n_positions": 2, "n_embd": 64, "n_layer": 1, "n_head": 1}
TIMEOUT_S = 10

# values a mutation puts where the file has a number, a string, a list or an object
ODD_VALUES = [None, True, False, 0, 1, -1, 7, 2 ** 31, 2 ** 32 + 3, 2 ** 62, 2 ** 63, 2 ** 64 + 5, -2 ** 70, 10 ** 400, 1.5, -0.0,
              1e308, float("inf"), float("nan"), "", "F32", "F16", "BF16", "F64", "I64", "U8", "x" * 300, "\n", [], [0], [1, 2],
              [-1], [2 ** 62, 4], [0, 0], [3, -8], [[1]], {}, {"dtype": "F32"}, {"a": [1]}]


class Crash(Exception):
    """import_hf did not end with its one-line error or success."""


def small_gpt2(np, export_hf, dtype):
    """A valid model.safetensors (GPT-2 of CONFIG's shape) in `dtype`, as bytes."""
    C, V, T = CONFIG["n_embd"], CONFIG["vocab_size"], CONFIG["n_positions"]
    rng = np.random.default_rng(0)
    shapes = {"wte.weight": (V, C), "wpe.weight": (T, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    block = {"ln_1.weight": (C,), "ln_1.bias": (C,), "attn.c_attn.weight": (C, 3 * C), "attn.c_attn.bias": (3 * C,),
             "attn.c_proj.weight": (C, C), "attn.c_proj.bias": (C,), "ln_2.weight": (C,), "ln_2.bias": (C,),
             "mlp.c_fc.weight": (C, 4 * C), "mlp.c_fc.bias": (4 * C,), "mlp.c_proj.weight": (4 * C, C), "mlp.c_proj.bias": (C,)}
    shapes.update({f"h.0.{k}": s for k, s in block.items()})
    named = []
    for name, shape in shapes.items():
        a = rng.standard_normal(shape).astype(np.float32)
        named.append((f"transformer.{name}", export_hf.bf16_bits(a) if dtype == "BF16" else a))
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.safetensors")
        export_hf.write_safetensors(path, named, dtype, metadata={"format": "pt"})
        with open(path, "rb") as f:
            return f.read()


def split(data):
    """-> (header length as stored, header bytes, the rest), or None when the file is too short to hold them."""
    if len(data) < 8:
        return None
    n = struct.unpack("<Q", data[:8])[0]
    return (n, data[8:8 + n], data[8 + n:]) if n <= len(data) - 8 else None


def mutate_json(rng, value, depth=0):
    """A copy of a JSON value with one node replaced, removed or added."""
    if isinstance(value, dict) and value and rng.random() < 0.8:
        key = rng.choice(list(value))
        out = dict(value)
        r = rng.random()
        if r < 0.15:
            del out[key]
        elif r < 0.25:
            out[key + rng.choice(["", "x", ".weight"])] = rng.choice(ODD_VALUES)
        else:
            out[key] = mutate_json(rng, value[key], depth + 1)
        return out
    if isinstance(value, list) and value and rng.random() < 0.8:
        i = rng.randrange(len(value))
        out = list(value)
        r = rng.random()
        if r < 0.15:
            del out[i]
        elif r < 0.25:
            out.insert(i, rng.choice(ODD_VALUES))
        else:
            out[i] = mutate_json(rng, value[i], depth + 1)
        return out
    if isinstance(value, int) and not isinstance(value, bool) and rng.random() < 0.5:
        return rng.choice([value + 1, value - 1, -value, value * 2, value + 2 ** 63, value // 2])
    return rng.choice(ODD_VALUES)


def mutate_safetensors(rng, data):
    parts = split(data)
    r = rng.random()
    if parts is not None and r < 0.45:  # the header's JSON
        n, head, rest = parts
        try:
            header = json.loads(head)
        except (ValueError, RecursionError):  # an earlier mutation's
            header = {}
        if rng.random() < 0.05:
            text = ("[" * rng.choice([100, 5000, 100000]) + "]" * rng.choice([0, 1])).encode()
        else:
            text = json.dumps(mutate_json(rng, header)).encode()
        length = len(text) if rng.random() < 0.9 else rng.choice([0, len(text) - 1, len(text) + 1, 2 ** 63, 2 ** 64 - 1])
        return struct.pack("<Q", length) + text + rest
    if r < 0.55:  # the length
        n = struct.unpack("<Q", data[:8].ljust(8, b"\0"))[0]
        length = rng.choice([0, 1, n - 1, n + 1, n + 8, len(data), 2 ** 63, 2 ** 64 - 1, rng.randrange(2 ** 64)]) % 2 ** 64
        return struct.pack("<Q", length) + data[8:]
    if r < 0.65:  # cut or extend
        return data[:rng.randrange(len(data) + 1)] if rng.random() < 0.7 else data + bytes(rng.randrange(1, 64))
    out = bytearray(data)  # bytes of the header (mostly) or anywhere
    end = min(len(out), 8 + (parts[0] if parts else 64)) if rng.random() < 0.9 else len(out)
    for _ in range(rng.randrange(1, 5)):
        if end == 0:
            break
        i = rng.randrange(end)
        choice = rng.random()
        if choice < 0.5:
            out[i] ^= 1 << rng.randrange(8)
        elif choice < 0.8:
            out[i] = rng.choice([0, 0xFF, 0x80, ord('"'), ord("\\"), ord("{"), ord("]"), ord("-"), ord("9"), rng.randrange(256)])
        else:
            out[i:i] = bytes([rng.randrange(256)])
    return bytes(out)


def run_import(import_hf, folder, out):
    """import_hf.main() on `folder`; raises Crash unless it ends as a success or with its one-line error."""
    stderr = io.StringIO()

    def timeout(signum, frame):
        raise TimeoutError(f"import_hf.main took more than {TIMEOUT_S} s")

    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(TIMEOUT_S)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
            rc = import_hf.main([folder, out])
    except BaseException as e:  # noqa: B902: any exception is the finding (SystemExit included)
        lines = traceback.format_exception_only(type(e), e)
        raise Crash(f"{type(e).__name__} from import_hf.main: {lines[-1].strip()[:300]}") from e
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    lines = stderr.getvalue().splitlines()
    if rc == 0 and not lines:
        return
    if rc == 1 and len(lines) == 1 and lines[0].startswith("import_hf.py: error: "):
        return
    raise Crash(f"import_hf.main returned {rc} with {len(lines)} stderr lines: {stderr.getvalue()[:300]!r}")


def main(argv):
    parser = argparse.ArgumentParser(description="Fuzzes import_hf.py's safetensors reader and config.json with random mutations.")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to fuzz (default 60)")
    parser.add_argument("--seed", type=int, default=None, help="the random seed (default: the time)")
    parser.add_argument("inputs", nargs="*", help="replay these inputs instead (.safetensors files, or .json as config.json)")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("numpy") is None:
        print("SKIP fuzz safetensors: numpy is not installed (import_hf.py needs it)")
        return 0
    import numpy as np
    sys.path.insert(0, os.path.join(ROOT, "scripts", "hf"))
    import export_hf
    import import_hf

    seed = args.seed if args.seed is not None else time.time_ns() % 2 ** 32
    rng = random.Random(seed)
    bases = [small_gpt2(np, export_hf, dtype) for dtype in ("F32", "F16", "BF16")]
    if os.path.isdir(CORPUS):
        for name in sorted(os.listdir(CORPUS)):
            with open(os.path.join(CORPUS, name), "rb") as f:
                bases.append(f.read())
    config_text = json.dumps(CONFIG)

    work = tempfile.mkdtemp(prefix="train_gpt_fuzz_safetensors_")
    folder, out = os.path.join(work, "hf"), os.path.join(work, "model.bin")
    os.makedirs(folder)

    last = {}  # the input of the latest attempt: the file that differs from the valid folder's

    def attempt(safetensors, config):
        config = config.encode() if isinstance(config, str) else config
        last["input"] = (".json", config) if config != config_text.encode() else (".safetensors", safetensors)
        with open(os.path.join(folder, "model.safetensors"), "wb") as f:
            f.write(safetensors)
        with open(os.path.join(folder, "config.json"), "wb") as f:
            f.write(config)
        run_import(import_hf, folder, out)

    def replay(path):
        with open(path, "rb") as f:
            data = f.read()
        if path.endswith(".json"):
            attempt(bases[0], data)
        else:
            attempt(data, config_text)

    runs, start, regressions = 0, time.monotonic(), []
    try:
        try:
            if args.inputs:
                for path in args.inputs:
                    replay(path)
                    runs += 1
                print(f"PASS fuzz safetensors: {runs} inputs replayed, no crash")
                return 0
            if os.path.isdir(REGRESSIONS):
                regressions = sorted(os.listdir(REGRESSIONS))
            for name in regressions:
                replay(os.path.join(REGRESSIONS, name))
            while time.monotonic() - start < args.seconds:
                safetensors, config = rng.choice(bases), config_text
                if rng.random() < 0.15:
                    config = json.dumps(mutate_json(rng, CONFIG)) if rng.random() < 0.9 else "[" * 100000
                else:
                    for _ in range(rng.choice([1, 1, 1, 2, 3])):
                        safetensors = mutate_safetensors(rng, safetensors)
                attempt(safetensors, config)
                runs += 1
        except Crash as e:
            os.makedirs(CRASHES, exist_ok=True)
            suffix, data = last["input"]
            artifact = os.path.join(CRASHES, "crash-" + hashlib.sha1(data).hexdigest() + suffix)
            with open(artifact, "wb") as f:
                f.write(data)
            artifact = os.path.relpath(artifact, os.getcwd())
            print(f"FAIL fuzz safetensors: {e} (seed {seed}, after {runs} runs); reproducer {artifact} "
                  f"(replay: python3 test/fuzz/fuzz_safetensors.py {artifact})")
            return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"PASS fuzz safetensors: {runs} runs in {args.seconds:g} s, no crash ({len(regressions)} regression inputs replayed)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
