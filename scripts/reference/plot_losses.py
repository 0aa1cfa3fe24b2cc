#!/usr/bin/env python3
"""Plots two or more step-loss logs and prints the max |loss difference| of each against the first.

A log has one line per step whose first two columns are step and loss; lines starting with '#' and blank
lines are ignored. Example:
  plot_losses.py --out losses.png ref.log ours.log --labels pytorch train_gpt
"""
import argparse
import os
import sys

# a package that cannot be imported: one line that names it and how to install it, no traceback
for _module, _pip in (("matplotlib", "matplotlib"),):
    try:
        __import__(_module)
    except ImportError as e:
        _why = "" if e.name == _module else f" (importing it failed: {(str(e).splitlines() or [repr(e)])[0]})"
        sys.exit(f"error: scripts/reference/plot_losses.py needs {_module}{_why}: pip install {_pip}")
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)


def read_log(path):
    """Returns {step: loss}; raises ValueError naming the file and line on a malformed line."""
    losses = {}
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            fields = line.split()
            try:
                losses[int(fields[0])] = float(fields[1])
            except (IndexError, ValueError):
                raise ValueError(f"{path}:{lineno}: expected 'step loss ...', got {line!r}") from None
    if not losses:
        raise ValueError(f"{path}: no step lines")
    return losses


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", nargs="+", help="step-loss log files (two or more)")
    parser.add_argument("--labels", nargs="+", help="one label per log (default: file names)")
    parser.add_argument("--out", required=True, help="output PNG")
    parser.add_argument("--title", default="training loss")
    args = parser.parse_args(argv)
    if len(args.logs) < 2:
        parser.error("need at least two logs")
    labels = args.labels or [os.path.basename(p) for p in args.logs]
    if len(labels) != len(args.logs):
        parser.error(f"{len(labels)} labels for {len(args.logs)} logs")
    try:
        runs = [read_log(p) for p in args.logs]
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1

    fig, (ax_loss, ax_diff) = plt.subplots(2, 1, figsize=(9, 7), sharex=True,
                                           gridspec_kw={"height_ratios": [3, 1]})
    colors = []
    for run, label in zip(runs, labels):
        steps = sorted(run)
        (line,) = ax_loss.plot(steps, [run[s] for s in steps], label=label, linewidth=1)
        colors.append(line.get_color())
    base, base_label = runs[0], labels[0]
    for run, label, color in zip(runs[1:], labels[1:], colors[1:]):
        common = sorted(base.keys() & run.keys())
        if not common:
            print(f"{label} vs {base_label}: no common steps")
            continue
        diffs = [run[s] - base[s] for s in common]
        worst = max(range(len(common)), key=lambda i: abs(diffs[i]))
        print(f"{label} vs {base_label}: max |difference| {abs(diffs[worst]):.6g} at step {common[worst]} "
              f"over {len(common)} common steps")
        ax_diff.plot(common, diffs, label=f"{label} - {base_label}", color=color, linewidth=1)
    ax_loss.set_ylabel("loss")
    ax_loss.set_title(args.title)
    ax_loss.legend()
    ax_loss.grid(alpha=0.3)
    ax_diff.set_xlabel("step")
    ax_diff.set_ylabel("difference")
    ax_diff.legend()
    ax_diff.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
