#!/usr/bin/env python3
"""Plain-NumPy reference of QLoRA's 4-bit NormalFloat (NF4) storage, for model/nf4.h (docs/formats.md "QLoRA's NF4
format").

    python3 scripts/reference/nf4_reference.py --fixtures DIR [--seed 1234]

writes the test fixtures that test/test_nf4.cpp compares with bitwise (the cases and their files: write_fixtures).

Follows bitsandbytes' quantize_4bit(quant_type="nf4", blocksize=64, compress_statistics=True) and dequantize_4bit
(bitsandbytes/functional.py), with the arithmetic of its CUDA kernels (csrc/kernels.cu: kQuantizeBlockwise,
dQuantizeNF4, dQuantize, kDequantizeBlockwise), every step in float32 as there:

  Weights w[0..n) (the tensor flattened row-major), blocks of B = 64; the last block may be partial.
  absmax[b]   = max |w[i]| over block b
  scaled[i]   = w[i] * (1 / absmax[b])                      (a float32 reciprocal, then a product)
  code[i]     = #{k : scaled[i] > threshold[k]}             (0..15; the 15 thresholds sit between NF4's 16 values)
  packed[j]   = code[2j] << 4 | code[2j+1]                  (the first element in the high nibble; odd n: the last
                                                             low nibble is the code of 0 in the last block)
  w'[i]       = NF4[code[i]] * absmax[b]

  Double quantization (QLoRA's "compress_statistics"): the m = ceil(n / 64) absmaxes, blocks of 256:
  offset      = mean(absmax)                                (float64 sum in index order / m, rounded to float32;
                                                             bitsandbytes: torch's float32 mean, whose summation
                                                             order is the device's)
  c[b]        = absmax[b] - offset
  nested[g]   = max |c[b]| over group g of 256 (the last group may be partial)
  code8[b]    = dQuantize(c[b] * (1 / nested[g]))           (the dynamic 8-bit map, index 0..255)
  absmax'[b]  = DYNAMIC[code8[b]] * nested[g] + offset      (two roundings: the product, then the sum)
  w'[i]       = NF4[code[i]] * absmax'[b]                   (the 4-bit codes are those of the exact absmax)

  Ties: a value equal to a threshold takes the lower code (strict >). The thresholds are bitsandbytes' decimal
  literals: each exact midpoint of two adjacent NF4 values printed as its shortest decimal, which the compiler rounds
  to float32 once (four of them are then the other neighbour than the midpoint's own round-to-even: it is a float32
  tie). dQuantize is a binary search of the 256 sorted values followed by a comparison with the float32 midpoints
  (val + neighbour) * 0.5; dynamic8_codes does it step by step.
  A block of zeros: absmax 0, so scaled = 0 * inf = NaN, which fails every comparison: code 0 (NF4 -1.0, or the
  dynamic map's first index), dequantized to -0.0 (NF4) or to offset (the nested level), as on the GPU.

NF4 values: bitsandbytes' get_4bit_type("nf4") (QLoRA, Dettmers et al. 2023, appendix E). The dynamic map:
create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8), whose torch.linspace(0.1, 1, k) in float32 is
torch 2's CPU kernel as its x86 builds compile it: start + step * i (end - step * (k-1-i) past the middle) as one
fused multiply-add. (torch 1.13's vectorised linspace rounds 42 of the 256 values 1 ulp apart.)
Needs only numpy.
"""
import argparse
import os
import sys
from fractions import Fraction

# a package that cannot be imported: one line that names it and how to install it, no traceback
for _module, _pip in (("numpy", "numpy"),):
    try:
        __import__(_module)
    except ImportError as e:
        _why = "" if e.name == _module else f" (importing it failed: {(str(e).splitlines() or [repr(e)])[0]})"
        sys.exit(f"error: scripts/reference/nf4_reference.py needs {_module}{_why}: pip install {_pip}")
import numpy as np  # noqa: E402

BLOCK = 64          # weights per absmax
NESTED_BLOCK = 256  # absmaxes per nested absmax (double quantization)
F32 = np.float32
NF4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                0.7229568362236023, 1.0], dtype=F32)


def float32_nearest(decimal_text):
    """The float32 nearest the decimal (ties to even), as a C compiler reads a float literal: one rounding."""
    exact = Fraction(decimal_text)
    guess = F32(float(exact))
    neighbours = (guess, np.nextafter(guess, F32(-np.inf)), np.nextafter(guess, F32(np.inf)))
    return min(neighbours, key=lambda f: (abs(Fraction(float(f)) - exact), int(f.view(np.uint32)) & 1))


def nf4_thresholds():
    """dQuantizeNF4's 15 thresholds: the exact midpoints' shortest decimals (repr), rounded once to float32."""
    return np.array([float32_nearest(repr((float(a) + float(b)) / 2)) for a, b in zip(NF4[:-1], NF4[1:])], dtype=F32)


def linspace_fma(start, end, steps):
    """torch.linspace(start, end, steps, dtype=float32) on an x86 CPU: each value one fused multiply-add. The float64
    products and sums below are exact (24-bit step times a 7-bit index, within 31 bits of 1), so rounding them to
    float32 is the fused operation's single rounding."""
    start, end = F32(start), F32(end)
    step = (end - start) / F32(steps - 1)
    values = [float(start) + float(step) * i if i < steps // 2 else float(end) - float(step) * (steps - 1 - i)
              for i in range(steps)]
    return np.array(values, dtype=np.float64).astype(F32)


def dynamic_map():
    """create_dynamic_map(signed=True): 7 exponent ranges 10^-6..10^0, each the means of adjacent points of
    linspace(0.1, 1, 2^i + 1), both signs, plus 0 and 1; sorted (256 values)."""
    values = []
    for i in range(7):
        bounds = linspace_fma(0.1, 1.0, 2 ** i + 1)
        means = (bounds[:-1] + bounds[1:]) / F32(2.0)
        scale = F32(10 ** (-6 + i))  # torch multiplies by the Python scalar cast to float32
        values += [scale * means, -scale * means]
    table = np.sort(np.concatenate(values + [np.array([0.0, 1.0], dtype=F32)]))
    assert table.size == 256 and table.dtype == F32
    return table


def block_absmax(values, block):
    """max |v| per block of `block` values (the last block partial), and the values padded with zeros to whole blocks."""
    padded = np.zeros(-(-values.size // block) * block, dtype=F32)
    padded[:values.size] = values
    return np.abs(padded.reshape(-1, block)).max(axis=1), padded


def scale_blocks(padded, absmax, block):
    """v * (1 / absmax) per block, in float32; 1/0 = inf, so a block of zeros gives NaN as on the GPU."""
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        return (padded.reshape(-1, block) * (F32(1.0) / absmax)[:, None]).reshape(-1)


def nf4_codes(scaled):
    """dQuantizeNF4: the number of thresholds below the value; NaN is below none (code 0)."""
    codes = np.searchsorted(nf4_thresholds(), scaled, side="left").astype(np.uint8)
    codes[np.isnan(scaled)] = 0
    return codes


def dynamic8_codes(x, table):
    """dQuantize<0> (kernels.cu) on every element: a 7-step binary search from index 127, then the comparison with
    the float32 midpoint to the neighbour on x's side (upper/lower: the last indices passed on either side; the
    table's ends when none)."""
    pivot = np.full(x.shape, 127)
    upper_pivot, lower_pivot = np.full(x.shape, 255), np.zeros(x.shape, dtype=int)
    upper, lower = np.full(x.shape, F32(1.0)), np.full(x.shape, F32(-1.0))
    val = table[pivot]
    for step in (64, 32, 16, 8, 4, 2, 1):
        right = x > val
        lower_pivot, lower = np.where(right, pivot, lower_pivot), np.where(right, val, lower)
        upper_pivot, upper = np.where(right, upper_pivot, pivot), np.where(right, upper, val)
        pivot = np.where(right, pivot + step, pivot - step)
        val = table[pivot]
    upper = np.where(upper_pivot == 255, table[255], upper)
    lower = np.where(lower_pivot == 0, table[0], lower)
    right = x > val
    to_upper = x > (upper + val) * F32(0.5)
    to_lower = x < (lower + val) * F32(0.5)
    return np.where(right, np.where(to_upper, upper_pivot, pivot), np.where(to_lower, lower_pivot, pivot)).astype(np.uint8)


def quantize_dynamic8(values, table):
    """bitsandbytes' quantize_blockwise(values, blocksize=256): (codes, absmax per block)."""
    absmax, padded = block_absmax(values, NESTED_BLOCK)
    codes = dynamic8_codes(scale_blocks(padded, absmax, NESTED_BLOCK)[:values.size], table)
    return codes, absmax


def quantize(weights, double_quant):
    """NF4 quantization of float32 weights (flattened): a dict of the stored arrays."""
    weights = np.ascontiguousarray(weights, dtype=F32).reshape(-1)
    if weights.size == 0 or not np.isfinite(weights).all():
        raise ValueError("NF4 quantizes a non-empty array of finite weights")
    absmax, padded = block_absmax(weights, BLOCK)
    codes = nf4_codes(scale_blocks(padded, absmax, BLOCK))
    # the pad of an odd count is the code of 0 in the last block (the kernel loads zeros past the end)
    codes = codes[:weights.size + weights.size % 2]
    state = {"count": weights.size, "packed": ((codes[0::2] << 4) | codes[1::2]).astype(np.uint8)}
    if not double_quant:
        state["absmax"] = absmax
        return state
    offset = F32(np.add.accumulate(absmax.astype(np.float64))[-1] / absmax.size)
    absmax_codes, nested = quantize_dynamic8(absmax - offset, dynamic_map())
    state.update(absmax_codes=absmax_codes, nested_absmax=nested, offset=offset)
    return state


def block_scales(state):
    """The absmax each block dequantizes with: stored (single) or rebuilt from the 8-bit codes (double)."""
    if "absmax" in state:
        return state["absmax"]
    nested = np.repeat(state["nested_absmax"], NESTED_BLOCK)[:state["absmax_codes"].size]
    return dynamic_map()[state["absmax_codes"]] * nested + state["offset"]


def dequantize(state):
    """float32 weights from a quantize() state."""
    codes = np.empty(state["packed"].size * 2, dtype=np.uint8)
    codes[0::2], codes[1::2] = state["packed"] >> 4, state["packed"] & 0x0F
    scales = np.repeat(block_scales(state), BLOCK)[:state["count"]]
    return NF4[codes[:state["count"]]] * scales


def bf16_bits(values):
    """float32 -> bfloat16 bits, round to nearest even (finite values)."""
    bits = values.astype(F32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def threshold_probes(thresholds, scale):
    """Each threshold and its float32 neighbours, times `scale` (a power of two: exact), after the block's absmax."""
    probes = [F32(1.0)]
    for t in thresholds:
        probes += [t, np.nextafter(t, F32(np.inf)), np.nextafter(t, F32(-np.inf))]
    return np.array(probes, dtype=F32) * F32(scale)


def fixture_inputs(seed):
    """The named weight arrays of the fixtures (each quantized with and without double quantization)."""
    rng = np.random.default_rng(seed)
    normal = lambda n: rng.standard_normal(n, dtype=F32)  # noqa: E731
    rows = normal(96 * 700).reshape(96, 700) * (F32(0.02) * (1 + np.arange(96, dtype=F32) % 5))[:, None]
    zeros = normal(5 * BLOCK + 17)
    zeros[BLOCK:2 * BLOCK] = 0.0
    zeros[3 * BLOCK:] = 0.0
    zeros[4 * BLOCK:4 * BLOCK + 3] = normal(3)  # block 4 nonzero, the partial block 5 (odd length) all zeros
    huge = normal(300 * BLOCK + 5)
    huge[130 * BLOCK + 17] = 1e30
    ties = np.zeros(4 * BLOCK + 1, dtype=F32)
    thresholds = nf4_thresholds()
    for block, scale in enumerate((1.0, 2.0, 0.5)):
        probes = threshold_probes(thresholds, scale)
        ties[block * BLOCK:block * BLOCK + probes.size] = probes
    ties[3 * BLOCK:3 * BLOCK + 46] = -threshold_probes(thresholds, 1.0)  # absmax from a negative weight
    tiny = np.concatenate([normal(BLOCK) * F32(1e-40), normal(BLOCK) * F32(1e-38), normal(BLOCK)])
    return {
        "normal": normal(3 * NESTED_BLOCK * BLOCK + 100 * BLOCK + 37),  # 869 absmaxes: 3 groups of 256 and 101
        "rows": rows.reshape(-1),                                       # per-row scales, 1050 absmaxes
        "zeros": zeros,
        "all_zeros": np.zeros(300, dtype=F32),
        "huge": huge,
        "ties": ties,
        "tiny": tiny,                                                   # subnormal absmax: 1/absmax = inf
    }


def dynamic8_tie_values(table):
    """Every midpoint of the dynamic map as dQuantize computes it, with its float32 neighbours, in groups of 255 after
    a 1.0 (each group's absmax, so that the scaled values are these exactly)."""
    midpoints = (table[:-1] + table[1:]) * F32(0.5)
    probes = np.stack([midpoints, np.nextafter(midpoints, F32(np.inf)), np.nextafter(midpoints, F32(-np.inf))], 1)
    probes = np.concatenate([probes.reshape(-1), table, [F32(-1.0)]])
    groups = [np.concatenate([[F32(1.0)], probes[i:i + NESTED_BLOCK - 1]]) for i in range(0, probes.size, NESTED_BLOCK - 1)]
    return np.concatenate(groups).astype(F32)


def write_fixtures(folder, seed):
    """DIR/cases.txt: one line per case, "NAME COUNT DOUBLE_QUANT"; per case, little-endian raw arrays:
    NAME.weights.f32, NAME.packed.u8, NAME.dequant.f32, NAME.dequant.bf16 (uint16 bits), and NAME.absmax.f32
    (single) or NAME.absmax_codes.u8, NAME.nested_absmax.f32, NAME.offset.f32 (double). Tables: nf4_thresholds.f32,
    dynamic_map.f32; the 8-bit quantizer alone: dynamic8_ties.values.f32 -> dynamic8_ties.codes.u8,
    dynamic8_ties.absmax.f32."""
    os.makedirs(folder, exist_ok=True)
    write = lambda name, array: np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tofile(os.path.join(folder, name))  # noqa: E731
    lines = []
    for name, weights in fixture_inputs(seed).items():
        for double_quant in (False, True):
            case = f"{name}_{'double' if double_quant else 'single'}"
            state = quantize(weights, double_quant)
            dequantized = dequantize(state)
            write(f"{case}.weights.f32", weights.astype(F32))
            write(f"{case}.packed.u8", state["packed"])
            write(f"{case}.dequant.f32", dequantized)
            write(f"{case}.dequant.bf16", bf16_bits(dequantized))
            if double_quant:
                write(f"{case}.absmax_codes.u8", state["absmax_codes"])
                write(f"{case}.nested_absmax.f32", state["nested_absmax"])
                write(f"{case}.offset.f32", np.array([state["offset"]], dtype=F32))
            else:
                write(f"{case}.absmax.f32", state["absmax"])
            lines.append(f"{case} {weights.size} {int(double_quant)}\n")
    table = dynamic_map()
    write("nf4_thresholds.f32", nf4_thresholds())
    write("dynamic_map.f32", table)
    values = dynamic8_tie_values(table)
    codes, absmax = quantize_dynamic8(values, table)
    write("dynamic8_ties.values.f32", values)
    write("dynamic8_ties.codes.u8", codes)
    write("dynamic8_ties.absmax.f32", absmax)
    with open(os.path.join(folder, "cases.txt"), "w") as f:
        f.writelines(lines)


def main():
    parser = argparse.ArgumentParser(description="NumPy reference of QLoRA's NF4 format: writes test fixtures.")
    parser.add_argument("--fixtures", required=True, metavar="DIR", help="folder to write the fixtures into")
    parser.add_argument("--seed", type=int, default=1234, help="seed of the random weights")
    args = parser.parse_args()
    write_fixtures(args.fixtures, args.seed)


if __name__ == "__main__":
    main()
