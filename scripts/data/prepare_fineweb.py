#!/usr/bin/env python3
"""Tokenize FineWeb (or any corpus of {"text": ...} records) into llm.c shards with prepare_shards.

Documents come from local files given with --input (.jsonl, .jsonl.gz, .jsonl.xz, .parquet; each record's
"text" field), or, without --input, are streamed from the Hugging Face hub with the `datasets` package
(needs internet; default HuggingFaceFW/fineweb, config sample-10BT). They are streamed into
`prepare_shards ... -` on stdin, joined by the literal separator <|endoftext|>, so nothing is staged on
disk and the sharding (EOT before each document, parallel encoding, shard naming) is prepare_shards'.
The first --val-docs documents form the validation split, like llm.c's fineweb.py, whose first shard is
validation. An empty train or validation split (e.g. --val-docs at least the number of documents) is an
error, and a failed run (of prepare_shards, or reading the documents) exits non-zero and leaves the
earlier shards under --out as they were: prepare_shards replaces a shard set only when it succeeded.

One difference from llm.c: a document that itself contains the text <|endoftext|> is split there (the
separator cannot be escaped), where llm.c would encode it as ordinary text. The script counts such
documents and reports them; in FineWeb they are very rare.

Examples:
  python3 scripts/data/prepare_fineweb.py                                   # sample-10BT from the hub
  python3 scripts/data/prepare_fineweb.py --input shard1.parquet shard2.parquet --out data/fineweb/fineweb
  python3 scripts/data/prepare_fineweb.py --input docs.jsonl --val-docs 10 --max-docs 1000
"""
import argparse
import gzip
import json
import lzma
import os
import subprocess
import sys

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SEPARATOR = "<|endoftext|>"


def require(module, use, pip):
    """Exits with one line when `module`, needed for `use`, cannot be imported (checked before anything starts)."""
    try:
        __import__(module)
    except ImportError as e:
        why = "" if e.name == module else f" (importing it failed: {(str(e).splitlines() or [repr(e)])[0]})"
        sys.exit(f"error: scripts/data/prepare_fineweb.py needs {module}{why} {use}: pip install {pip}")


def find_prepare_shards(explicit):
    candidates = [explicit] if explicit else [os.environ.get("PREPARE_SHARDS"),
                                              os.path.join(REPO, "build", "prepare_shards"),
                                              os.path.join(REPO, "prepare_shards")]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    sys.exit("prepare_fineweb.py: prepare_shards not found (build it, or pass --prepare-shards / set PREPARE_SHARDS)")


def open_text(path):
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    if path.endswith(".xz"):
        return lzma.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def local_documents(paths, field):
    for path in paths:
        if path.endswith(".parquet"):
            import pyarrow.parquet as pq  # main checked that it imports
            for batch in pq.ParquetFile(path).iter_batches(columns=[field]):
                yield from batch.column(field).to_pylist()
        else:
            with open_text(path) as f:
                for line_no, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        yield json.loads(line)[field]
                    except (json.JSONDecodeError, KeyError, TypeError) as e:
                        sys.exit(f"prepare_fineweb.py: {path}:{line_no}: no \"{field}\" string ({e})")


def hub_documents(dataset, config, field):
    from datasets import load_dataset  # main checked that it imports
    for record in load_dataset(dataset, name=config, split="train", streaming=True):
        yield record[field]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", nargs="+", help="local .jsonl[.gz|.xz] or .parquet files (default: the hub)")
    ap.add_argument("--dataset", default="HuggingFaceFW/fineweb", help="hub dataset when there is no --input")
    ap.add_argument("--config", default="sample-10BT", help="hub dataset config")
    ap.add_argument("--field", default="text", help="record field holding the document text")
    ap.add_argument("--out", default=os.path.join(REPO, "data", "fineweb", "fineweb"), help="shard path prefix")
    ap.add_argument("--val-docs", type=int, default=100000, help="first N documents are validation (0: none)")
    ap.add_argument("--shard-size", type=int, default=100000000, help="tokens per shard")
    ap.add_argument("--max-docs", type=int, default=0, help="stop after N documents (0: all)")
    ap.add_argument("--threads", type=int, default=0, help="prepare_shards threads (0: all cores)")
    ap.add_argument("--prepare-shards", help="path to the prepare_shards binary")
    args = ap.parse_args()

    if not args.input:
        require("datasets", "to stream from the hub without --input", "datasets (or pass local files with --input)")
    elif any(p.endswith(".parquet") for p in args.input):
        require("pyarrow", "to read .parquet files", "pyarrow")
    binary = find_prepare_shards(args.prepare_shards)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    cmd = [binary, "--out", args.out, "--shard-size", str(args.shard_size),
           "--tokenizer", os.path.join(REPO, "data", "gpt2")]
    if args.val_docs > 0:
        cmd += ["--val-docs", str(args.val_docs)]
    if args.threads > 0:
        cmd += ["--threads", str(args.threads)]
    cmd.append("-")

    docs = local_documents(args.input, args.field) if args.input else hub_documents(args.dataset, args.config,
                                                                                  args.field)
    source = " ".join(args.input) if args.input else f"{args.dataset} ({args.config})"
    n_docs = n_split = 0
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE)
    streamed = False  # every document was written: only then may prepare_shards see the end of its input
    try:
        with open(proc.stdin.fileno(), "w", encoding="utf-8", closefd=False, buffering=1 << 20) as pipe:
            for text in docs:
                if args.max_docs and n_docs == args.max_docs:
                    break
                if SEPARATOR in text:
                    n_split += 1
                pipe.write(text)
                pipe.write(SEPARATOR)
                n_docs += 1
        streamed = True
    except BrokenPipeError:
        streamed = True  # prepare_shards stopped early; its exit status and message say why
    finally:
        if not streamed:
            # Reading the documents failed (a bad record, the network, Ctrl-C). Stop prepare_shards before
            # its input ends: it would take the end for the whole corpus and replace the earlier shards by a
            # partial set. On SIGTERM it removes its staging folder and leaves the earlier shards as they were.
            proc.terminate()
        try:
            proc.stdin.close()
        except BrokenPipeError:
            pass
        rc = proc.wait()
    if rc != 0:
        how = f"was killed by signal {-rc}" if rc < 0 else f"failed with exit status {rc}"
        # prepare_shards printed the reason on stderr just above (e.g. an empty train split).
        sys.exit(f"prepare_fineweb.py: prepare_shards {how} after {n_docs} documents from {source}; "
                 "its message is above")
    print(f"prepare_fineweb.py: {n_docs} documents streamed; {n_split} contained {SEPARATOR} and were split there",
          file=sys.stderr)


if __name__ == "__main__":
    main()
