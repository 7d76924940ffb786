#!/usr/bin/env python3
"""Plots and the README results table from the ladder's CSVs (bench rows + peer rows).

    scripts/plot.py results/<gpu>/ladder.csv results/<gpu>/peers.csv --out results/<gpu> --readme README.md

Writes four PNGs into --out (default: the first CSV's folder):
  tflops_vs_n.png        TFLOPS vs N, one panel per (d, causal), every rung and peer
                         (the FlashAttention papers' figure)
  ladder_n4096_d128.png  one bar per rung at N = 4096, d = 128, non-causal: speedup over
                         01_naive, and % of the relevant measured ceiling (copy bandwidth
                         for the memory-bound rungs 01-03a, bf16 GEMM for the rest)
  hbm_bytes_vs_n.png     HBM bytes per rung vs N (d = 128, non-causal): model as lines,
                         measured read + write as markers
  roofline.png           arithmetic intensity vs achieved TFLOPS under the measured copy
                         bandwidth slope and GEMM roof (hollow marker: model bytes, not measured;
                         rungs only: the peers' traffic is neither measured nor modelled)
and with --fp8 CSV (the FP8 run of scripts/reproduce.sh, fp8_speed.csv), from that file alone:
  fp8_vs_bf16.png        TFLOPS vs N of each fp8 rung and of 06d in bf16 in the same run, one
                         panel per d (non-causal), and below them the fp8 / bf16 ratio against
                         the 1.5x goal of FP8 at d >= 128
with --backward CSV... (attn_bench and peers.py --backward), from them alone:
  backward_tflops_vs_n.png  TFLOPS vs N of the backward passes and their peers
and with --decode CSV... (the decode sweep: attn_bench and peers.py --decode-sweep, or
scripts/decode_bench.py's contiguous and paged rows with their peers in CUDA graphs):
  decode_vs_nk.png       time vs Nk of one decode step, one panel per (Nq, B), every rung and
                         peer, and the time K and V take at the measured copy bandwidth
and with --inflight CSV (build/bench/inflight_bw), from it alone:
  inflight_bw.png        read bandwidth vs bytes in flight per SM, one line per CTAs per SM,
                         with the device copy's read rate and the decode model's bytes in flight
and with --decode-paged CSV (scripts/decode_bench.py), from it alone:
  decode_paged_vs_nk.png as decode_vs_nk.png, for the contiguous and paged rows and their peers
and with --train-step CSV (scripts/train_step_bench.py), from it alone:
  train_step.png         a rung's whole training step against each SDPA backend (the pair timed
                         in turns), one group per model shape, the speedup above each bar
The bench CSVs (positional) may be left out when only --decode, --decode-paged, --backward,
--inflight or --train-step is given.
With --readme FILE, rewrites the text between <!-- results:begin --> and
<!-- results:end --> with a TFLOPS table (rung x N, d = 128, non-causal) and links to
the images, relative to the README. Missing data skips that series; it never crashes.
"""

import argparse
import csv
import math
import os
import pathlib
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

INT_COLUMNS = ["B", "H", "Hkv", "Nq", "Nk", "d", "causal"]
FLOAT_COLUMNS = [
    "time_ms_median", "time_ms_min", "time_ms_max", "tflops", "model_flops", "model_hbm_bytes",
    "measured_read_bytes", "measured_write_bytes", "err_vs_prev", "err_vs_ref", "softmax_ms",
    "softmax_model_bytes", "ceiling_copy_gbps", "ceiling_gemm_tflops",
]

BASELINE_PREFIX = "01"  # speedups are over the rung whose name starts with this (01_naive)
MEMORY_BOUND_PREFIXES = ("01", "02", "03a")  # judged against copy bandwidth, the rest against GEMM
PEER_PREFIX = "torch_"
SAMPLE_GPU = "sample_not_measured"
PAPER_TOKENS = 16384  # B * N of the paper sweep
PAPER_HIDDEN = 2048  # H * d of the paper sweep
FP8_REFERENCE = "06d_fa3"  # the bf16 rung each fp8 rung is compared with (fp8_vs_bf16.png)
FP8_GOAL = 1.5  # fp8 / bf16 TFLOPS that FP8 should reach at d >= 128 (drawn as a line)
FOCUS_N = 4096  # the bar chart's problem ...
FOCUS_D = 128  # ... and the head dim of the bar chart, bytes plot, roofline and README table
README_BEGIN = "<!-- results:begin -->"
README_END = "<!-- results:end -->"

FIGSIZE = (12, 7)
DPI = 110
STYLE = {
    "font.size": 15,
    "axes.titlesize": 17,
    "axes.labelsize": 16,
    "xtick.labelsize": 13,
    "ytick.labelsize": 13,
    "legend.fontsize": 12,
    "figure.titlesize": 18,
    "lines.linewidth": 2.2,
    "lines.markersize": 8,
}
MARKERS = "osD^v<>pPX*h"


# ---- reading ------------------------------------------------------------------------------


def number(text, kind):
    try:
        x = float(text)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(x):
        return None
    return int(x) if kind is int else x


def load(paths):
    rows = []
    for path in paths:
        with open(path, newline="") as f:
            for raw in csv.DictReader(f):
                row = {k: (v or "").strip() for k, v in raw.items() if k}
                for c in INT_COLUMNS:
                    row[c] = number(row.get(c), int)
                for c in FLOAT_COLUMNS:
                    row[c] = number(row.get(c), float)
                if row.get("rung") and None not in (row["Nq"], row["Nk"], row["d"]):
                    rows.append(row)
    return rows


def is_peer(rung):
    return rung.startswith(PEER_PREFIX)


def is_memory_bound(rung):
    return not is_peer(rung) and rung.startswith(MEMORY_BOUND_PREFIXES)


def rung_order(rows):
    """Ladder rungs in name order (their numbers), then the peers."""
    names = sorted({r["rung"] for r in rows})
    return [n for n in names if not is_peer(n)] + [n for n in names if is_peer(n)]


def is_paper_shape(r):
    return r["B"] and r["H"] and r["B"] * r["Nq"] == PAPER_TOKENS and r["H"] * r["d"] == PAPER_HIDDEN


def series(rows, dtype, d, causal):
    """{rung: {N: row}} for square, non-GQA problems; paper-sweep shapes win, then later rows."""
    out = {}
    for r in rows:
        if r["dtype"] != dtype or r["d"] != d or r["causal"] != causal:
            continue
        if r["Nq"] != r["Nk"] or r["Hkv"] != r["H"]:
            continue
        by_n = out.setdefault(r["rung"], {})
        old = by_n.get(r["Nq"])
        if old is None or is_paper_shape(r) or not is_paper_shape(old):
            by_n[r["Nq"]] = r
    return out


def ceiling(rows, column):
    values = [r[column] for r in rows if r.get(column)]
    return statistics.median(values) if values else None


def gpu_label(rows):
    gpus = sorted({r.get("gpu", "") for r in rows if r.get("gpu")})
    label = ", ".join(gpus) or "unknown GPU"
    return f"SAMPLE DATA, NOT MEASURED ({label})" if SAMPLE_GPU in gpus else label


def n_label(n):
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


# ---- drawing helpers ---------------------------------------------------------------------


class Palette:
    """One color and marker per rung, the same in every figure."""

    def __init__(self, names):
        cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
        self.color = {n: cmap(i % cmap.N) for i, n in enumerate(names)}
        self.marker = {n: MARKERS[i % len(MARKERS)] for i, n in enumerate(names)}

    def line_style(self, name):
        return "--" if is_peer(name) else "-"


def new_figure(nrows=1, ncols=1, **kw):
    return plt.subplots(nrows, ncols, figsize=FIGSIZE, dpi=DPI, layout="constrained", squeeze=False, **kw)


def no_data(ax, what):
    ax.text(0.5, 0.5, f"no data: {what}", ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_xticks([])
    ax.set_yticks([])


def plain_log_labels(axis):
    """Ticks of a log axis labelled 20, 50, 100, 200 rather than 2 x 10^1 ... (1-2-5 only)."""

    def label(x, _):
        if x <= 0:
            return ""
        mantissa = x / 10 ** math.floor(math.log10(x) + 1e-9)
        return f"{x:g}" if any(abs(mantissa - m) < 1e-6 for m in (1, 2, 5)) else ""

    axis.set_major_formatter(FuncFormatter(label))
    axis.set_minor_formatter(FuncFormatter(label))


def byte_log_labels(axis):
    """Ticks of a log axis of bytes labelled 200 MB, 1 GB, 5 GB (1-2-5 only)."""

    def label(x, _):
        if x <= 0:
            return ""
        exponent = math.floor(math.log10(x) + 1e-9)
        mantissa = x / 10**exponent
        if not any(abs(mantissa - m) < 1e-6 for m in (1, 2, 5)):
            return ""
        for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
            if x >= scale:
                return f"{x / scale:g} {unit}"
        return f"{x:g} B"

    axis.set_major_formatter(FuncFormatter(label))
    axis.set_minor_formatter(FuncFormatter(label))


def log2_n_axis(ax, ns):
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns)
    ax.set_xticklabels([n_label(n) for n in ns])
    ax.minorticks_off()


def title(fig, text, rows):
    """The figure's title, and below it which GPU the rows come from."""
    fig.suptitle(f"{text}\n{gpu_label(rows)}")


def save(fig, out_dir, name):
    path = out_dir / name
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    print(f"plot.py: wrote {path}")
    return path


# ---- the four figures --------------------------------------------------------------------


def plot_tflops_vs_n(rows, dtype, palette, out_dir, name="tflops_vs_n.png", what="Attention forward"):
    chosen = [r for r in rows if r["dtype"] == dtype and r["tflops"] is not None]
    ds = sorted({r["d"] for r in chosen}) or [FOCUS_D]
    causals = sorted({r["causal"] for r in chosen}) or [0]
    fig, axes = new_figure(len(causals), len(ds), sharex=True)
    drawn = {}
    for ci, causal in enumerate(causals):
        for di, d in enumerate(ds):
            ax = axes[ci][di]
            data = series(chosen, dtype, d, causal)
            ax.set_title(f"d = {d}, {'causal' if causal else 'non-causal'}")
            if not data:
                no_data(ax, f"{dtype} d={d} causal={causal}")
                continue
            ns = sorted({n for by_n in data.values() for n in by_n})
            for rung in palette.color:
                by_n = data.get(rung)
                if not by_n:
                    continue
                xs = sorted(by_n)
                drawn[rung] = ax.plot(xs, [by_n[n]["tflops"] for n in xs], palette.line_style(rung),
                                      color=palette.color[rung], marker=palette.marker[rung], label=rung)[0]
            log2_n_axis(ax, ns)
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            if di == 0:
                ax.set_ylabel("TFLOPS")
            if ci == len(causals) - 1:
                ax.set_xlabel("sequence length N")
    if drawn:
        fig.legend(drawn.values(), drawn.keys(), loc="outside right center")
    title(fig, f"{what}, {dtype}: TFLOPS vs N", chosen or rows)
    return save(fig, out_dir, name)


def plot_fp8_vs_bf16(rows, palette, out_dir):
    """fp8 rungs next to FP8_REFERENCE in bf16 of the same rows (one run), non-causal."""
    fp8 = [r for r in rows if r["dtype"] == "fp8" and r["tflops"] is not None and r["causal"] == 0]
    ds = sorted({r["d"] for r in fp8}) or [FOCUS_D]
    fig, axes = new_figure(2, len(ds), sharex="col", height_ratios=[2, 1])
    drawn = {}
    for di, d in enumerate(ds):
        speed_ax, ratio_ax = axes[0][di], axes[1][di]
        speed_ax.set_title(f"d = {d}, non-causal")
        eight = series(fp8, "fp8", d, 0)
        ref = series(rows, "bf16", d, 0).get(FP8_REFERENCE, {})
        if not eight:
            no_data(speed_ax, f"fp8 d={d} non-causal")
            no_data(ratio_ax, f"fp8 d={d} non-causal")
            continue
        ns = sorted({n for by_n in eight.values() for n in by_n} | set(ref))
        lines = [(f"{rung} (fp8)", rung, by_n) for rung, by_n in sorted(eight.items())]
        if ref:
            lines.append((f"{FP8_REFERENCE} (bf16)", FP8_REFERENCE, ref))
        for label, rung, by_n in lines:
            xs = sorted(by_n)
            drawn[label] = speed_ax.plot(xs, [by_n[n]["tflops"] for n in xs], "-", color=palette.color[rung],
                                         marker=palette.marker[rung], label=label)[0]
        ratios = [1.0, FP8_GOAL]
        for rung, by_n in sorted(eight.items()):
            xs = [n for n in sorted(by_n) if n in ref]
            ys = [by_n[n]["tflops"] / ref[n]["tflops"] for n in xs]
            ratios += ys
            ratio_ax.plot(xs, ys, "-", color=palette.color[rung], marker=palette.marker[rung])
        if d >= 128:
            drawn[f"{FP8_GOAL}x goal"] = ratio_ax.axhline(FP8_GOAL, color="gray", linestyle="--",
                                                          label=f"{FP8_GOAL}x goal")
        log2_n_axis(ratio_ax, ns)
        speed_ax.set_ylim(bottom=0)
        ratio_ax.set_ylim(min(ratios) - 0.1, max(ratios) + 0.1)
        for ax in (speed_ax, ratio_ax):
            ax.grid(True, alpha=0.3)
        if di == 0:
            speed_ax.set_ylabel("TFLOPS")
            ratio_ax.set_ylabel(f"fp8 / {FP8_REFERENCE}")
        ratio_ax.set_xlabel("sequence length N")
    if drawn:
        fig.legend(drawn.values(), drawn.keys(), loc="outside right center")
    title(fig, "FP8 (whole rung: quantization pre-kernel + attention) vs bf16", fp8 or rows)
    return save(fig, out_dir, "fp8_vs_bf16.png")


def percent_of_ceiling(r):
    """(percent, ceiling name) against the rung's relevant ceiling, or (None, None)."""
    if is_memory_bound(r["rung"]):
        if r["model_hbm_bytes"] and r["time_ms_median"] and r["ceiling_copy_gbps"]:
            gbps = r["model_hbm_bytes"] / (r["time_ms_median"] * 1e-3) / 1e9
            return 100 * gbps / r["ceiling_copy_gbps"], "copy BW"
    elif r["tflops"] and r["ceiling_gemm_tflops"]:
        return 100 * r["tflops"] / r["ceiling_gemm_tflops"], "GEMM"
    return None, None


def hatch_peers(bars, names):
    for bar, name in zip(bars, names):
        if is_peer(name):
            bar.set_hatch("//")


def plot_ladder_bars(rows, dtype, palette, out_dir):
    data = series(rows, dtype, FOCUS_D, 0)
    at_n = {rung: by_n[FOCUS_N] for rung, by_n in data.items() if FOCUS_N in by_n and by_n[FOCUS_N]["time_ms_median"]}
    names = [n for n in palette.color if n in at_n]
    fig, axes = new_figure(1, 2)
    speed_ax, ceil_ax = axes[0]
    base = next((at_n[n] for n in names if n.startswith(BASELINE_PREFIX)), None)
    xs = range(len(names))
    colors = [palette.color[n] for n in names]
    if not names:
        no_data(speed_ax, f"{dtype} N={FOCUS_N} d={FOCUS_D} non-causal")
        no_data(ceil_ax, f"{dtype} N={FOCUS_N} d={FOCUS_D} non-causal")
    elif base is None:
        no_data(speed_ax, f"no {BASELINE_PREFIX}_* rung at N={FOCUS_N}")
    else:
        speedups = [base["time_ms_median"] / at_n[n]["time_ms_median"] for n in names]
        bars = speed_ax.bar(xs, speedups, color=colors, edgecolor="black")
        hatch_peers(bars, names)
        speed_ax.bar_label(bars, labels=[f"{s:.1f}x" if s >= 1 else f"{s:.2g}x" for s in speedups], padding=2,
                           fontsize=11)
        speed_ax.set_yscale("log")
        plain_log_labels(speed_ax.yaxis)
        speed_ax.set_ylabel(f"speedup over {base['rung']}")
    if names:
        percents = [percent_of_ceiling(at_n[n]) for n in names]
        heights = [p if p is not None else 0 for p, _ in percents]
        bars = ceil_ax.bar(xs, heights, color=colors, edgecolor="black")
        hatch_peers(bars, names)
        ceil_ax.bar_label(bars, labels=[f"{p:.0f}%" if p is not None else "n/a" for p, _ in percents],
                          padding=2, fontsize=11)
        kinds = {c for p, c in percents if p is not None}
        ceil_ax.set_title("\n".join(line for kind, line in (("copy BW", "memory-bound rungs: % of copy bandwidth"),
                                                              ("GEMM", "fused rungs and peers: % of bf16 GEMM"))
                                     if kind in kinds), fontsize=12)
        ceil_ax.set_ylim(0, max(100, max(heights) * 1.25))
        ceil_ax.set_ylabel("% of measured ceiling")
    for ax, drawn in ((speed_ax, bool(names) and base is not None), (ceil_ax, bool(names))):
        if drawn:
            ax.set_xticks(list(xs))
            ax.set_xticklabels(names, rotation=35, ha="right")
            ax.grid(True, axis="y", alpha=0.3)
    title(fig, f"The ladder at N = {FOCUS_N}, d = {FOCUS_D}, non-causal, {dtype}", rows)
    return save(fig, out_dir, "ladder_n4096_d128.png")


def min_bytes(r):
    """Q, K, V read once and O written once (common/hbm_model.h: min_bytes): 2-byte elements, but
    e4m3 inputs for the rung that takes them; O is 2-byte for every dtype."""
    q, kv = r["B"] * r["H"] * r["Nq"] * r["d"], r["B"] * r["Hkv"] * r["Nk"] * r["d"]
    return (1 if r["dtype"] == "e4m3" else 2) * (q + 2 * kv) + 2 * q


def plot_hbm_bytes(rows, dtype, palette, out_dir):
    data = {rung: by_n for rung, by_n in series(rows, dtype, FOCUS_D, 0).items() if not is_peer(rung)}
    fig, axes = new_figure()
    ax = axes[0][0]
    ns = sorted({n for by_n in data.values() for n in by_n})
    handles = []
    for rung in palette.color:
        by_n = data.get(rung)
        if not by_n:
            continue
        model = [(n, by_n[n]["model_hbm_bytes"]) for n in sorted(by_n) if by_n[n]["model_hbm_bytes"]]
        measured = [(n, by_n[n]["measured_read_bytes"] + by_n[n]["measured_write_bytes"]) for n in sorted(by_n)
                    if by_n[n]["measured_read_bytes"] is not None and by_n[n]["measured_write_bytes"] is not None]
        color = palette.color[rung]
        if model:
            ax.plot(*zip(*model), "-", color=color)
        if measured:
            ax.plot(*zip(*measured), linestyle="none", marker=palette.marker[rung], color=color, markersize=10)
        if model or measured:
            handles.append(Line2D([], [], color=color, marker=palette.marker[rung], label=rung))
    floor = sorted({(r["Nq"], min_bytes(r)) for by_n in data.values() for r in by_n.values() if r["B"] and r["H"] and r["Hkv"]})
    if floor:
        ax.plot(*zip(*floor), ":", color="gray")
        handles.append(Line2D([], [], color="gray", linestyle=":", label="Q, K, V, O once"))
    if not handles:
        no_data(ax, f"{dtype} d={FOCUS_D} non-causal ladder rows")
    else:
        handles += [Line2D([], [], color="black", linestyle="-", label="model (line)"),
                    Line2D([], [], color="black", linestyle="none", marker="o", label="measured read+write")]
        ax.set_yscale("log")
        byte_log_labels(ax.yaxis)
        log2_n_axis(ax, ns)
        ax.set_xlabel("sequence length N")
        ax.set_ylabel("HBM bytes per forward call")
        ax.grid(True, which="both", alpha=0.3)
        fig.legend(handles=handles, loc="outside right center")
    title(fig, f"HBM traffic per call, d = {FOCUS_D}, non-causal, {dtype}", rows)
    return save(fig, out_dir, "hbm_bytes_vs_n.png")


def plot_roofline(rows, dtype, palette, out_dir):
    data = series(rows, dtype, FOCUS_D, 0)
    copy_gbps = ceiling(rows, "ceiling_copy_gbps")
    gemm_tflops = ceiling(rows, "ceiling_gemm_tflops")
    fig, axes = new_figure()
    ax = axes[0][0]
    intensities = []
    handles = []
    for rung in palette.color:
        points_measured, points_model = [], []
        if rung.startswith("torch_"):  # a peer's model_hbm_bytes is the Q, K, V, O floor, not its traffic
            continue
        for r in (data.get(rung) or {}).values():
            if not r["tflops"] or not r["model_flops"]:
                continue
            measured = (r["measured_read_bytes"] or 0) + (r["measured_write_bytes"] or 0)
            if measured > 0:
                points_measured.append((r["model_flops"] / measured, r["tflops"]))
            elif r["model_hbm_bytes"]:
                points_model.append((r["model_flops"] / r["model_hbm_bytes"], r["tflops"]))
        color, marker = palette.color[rung], palette.marker[rung]
        if points_measured:
            ax.plot(*zip(*points_measured), linestyle="none", marker=marker, color=color, markersize=10)
        if points_model:
            ax.plot(*zip(*points_model), linestyle="none", marker=marker, markerfacecolor="none",
                    markeredgecolor=color, markeredgewidth=2, markersize=10)
        if points_measured or points_model:
            intensities += [x for x, _ in points_measured + points_model]
            handles.append(Line2D([], [], color=color, marker=marker, linestyle="none", label=rung))
    if not intensities:
        no_data(ax, f"{dtype} d={FOCUS_D} non-causal rows with TFLOPS and bytes")
    else:
        lo, hi = min(intensities) / 2, max(intensities) * 2
        if copy_gbps:
            knee = gemm_tflops * 1e3 / copy_gbps if gemm_tflops else hi
            xs = [lo, min(max(knee, lo), hi)]
            ax.plot(xs, [x * copy_gbps / 1e3 for x in xs], "k-", linewidth=1.5)  # TFLOPS = FLOP/B * GB/s / 1e3
            handles.append(Line2D([], [], color="black", label=f"copy bandwidth {copy_gbps:.0f} GB/s"))
        if gemm_tflops:
            ax.axhline(gemm_tflops, color="black", linestyle="--", linewidth=1.5)
            handles.append(Line2D([], [], color="black", linestyle="--", label=f"bf16 GEMM {gemm_tflops:.0f} TFLOPS"))
        handles.append(Line2D([], [], color="gray", marker="o", markerfacecolor="none", linestyle="none",
                              label="hollow: model bytes (not measured)"))
        ax.set_xscale("log")
        ax.set_yscale("log")
        plain_log_labels(ax.xaxis)
        plain_log_labels(ax.yaxis)
        ax.set_xlim(lo, hi)
        ax.set_xlabel("arithmetic intensity (model FLOPs / HBM byte)")
        ax.set_ylabel("achieved TFLOPS")
        ax.grid(True, which="both", alpha=0.3)
        fig.legend(handles=handles, loc="outside right center")
    title(fig, f"Roofline, d = {FOCUS_D}, non-causal, {dtype}, all N", rows)
    return save(fig, out_dir, "roofline.png")


# ---- README --------------------------------------------------------------------------------


def results_markdown(rows, dtype, palette, images, readme):
    data = series(rows, dtype, FOCUS_D, 0)
    ns = sorted({n for by_n in data.values() for n in by_n})
    lines = [f"TFLOPS, {dtype}, d = {FOCUS_D}, non-causal, on {gpu_label(rows)}; "
             "generated by scripts/plot.py from the bench and peers CSVs.", ""]
    if data:
        lines.append("| rung | " + " | ".join(f"N = {n_label(n)}" for n in ns) + " |")
        lines.append("|---|" + "---:|" * len(ns))
        for rung in palette.color:
            by_n = data.get(rung)
            if by_n:
                cells = [f"{by_n[n]['tflops']:.1f}" if n in by_n and by_n[n]["tflops"] is not None else "–" for n in ns]
                lines.append(f"| {rung} | " + " | ".join(cells) + " |")
    else:
        lines.append(f"(no {dtype} d = {FOCUS_D} non-causal rows in the CSVs)")
    lines.append("")
    base = pathlib.Path(readme).resolve().parent
    for path in images:
        rel = pathlib.Path(os.path.relpath(pathlib.Path(path).resolve(), base)).as_posix()
        lines.append(f"![{path.stem}]({rel})")
    return "\n".join(lines)


def rewrite_readme(readme, body):
    text = pathlib.Path(readme).read_text()
    begin, end = text.find(README_BEGIN), text.find(README_END)
    if begin < 0 or end < begin:
        sys.exit(f"plot.py: {readme} has no '{README_BEGIN}' ... '{README_END}' block to rewrite")
    new = text[: begin + len(README_BEGIN)] + "\n" + body + "\n" + text[end:]
    pathlib.Path(readme).write_text(new)
    print(f"plot.py: rewrote the results block of {readme}")


def plot_decode(rows, palette, out_dir, name="decode_vs_nk.png"):
    """Time vs Nk per (Nq, B) of the decode sweep, with K + V at copy bandwidth as the floor."""
    chosen = [r for r in rows if r["time_ms_median"] is not None and r["Nq"] < r["Nk"]]
    nqs = sorted({r["Nq"] for r in chosen}) or [1]
    bs = sorted({r["B"] for r in chosen}) or [1]
    fig, axes = new_figure(len(nqs), len(bs), sharex=True)
    copy_gbps = ceiling(chosen, "ceiling_copy_gbps")
    drawn = {}
    for qi, nq in enumerate(nqs):
        for bi, b in enumerate(bs):
            ax = axes[qi][bi]
            ax.set_title(f"B = {b}, Nq = {nq}")
            here = [r for r in chosen if r["Nq"] == nq and r["B"] == b]
            if not here:
                no_data(ax, f"B={b} Nq={nq}")
                continue
            by_rung = {}
            for r in here:
                by_rung.setdefault(r["rung"], {})[r["Nk"]] = r
            nks = sorted({r["Nk"] for r in here})
            for rung in rung_order(here):
                xs = sorted(by_rung[rung])
                drawn[rung] = ax.plot(xs, [by_rung[rung][n]["time_ms_median"] * 1e3 for n in xs],
                                      palette.line_style(rung), color=palette.color[rung],
                                      marker=palette.marker[rung], label=rung)[0]
            if copy_gbps:  # K and V of [B, Hkv, Nk, d] in 2-byte elements, read once
                floor = [2 * 2 * b * here[0]["Hkv"] * n * here[0]["d"] / (copy_gbps * 1e9) * 1e6 for n in nks]
                label = f"K + V at copy bandwidth ({copy_gbps:.0f} GB/s)"
                drawn[label] = ax.plot(nks, floor, ":", color="gray", label=label)[0]
            ax.set_yscale("log")
            plain_log_labels(ax.yaxis)
            log2_n_axis(ax, nks)
            ax.grid(True, alpha=0.3)
            if bi == 0:
                ax.set_ylabel("time (µs)")
            if qi == len(nqs) - 1:
                ax.set_xlabel("keys Nk")
    if drawn:
        fig.legend(drawn.values(), drawn.keys(), loc="outside right center")
    h = chosen[0] if chosen else None
    shape = f"H = {h['H']} over Hkv = {h['Hkv']}, d = {h['d']}, {h['dtype']}" if h else ""
    title(fig, f"One decode step against a KV cache of Nk keys ({shape})", chosen or rows)
    return save(fig, out_dir, name)


def plot_inflight(path, out_dir):
    """Read bandwidth vs bytes in flight per SM (bench/inflight_bw.cu), one line per CTAs per SM."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    stream = [r for r in rows if r.get("kind") == "stream"]
    copy = [float(r["read_gbps"]) for r in rows if r.get("kind") == "copy"]
    fig, axes = new_figure()
    ax = axes[0][0]
    if not stream:
        no_data(ax, "inflight_bw rows")
    for c in sorted({int(r["ctas_per_sm"]) for r in stream}):
        pts = sorted((float(r["bytes_in_flight_per_sm"]) / 1e3, float(r["read_gbps"]))
                     for r in stream if int(r["ctas_per_sm"]) == c)
        ax.plot([x for x, _ in pts], [y for _, y in pts], "o-", label=f"cp.async, {c} CTA{'s' if c > 1 else ''} per SM")
    bulk = [r for r in rows if r.get("kind") == "bulk"]  # the same ring filled by cp.async.bulk (sm_90)
    for c in sorted({int(r["ctas_per_sm"]) for r in bulk}):
        pts = sorted((float(r["bytes_in_flight_per_sm"]) / 1e3, float(r["read_gbps"]))
                     for r in bulk if int(r["ctas_per_sm"]) == c)
        ax.plot([x for x, _ in pts], [y for _, y in pts], "x--", lw=0.9,
                label=f"cp.async.bulk, {c} CTA{'s' if c > 1 else ''} per SM")
    if copy:
        ax.axhline(copy[0], color="gray", ls=":", label=f"device copy, read + written ({copy[0]:.0f} GB/s)")
        ax.axhline(0.9 * copy[0], color="gray", ls="--", lw=0.8, label="90 % of it")
    if stream:
        model = float(stream[0]["model_bytes_in_flight_per_sm"]) / 1e3
        ax.axvline(model, color="black", ls="-.", lw=1,
                   label=f"model: bandwidth x latency / SMs = {model:.0f} kB")
    ax.set_xscale("log", base=2)
    xs = [float(r["bytes_in_flight_per_sm"]) / 1e3 for r in stream]
    ticks = [2**i for i in range(2, 11) if xs and min(xs) / 2 <= 2**i <= max(xs) * 2]
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel("bytes in flight per SM (kB): CTAs per SM x (stages - 1) x 8 kB")
    ax.set_ylabel("read bandwidth (GB/s)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    fig.suptitle(f"Little's law on the GPU at hand: a copy ring's read rate\n{stream[0]['gpu'] if stream else ''}")
    return save(fig, out_dir, "inflight_bw.png")


def plot_train_step(path, out_dir):
    """A rung's training step against each SDPA backend (scripts/train_step_bench.py: each pair
    timed in turns), grouped by shape: the speedup, > 1 where the ladder's step is faster."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    pairs = list(dict.fromkeys((r["impl"], r["peer"]) for r in rows))
    fig, axes = new_figure()
    ax = axes[0][0]
    if not rows:
        no_data(ax, "train_step rows")
    width = 0.8 / max(len(pairs), 1)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    rungs = list(dict.fromkeys(impl for impl, _ in pairs))
    for i, (impl, peer) in enumerate(pairs):
        for j, shape in enumerate(shapes):
            r = next((r for r in rows if (r["impl"], r["peer"], r["shape"]) == (impl, peer, shape)), None)
            if r is None:
                continue
            x = j + (i - (len(pairs) - 1) / 2) * width
            speedup = float(r["speedup"])
            ax.bar(x, speedup, width, color=colors[rungs.index(impl) % len(colors)],
                   hatch=None if peer.endswith("cudnn") else "//", edgecolor="white",
                   label=f"{impl.removeprefix('ladder_')} vs {peer.removeprefix('sdpa_')}" if j == 0 else None)
            ax.annotate(f"{speedup:.3f}", (x, speedup), ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.8)
    labels = []
    for shape in shapes:
        r = next(r for r in rows if r["shape"] == shape)
        labels.append(f"{r['layers']} layers, d_model {r['d_model']}, {r['heads']} heads\nB {r['B']}, T {r['T']}")
    ax.set_xticks(range(len(shapes)), labels)
    ax.set_ylabel("step speed against SDPA (its time / the rung's)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    gpu = rows[0]["gpu"] if rows else ""
    sha = rows[0].get("git_sha", "") if rows else ""
    fig.suptitle(f"Whole training steps, bf16, forward + backward; each pair timed step by step in turns\n{gpu}, {sha}")
    return save(fig, out_dir, "train_step.png")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csv", nargs="*", type=pathlib.Path, help="bench and/or peers CSV files")
    p.add_argument("--out", type=pathlib.Path, help="folder for the PNGs (default: the first CSV's folder)")
    p.add_argument("--dtype", default="bf16", help="rows of this dtype (default bf16)")
    p.add_argument("--readme", type=pathlib.Path, help="rewrite this file's results block")
    p.add_argument("--fp8", type=pathlib.Path, help="the FP8 run's CSV: fp8_vs_bf16.png from it alone")
    p.add_argument("--decode", type=pathlib.Path, nargs="+", help="the decode sweep's CSVs: decode_vs_nk.png from them alone")
    p.add_argument("--backward", type=pathlib.Path, nargs="+",
                   help="the backward sweep's CSVs (attn_bench/peers.py --backward): <first CSV's name>_tflops_vs_n.png "
                        "from them alone")
    p.add_argument("--decode-paged", type=pathlib.Path, nargs="+",
                   help="scripts/decode_bench.py's CSVs (contiguous and paged in CUDA graphs): decode_paged_vs_nk.png")
    p.add_argument("--inflight", type=pathlib.Path, help="build/bench/inflight_bw's CSV: inflight_bw.png from it alone")
    p.add_argument("--train-step", type=pathlib.Path, help="scripts/train_step_bench.py's CSV: train_step.png from it alone")
    args = p.parse_args(argv)
    if not (args.csv or args.decode or args.backward or args.inflight or args.decode_paged or args.train_step):
        p.error("give bench/peers CSVs, or --decode, --decode-paged, --backward, --inflight or --train-step")
    extra = [*([args.fp8] if args.fp8 else []), *(args.decode or []), *(args.backward or []), *(args.decode_paged or []),
             *([args.inflight] if args.inflight else []), *([args.train_step] if args.train_step else [])]
    missing = [str(c) for c in [*args.csv, *extra] if not c.is_file()]
    if missing:
        sys.exit(f"plot.py: no such CSV: {', '.join(missing)}")
    rows = load(args.csv) if args.csv else []
    out_dir = args.out or (args.csv or extra)[0].parent
    out_dir.mkdir(parents=True, exist_ok=True)
    plt.rcParams.update(STYLE)
    fp8_rows = load([args.fp8]) if args.fp8 else []
    names = rung_order(rows)  # the fp8 run's own rungs after them: the ladder's colors stay
    palette = Palette(names + [n for n in rung_order(fp8_rows) if n not in names])
    images = [
        plot_tflops_vs_n(rows, args.dtype, palette, out_dir),
        plot_ladder_bars(rows, args.dtype, palette, out_dir),
        plot_hbm_bytes(rows, args.dtype, palette, out_dir),
        plot_roofline(rows, args.dtype, palette, out_dir),
    ] if args.csv else []
    if args.fp8:  # linked from 06_fa3_hopper/README.md, not from the results block
        plot_fp8_vs_bf16(fp8_rows, palette, out_dir)
    if args.backward:  # linked from 04's and 05's READMEs
        bwd_rows = load(args.backward)
        stem = args.backward[0].stem  # backward.csv (reproduce.sh) or a named sweep, e.g. backward_06.csv
        plot_tflops_vs_n(bwd_rows, args.dtype, Palette(rung_order(bwd_rows)), out_dir, f"{stem}_tflops_vs_n.png",
                         "Attention backward (FLOPs 2.5x the forward's)")
    if args.decode:  # linked from 05_fa2_reordered/decode.md
        decode_rows = load(args.decode)
        plot_decode(decode_rows, Palette(rung_order(decode_rows)), out_dir)
    if args.decode_paged:  # scripts/decode_bench.py: contiguous and paged, CUDA graphs
        paged_rows = load(args.decode_paged)
        plot_decode(paged_rows, Palette(rung_order(paged_rows)), out_dir, "decode_paged_vs_nk.png")
    if args.inflight:  # linked from 05_fa2_reordered/decode.md
        plot_inflight(args.inflight, out_dir)
    if args.train_step:  # linked from 06_fa3_hopper/06g_bwd.md
        plot_train_step(args.train_step, out_dir)
    if args.readme and args.csv:
        rewrite_readme(args.readme, results_markdown(rows, args.dtype, palette, images, args.readme))
    return 0


if __name__ == "__main__":
    sys.exit(main())
