#!/usr/bin/env python3
"""Plots two or more step-loss logs as one SVG and prints the max |loss difference| of each against the first.

A log has one line per step whose first two columns are step and loss (train_gpt's DIR/log.txt, the reference's
--log); "# val step N loss X" lines are validation losses, drawn as dots; other lines starting with '#' and blank
lines are ignored. Two panels: the loss (a running mean over --window steps, 1 by default) and each log's minus
the first's. Plain SVG, no plotting package. Example:
  plot_losses.py --out losses.svg ref.log ours/log.txt --labels pytorch train_gpt
"""
import argparse
import math
import os
import sys

COLORS = ["steelblue", "crimson", "forestgreen", "rebeccapurple", "darkorange", "saddlebrown"]


def read_log(path):
    """Returns ({step: loss}, {step: validation loss}); raises ValueError naming the file and line on a malformed line."""
    train, val = {}, {}
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            fields = line.split()
            try:
                if line.startswith("# val step") and len(fields) >= 6:
                    val[int(fields[3])] = float(fields[5])
                elif fields and not line.startswith("#"):
                    train[int(fields[0])] = float(fields[1])
            except (IndexError, ValueError):
                raise ValueError(f"{path}:{lineno}: expected 'step loss ...', got {line.strip()!r}") from None
    if not train:
        raise ValueError(f"{path}: no step lines")
    return train, val


def running_mean(series, window):
    steps = sorted(series)
    out, acc = {}, []
    for s in steps:
        acc.append(series[s])
        if len(acc) > window:
            acc.pop(0)
        out[s] = sum(acc) / len(acc)
    return out


def nice_ticks(lo, hi, count=5):
    span = hi - lo or 1.0
    raw = span / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    ticks, t = [], first
    while t <= hi + 1e-12:
        ticks.append(round(t, 10))
        t += step
    return ticks


def panel(svg, x0, y0, w, h, xr, yr, title, ylabel):
    svg.append(f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="dimgray"/>')
    svg.append(f'<text x="{x0 + w / 2}" y="{y0 - 8}" text-anchor="middle" font-size="13">{title}</text>')
    svg.append(f'<text x="{x0 - 48}" y="{y0 + h / 2}" text-anchor="middle" font-size="12" '
               f'transform="rotate(-90 {x0 - 48} {y0 + h / 2})">{ylabel}</text>')
    sx = lambda v: x0 + (v - xr[0]) / (xr[1] - xr[0]) * w
    sy = lambda v: y0 + h - (v - yr[0]) / (yr[1] - yr[0]) * h
    for t in nice_ticks(*xr):
        svg.append(f'<line x1="{sx(t):.1f}" y1="{y0 + h}" x2="{sx(t):.1f}" y2="{y0 + h + 4}" stroke="dimgray"/>')
        svg.append(f'<text x="{sx(t):.1f}" y="{y0 + h + 16}" text-anchor="middle" font-size="11">{t:g}</text>')
    for t in nice_ticks(*yr):
        svg.append(f'<line x1="{x0}" y1="{sy(t):.1f}" x2="{x0 + w}" y2="{sy(t):.1f}" stroke="gainsboro"/>')
        svg.append(f'<text x="{x0 - 6}" y="{sy(t) + 4:.1f}" text-anchor="end" font-size="11">{t:g}</text>')
    svg.append(f'<text x="{x0 + w / 2}" y="{y0 + h + 32}" text-anchor="middle" font-size="12">step</text>')
    return sx, sy


def polyline(svg, points, sx, sy, color):
    path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
    svg.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.4"/>')


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", nargs="+", help="step-loss log files (two or more)")
    parser.add_argument("--labels", nargs="+", help="one label per log (default: file names)")
    parser.add_argument("--out", required=True, help="output SVG")
    parser.add_argument("--title", default="training loss")
    parser.add_argument("--window", type=int, default=1, help="running mean of the loss over this many steps (default 1: none)")
    args = parser.parse_args(argv)
    if len(args.logs) < 2:
        parser.error("need at least two logs")
    if args.window < 1:
        parser.error(f"--window must be >= 1, got {args.window}")
    labels = args.labels or [os.path.basename(p) for p in args.logs]
    if len(labels) != len(args.logs):
        parser.error(f"{len(labels)} labels for {len(args.logs)} logs")
    try:
        logs = [read_log(p) for p in args.logs]
    except OSError as e:
        print(f"error: {e.filename}: {e.strerror}", file=sys.stderr)
        return 1
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    base, base_label = logs[0][0], labels[0]
    for (run, _), label in zip(logs[1:], labels[1:]):
        common = sorted(base.keys() & run.keys())
        if not common:
            print(f"{label} vs {base_label}: no common steps")
            continue
        diffs = [run[s] - base[s] for s in common]
        worst = max(range(len(common)), key=lambda i: abs(diffs[i]))
        print(f"{label} vs {base_label}: max |difference| {abs(diffs[worst]):.6g} at step {common[worst]} "
              f"over {len(common)} common steps")
    runs = [(label, running_mean(train, args.window), val) for label, (train, val) in zip(labels, logs)]
    skip = args.window - 1  # the first full window
    ref = runs[0][1]
    xmax = max(max(t) for _, t, _ in runs)
    ys = [v for _, t, val in runs for v in list(t.values())[skip:] + list(val.values())]
    yr = (min(ys) - 0.1, max(ys) + 0.1)
    diffs = [[(s, t[s] - ref[s]) for s in sorted(t) if s in ref and s >= skip] for _, t, _ in runs[1:]]
    dmax = max([abs(d) for ds in diffs for _, d in ds] + [0.01]) * 1.15

    W, H, pw, ph = 900, 420, 340, 280
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="14">{args.title}</text>']
    smoothed = f" (mean of {args.window} steps)" if args.window > 1 else ""
    sx, sy = panel(svg, 80, 60, pw, ph, (0, xmax), yr, f"loss{smoothed}, validation dots", "loss")
    for i, (label, t, val) in enumerate(runs):
        c = COLORS[i % len(COLORS)]
        polyline(svg, [(s, t[s]) for s in sorted(t) if s >= skip], sx, sy, c)
        for s, v in sorted(val.items()):
            if yr[0] <= v <= yr[1]:
                svg.append(f'<circle cx="{sx(s):.1f}" cy="{sy(v):.1f}" r="3.5" fill="{c}"/>')
    sx2, sy2 = panel(svg, 520, 60, pw, ph, (0, xmax), (-dmax, dmax),
                     f"loss minus {runs[0][0]}'s{smoothed}", "difference")
    svg.append(f'<line x1="520" y1="{sy2(0):.1f}" x2="{520 + pw}" y2="{sy2(0):.1f}" stroke="gray" stroke-dasharray="4 3"/>')
    for i, ds in enumerate(diffs):
        polyline(svg, ds, sx2, sy2, COLORS[(i + 1) % len(COLORS)])
    y = 385
    for i, (label, _, val) in enumerate(runs):
        x = 80 + i * 200
        last = f" (val {val[max(val)]:.3f})" if val else ""
        svg.append(f'<line x1="{x}" y1="{y}" x2="{x + 22}" y2="{y}" stroke="{COLORS[i % len(COLORS)]}" stroke-width="3"/>')
        svg.append(f'<text x="{x + 28}" y="{y + 4}" font-size="12">{label}{last}</text>')
    svg.append("</svg>")
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(svg) + "\n")
    os.replace(tmp, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
