"""Summarises an Nsight Compute CSV (--csv --page raw, one row per kernel launch) of two training steps:
the kernels of the second step (after the first step's AdamW launches) grouped by name, largest time first."""
import argparse
import csv
import sys
from collections import defaultdict

def number(text):
    return float(text.replace(",", ""))  # ncu writes thousands separators

def main(path):
    with open(path) as f:
        lines = [line for line in f if line.startswith('"')]  # drop the program's own output
    rows = list(csv.DictReader(lines))[1:]  # the first row after the header holds the units
    names = [r["Kernel Name"] for r in rows]
    adam = [i for i, n in enumerate(names) if "adamw" in n]
    if not adam:
        sys.exit(f"{path}: no AdamW launch found; was the profile of two training steps?")
    first_step_end = adam[-1]
    # the first step ends at the last AdamW launch that precedes a non-AdamW launch
    for i in adam:
        if i + 1 < len(names) and "adamw" not in names[i + 1]:
            first_step_end = i
            break
    step = rows[first_step_end + 1:]
    total = defaultdict(float); count = defaultdict(int); dram = defaultdict(float)
    for r in step:
        name = r["Kernel Name"].split("(")[0].split("<")[0].replace("void ", "")
        t = number(r["gpu__time_duration.sum"])  # ns
        total[name] += t; count[name] += 1
        dram[name] += number(r["dram__bytes.sum"])  # bytes
    step_ns = sum(total.values())
    print(f"{len(step)} kernel launches, {step_ns / 1e6:.2f} ms of kernel time in one step")
    print(f"{'kernel':60s} {'calls':>6s} {'ms':>8s} {'share':>6s} {'GB':>7s} {'TB/s':>6s}")
    for name in sorted(total, key=total.get, reverse=True):
        t = total[name]
        print(f"{name[:60]:60s} {count[name]:6d} {t / 1e6:8.2f} {100 * t / step_ns:5.1f}% {dram[name] / 1e9:7.2f} {dram[name] / t / 1e3:6.2f}")

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("csv", help="ncu --csv --page raw output of two training steps (bench/profile_step.sh)")
    main(ap.parse_args().csv)
