#!/usr/bin/env python3
"""The lessons' figures, drawn from the code's own parameters and from the reference run.

    python3 scripts/figures.py            # (re)draw every figure next to its lesson
    python3 scripts/figures.py --check    # CI (CTest: figures): draw all into a temporary
                                          # folder, and check the lessons' figure links

Each figure is a function below, registered with the path it writes (<rung>/figures/*.png).
Tile sizes, ring depths, the swizzle and the rescaling threshold are read from the headers
(parse(), which fails loudly when a pattern moves); byte counts follow common/hbm_model.cpp;
the measured timelines are parsed from results/<gpu>/tile_timeline.txt (bench/tile_timeline).
No GPU is needed. --check fails when a figure does not draw, when a lesson links a
figures/*.png that is not there, or when a committed figure is linked by no lesson (except
those in AWAITING, each with its reason).
"""

import argparse
import csv
import io
import pathlib
import re
import sys
import tempfile

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402
from PIL import Image  # noqa: E402  (matplotlib's own dependency)

REPO = pathlib.Path(__file__).resolve().parent.parent
REF = REPO / "results" / "nvidia_h100_80gb_hbm3"  # the reference run the lessons quote
DPI = 110
H100_SMEM_OPTIN = 232448  # cudaDevAttrMaxSharedMemoryPerBlockOptin on an H100 (227 KiB)
H100_FLOP_PER_CYCLE = 4096  # dense bf16 FLOP per SM per cycle (06d.md)
# Per-SM rates of sm_90 (CUDA C++ Programming Guide, arithmetic instructions): exp2 on the
# MUFU, fp32 add/multiply; shared memory moves 128 bytes per cycle.
SM90_MUFU_PER_CYCLE, SM90_FP32_PER_CYCLE, SMEM_BYTES_PER_CYCLE = 16, 128, 128

# Figures drawn here that no lesson links yet, with the reason (--check allows them).
AWAITING = {
}

FIGURES = {}  # path relative to the repository -> drawing function(path)


def figure(rel):
    def register(fn):
        FIGURES[rel] = fn
        return fn

    return register


# ---------------------------------------------------------------- parameters from the code


def source(rel):
    return (REPO / rel).read_text()


def parse(rel, pattern, cast=int):
    """The groups of `pattern`'s first match in file `rel`; fails when the code moved."""
    m = re.search(pattern, source(rel))
    if not m:
        raise RuntimeError(f"{rel}: no match for {pattern!r}: update scripts/figures.py")
    return tuple(cast(g) for g in m.groups())


def fa2_tile(d):
    """05's TileFor<d>: (B_r, B_c, warps, stages)."""
    return parse("05_fa2_reordered/fa2_tiles.h",
                 rf"struct TileFor<{d}> : Tile<{d}, (\d+), (\d+), (\d+), (\d+)>")


def fa2_rescale_log2():
    return parse("05_fa2_reordered/fa2_tiles.h", r"kRescaleLog2 = ([\d.]+)f;", float)[0]


def fa2_swizzle():
    """SwizzledRows: chunk c of row r at c ^ (r % period); returns the period."""
    (period,) = parse("05_fa2_reordered/fa2_tiles.h", r"\(chunk \^ \(row % (\d+)\)\) \* kChunkElems")
    return period


def fa3_by_d(function, d):
    """A constexpr `int function(int d)` of fa3_launch.h written as a chain of d == X ? Y : ..."""
    (body,) = parse("06_fa3_hopper/fa3_launch.h", rf"constexpr int {function}\(int d\) \{{ return ([^;]+); \}}", str)
    for m in re.finditer(r"d == (\d+) \? (\d+)", body):
        if int(m.group(1)) == d:
            return int(m.group(2))
    return int(body.rsplit(":", 1)[1])


def fa3_config():
    """06b-d at d = 128: B_r per warpgroup, consumers, B_c, ring stages, setmaxnreg budgets."""
    (rows,) = parse("06_fa3_hopper/fa3_launch.h", r"kWarpgroupRows = (\d+);")
    (stages,) = parse("06_fa3_hopper/06d_fa3.cuh", r"kStages = (\d+);")
    prod, cons = parse("06_fa3_hopper/06b_warp_specialized.cuh",
                       r"kProducerRegs = (\d+);\s+static constexpr int kConsumerRegs = kConsumers == 3 \? \d+ : (\d+);")
    return dict(d=128, wg_rows=rows, consumers=fa3_by_d("consumer_warpgroups", 128),
                B_c=fa3_by_d("block_cols", 128), stages=stages, prod_regs=prod, cons_regs=cons)


def fa1_blocks(d, elem_bytes=2, smem=H100_SMEM_OPTIN):
    """04's choose_blocks (04_fa1_tiled/stages.cu) with SmemLayout's constants from fa1_tiled.cuh."""
    rel = "04_fa1_tiled/fa1_tiled.cuh"
    tile, skew16, skew32, align, vectors = (parse(rel, rf"{n} = (\d+);")[0] for n in
                                            ("kTile", "kSkew16", "kSkew32", "kSmemAlign", "kRowVectors"))

    def up(b):
        return (b + align - 1) // align * align

    def smem_bytes(Br, Bc):
        ld_qkv, ld_p, ld_s = d + skew16, Bc + skew16, max(Bc, d) + skew32
        return (2 * up(Bc * ld_qkv * elem_bytes) + up(Br * ld_qkv * elem_bytes) + up(Br * ld_p * elem_bytes)
                + up(Br * ld_s * 4) + vectors * up(Br * 4))

    M = smem // elem_bytes
    per_block = (M + 4 * d - 1) // (4 * d)
    Bc, Br = per_block // tile * tile, min(per_block, d) // tile * tile
    while Br >= tile and Bc >= tile and smem_bytes(Br, Bc) > smem:
        if Bc >= Br:
            Bc -= tile
        else:
            Br -= tile
    return Br, Bc


# hbm_model.cpp, for one head without a mask (e = bytes per element of Q, K, V, O, P; S fp32)
def hbm_qkvo(N, d, e=2):
    return e * 4.0 * N * d  # Q, K, V read once and O written once (min_bytes)


def hbm_score_pipeline(N, d, softmax_reads, e=2):
    S = float(N) * N
    gemms = e * (2.0 * N * d + 2.0 * N * d) + 4.0 * S + e * S  # Q, O, K, V; S written; P read
    return gemms + 4.0 * S * softmax_reads + e * S  # softmax_bytes: S read per pass, P written


# ---------------------------------------------------------------- the reference run's timeline


def timeline_sections(path):
    """(first line, section) of each blank-line-separated section of a tile_timeline log."""
    for section in path.read_text().split("\n\n"):
        if section.strip():
            yield section.splitlines()[0], section


def tile_timeline(kernel, n):
    """Consumer warpgroups' marks of the middle K/V block, in cycles from consumer 1's
    block_begin: consumer 1's from the step medians (summed in order), consumer 2's as
    printed. Returns (marks1, marks2, header line)."""
    for head, section in timeline_sections(REF / "tile_timeline.txt"):
        if head.startswith(kernel) and f"N = {n} " in head:
            steps = re.findall(r"^  (\S.*?)\s{2,}[\d.]+ us\s+\((\d+) cycles\)", section, re.M)
            names = ["K_j ready", "the turn", "issue S_ij", "V_j-1 ready, issue P V_j-1",
                     "S_ij = Q_i K_j^T lands", "softmax of S_ij, P V_j-1 lands", "rescale O_i, P_ij -> operand"]
            cyc = dict(steps)
            marks1 = np.cumsum([0] + [int(cyc[s]) for s in names])
            marks2 = [int(v) for v in re.findall(r"^  [a-z_]+\s+(\d+)$", section, re.M)]
            if len(marks2) != len(marks1):
                raise RuntimeError(f"tile_timeline.txt: {kernel} N = {n}: expected {len(marks1)} marks")
            return marks1, np.array(marks2), head
    raise RuntimeError(f"tile_timeline.txt has no {kernel} N = {n} section")


# ---------------------------------------------------------------- drawing helpers

C_GEMM, C_SOFT, C_WAIT, C_LOAD, C_HBM, C_SMEM = "#4c72b0", "#dd8452", "#d9d9d9", "#55a868", "#c44e52", "#8172b3"


def save(fig, path):
    """Write the figure as a 256-colour PNG (a third of the size of full colour, the same to read)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    fig.savefig(buf, dpi=DPI, bbox_inches="tight", facecolor="white")
    plt.close(fig)
    buf.seek(0)
    Image.open(buf).convert("RGB").quantize(colors=256).save(path, optimize=True)


def box(ax, x, y, w, h, text="", color="white", fs=9, tc="black", **kw):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor=kw.pop("ec", "black"), lw=kw.pop("lw", 1), **kw))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fs, color=tc)


def arrow(ax, a, b, color="black", text=None, fs=8, style="-|>", **kw):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle=style, mutation_scale=12, color=color, lw=1.3, **kw))
    if text:
        ax.text((a[0] + b[0]) / 2, (a[1] + b[1]) / 2, text, fontsize=fs, color=color, ha="center", va="bottom")


def blank(ax, xlim, ylim):
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.set_aspect("equal")
    ax.axis("off")


def gantt(ax, rows, title=None, xlabel="cycles"):
    """rows: list of (label, [(start, length, color, text)]) drawn top to bottom."""
    for k, (label, bars) in enumerate(rows):
        y = len(rows) - 1 - k
        for start, length, color, text in bars:
            ax.broken_barh([(start, length)], (y - 0.38, 0.76), facecolors=color, edgecolor="black", lw=0.6)
            if text:
                ax.text(start + length / 2, y, text, ha="center", va="center", fontsize=7.5)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r[0] for r in reversed(rows)], fontsize=9)
    ax.set_xlabel(xlabel)
    ax.grid(axis="x", alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)


# ---------------------------------------------------------------- 01, 02, 03


@figure("01_naive/figures/hbm_bytes_vs_n.png")
def fig_01(path):
    d = 128
    N = np.array([512, 1024, 2048, 4096, 8192, 16384, 32768])
    qkvo = hbm_qkvo(N, d)
    total = np.array([hbm_score_pipeline(n, d, softmax_reads=2) for n in N])  # 01: sum, then normalize
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ax.loglog(N, total / 1e6, "o-", color=C_HBM, label="01_naive total: S, P written and read (N² terms)")
    ax.loglog(N, qkvo / 1e6, "s-", color=C_GEMM, label="Q, K, V read + O written (4·N·d·2 bytes)")
    for n, t, q in zip(N, total, qkvo):
        if n in (1024, 16384):
            ax.annotate(f"{t / q:.0f}×", (n, np.sqrt(t * q) / 1e6), ha="center", fontsize=9)
            ax.plot([n, n], [q / 1e6, t / 1e6], ":", color="gray")
    ax.set_xscale("log", base=2)
    ax.set_xticks(N)
    ax.set_xticklabels([f"{n // 1024}k" if n >= 1024 else str(n) for n in N])
    ax.set_xlabel("sequence length N (Nq = Nk)")
    ax.set_ylabel("HBM bytes per head (MB)")
    ax.set_title("01: what S and P cost in HBM, one head, d = 128, bf16 (hbm_model.cpp)", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3, which="both")
    save(fig, path)


def softmax_reads(rung):
    """How many times a rung's softmax streams S (its stages.cu: make_stage's softmax_reads)."""
    return parse(f"{rung}/stages.cu", r"/\*softmax_reads=\*/(\d+)")[0]


@figure("02_safe_softmax/figures/softmax_passes.png")
def fig_02(path):
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw=dict(width_ratios=[1, 1.2], wspace=0.55))
    s = np.linspace(60, 100, 9)  # one row of large scores
    m = s.max()
    fp32_max = float(np.finfo(np.float32).max)
    with np.errstate(over="ignore"):
        naive = np.exp(s.astype(np.float32))
    finite = np.isfinite(naive)
    a.semilogy(s[finite], naive[finite], "o-", color=C_HBM, label="e^s (01): inf past s = %.1f" % np.log(fp32_max))
    a.plot(s[~finite], np.full((~finite).sum(), 1e40), "x", color=C_HBM, ms=9, label="inf → P = inf/inf = NaN")
    a.semilogy(s, np.exp(s - m), "o-", color=C_LOAD, label="e^(s − m) (02): ≤ 1, m = row max")
    a.axhline(fp32_max, color="black", ls="--", lw=0.8)
    a.text(60, fp32_max * 8, "largest fp32 ≈ 3.4e38 (bf16 alike)", fontsize=8)
    a.set_ylim(1e-20, 1e44)
    a.set_xlabel("score s (one row)")
    a.set_title("why subtract the max", fontsize=10)
    a.legend(fontsize=7.5, loc="center", bbox_to_anchor=(0.55, 0.45))
    # HBM bytes per pass for one head at N = 4096: softmax_bytes (hbm_model.cpp)
    N, e = 4096, 2
    S = float(N) * N
    reads02, reads01 = softmax_reads("02_safe_softmax"), softmax_reads("01_naive")
    names = ["m = rowmax S", "ℓ = Σ e^(S − m)", "P = e^(S − m) / ℓ"][-reads02:]
    passes = [(f"pass {k + 1}: {n}", 4 * S, e * S if k == reads02 - 1 else 0) for k, n in enumerate(names)]
    y = np.arange(len(passes))[::-1]
    b.barh(y, [p[1] / 1e6 for p in passes], color=C_SMEM, label="read S (fp32)")
    b.barh(y, [p[2] / 1e6 for p in passes], left=[p[1] / 1e6 for p in passes], color=C_HBM, label="write P (bf16)")
    b.set_yticks(y)
    b.set_yticklabels([p[0] for p in passes], fontsize=9)
    tot02 = sum(p[1] + p[2] for p in passes)
    tot01 = reads01 * 4 * S + e * S
    b.set_xlabel("HBM MB per head, N = 4096 (softmax_bytes, hbm_model.cpp)")
    b.set_title(f"02's softmax: {reads02} passes over S, {tot02 / 1e6:.0f} MB\n(01: {reads01} passes, {tot01 / 1e6:.0f} MB)",
                fontsize=10)
    b.legend(fontsize=8, loc="lower right")
    b.set_xlim(0, 130)
    save(fig, path)


@figure("03_online_softmax/figures/online_merge.png")
def fig_03(path):
    rng = np.random.default_rng(3)
    s_a = rng.normal(0.0, 0.6, 8)  # block a: keys 0..7
    s_b = rng.normal(0.9, 0.6, 8)  # block b: keys 8..15, larger scores
    v = rng.normal(0, 1, 16)       # one column of V
    m_a, m_b = s_a.max(), s_b.max()
    p_a, p_b = np.exp(s_a - m_a), np.exp(s_b - m_b)
    l_a, l_b = p_a.sum(), p_b.sum()
    o_a, o_b = p_a @ v[:8], p_b @ v[8:]
    m = max(m_a, m_b)
    w_a, w_b = np.exp(m_a - m), np.exp(m_b - m)
    merged = np.concatenate([w_a * p_a, w_b * p_b])
    full = np.exp(np.concatenate([s_a, s_b]) - m)
    assert np.allclose(merged, full)
    keys = np.arange(16)
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), gridspec_kw=dict(wspace=0.3))
    ax = axes[0]
    ax.bar(keys[:8], s_a, color=C_GEMM)
    ax.bar(keys[8:], s_b, color=C_SOFT)
    ax.hlines([m_a], -0.5, 7.5, color=C_GEMM, ls="--")
    ax.hlines([m_b], 7.5, 15.5, color=C_SOFT, ls="--")
    ax.text(3.5, m_a + 0.15, f"m_a = {m_a:.2f}", ha="center", fontsize=8, color=C_GEMM)
    ax.text(11.5, m_b + 0.15, f"m_b = {m_b:.2f}", ha="center", fontsize=8, color=C_SOFT)
    ax.set_title("scores of one row: block a, block b", fontsize=10)
    ax.set_xlabel("key")
    ax.set_ylim(min(s_a.min(), s_b.min()) - 0.3, m_b + 0.8)
    ax = axes[1]
    ax.bar(keys[:8], p_a, color=C_GEMM)
    ax.bar(keys[8:], p_b, color=C_SOFT)
    ax.set_title("each block alone: e^(s − own max)", fontsize=10)
    ax.text(3.5, 1.08, f"ℓ_a = {l_a:.2f}\nO_a = {o_a:.2f}", ha="center", fontsize=8, color=C_GEMM)
    ax.text(11.5, 1.08, f"ℓ_b = {l_b:.2f}\nO_b = {o_b:.2f}", ha="center", fontsize=8, color=C_SOFT)
    ax.set_ylim(0, 1.35)
    ax.set_xlabel("key")
    ax = axes[2]
    ax.bar(keys[:8], w_a * p_a, color=C_GEMM)
    ax.bar(keys[8:], w_b * p_b, color=C_SOFT)
    ax.plot(keys, full, "k.", label="e^(s − m) of the whole row")
    ax.set_title(f"merged: (m_a, ℓ_a, O_a) ⊕ (m_b, ℓ_b, O_b)\nblock a × e^(m_a − m) = {w_a:.2f}, block b × e^(m_b − m) = {w_b:.2f}", fontsize=9.5)
    fig.text(0.5, -0.1, f"m = max(m_a, m_b) = {m:.2f};   ℓ = e^(m_a−m)·ℓ_a + e^(m_b−m)·ℓ_b = {w_a:.2f}·{l_a:.2f} + {w_b:.2f}·{l_b:.2f}\n"
            f"O = e^(m_a−m)·O_a + e^(m_b−m)·O_b;   O / ℓ = {(w_a * o_a + w_b * o_b) / (w_a * l_a + w_b * l_b):.3f}, the softmax of the whole row "
             f"times V (O: one column of V, drawn at random)", ha="center", va="top", fontsize=9)
    ax.set_ylim(0, 1.35)
    ax.legend(fontsize=7.5, loc="upper right")
    ax.set_xlabel("key")
    save(fig, path)


# ---------------------------------------------------------------- 04 vs 05: who owns which tile


@figure("04_fa1_tiled/figures/loop_order_04_vs_05.png")
def fig_04(path):
    d = 128
    Br4, Bc4 = fa1_blocks(d)
    Br5, Bc5, warps, _ = fa2_tile(d)
    N = int(np.lcm.reduce([Br4, Bc4, Br5, Bc5]))  # whole blocks in both
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 5.2))
    for ax, Br, Bc, title in ((a, Br4, Bc4, f"04 (FA1): one CTA per (b, h); K/V blocks outer\nB_r = {Br4}, B_c = {Bc4} (choose_blocks, 227 KiB smem)"),
                              (b, Br5, Bc5, f"05 (FA2): one CTA per (Q block, b, h); Q block outer\nB_r = {Br5}, B_c = {Bc5}, {warps} warps split the rows (TileFor<{d}>)")):
        Tr, Tc = -(-N // Br), -(-N // Bc)
        W, H = 8.0, 8.0  # drawing size of the N x N score matrix
        cw, rh = W * Bc / N, H * Br / N
        cmap = plt.get_cmap("tab10")
        for i in range(Tr):
            for j in range(Tc):
                x, y = j * cw, H - (i + 1) * rh
                w, h = min(cw, W - x), rh if (i + 1) * Br <= N else H - i * rh
                y = H - i * rh - h
                if ax is a:
                    step, color = j * Tr + i + 1, "#e8eef8"
                else:
                    step, color = j + 1, matplotlib.colors.to_rgba(cmap(i % 10), 0.35)
                box(ax, x, y, w, h, str(step), color=color, fs=7 if Tc > 10 else 8)
        ax.text(W / 2, H + 0.25, f"N = {N} keys (K_j, V_j): T_c = {Tc} blocks of B_c", ha="center", fontsize=9)
        ax.text(-0.3, H / 2, f"N queries (Q_i): T_r = {Tr} blocks of B_r", rotation=90, ha="center", va="center", fontsize=9)
        ax.set_title(title, fontsize=10)
        blank(ax, (-0.8, W + 3.2), (-2.2, H + 0.8))
        if ax is a:
            arrow(ax, (0.2, -0.3), (W - 0.2, -0.3))
            ax.text(W / 2, -0.4, "outer: j (K_j, V_j loaded once)", ha="center", va="top", fontsize=8.5)
            arrow(ax, (W + 0.3, H - 0.2), (W + 0.3, 0.2))
            ax.text(W + 0.5, H / 2, "inner: i\neach step reads Q_i,\nO_i, ℓ_i, m_i from HBM\nand writes O_i, ℓ_i, m_i\nback",
                    fontsize=8.5, va="center", color=C_HBM)
            ax.text(W / 2, -1.9, "numbers: the order of the steps, all in ONE CTA\n"
                    "(B·H CTAs in all: a (b, h) per SM at most)", ha="center", fontsize=8.5)
        else:
            arrow(ax, (0.2, -0.3), (W - 0.2, -0.3))
            ax.text(W / 2, -0.4, "inner: j (K_j, V_j streamed through shared memory)", ha="center", va="top", fontsize=8.5)
            ax.text(W + 0.3, H / 2, "one colour = one CTA,\nall rows in parallel;\nO_i, ℓ_i, m_i stay in\nregisters, written once\n\n"
                    f"T_r × B·H = {Tr} × B·H CTAs", fontsize=8.5, va="center", color=C_GEMM)
            ax.text(W / 2, -1.9, "numbers: the step j inside each CTA", ha="center", fontsize=8.5)
    save(fig, path)


# ---------------------------------------------------------------- 05


@figure("05_fa2_reordered/figures/warps_split_rows.png")
def fig_05_warps(path):
    d = 128
    Br, Bc, warps, _ = fa2_tile(d)
    rows = Br // warps
    fig, ax = plt.subplots(figsize=(10, 4.2))
    sc = 4.0 / Br  # drawing units per row
    cmap = plt.get_cmap("tab10")
    x = 0
    for name, width in ((f"Q_i  [{Br} × d]", d), (f"S_ij, P_ij  [{Br} × B_c]", Bc), (f"O_i  [{Br} × d]", d)):
        w = width * sc
        for k in range(warps):
            box(ax, x, 4 - (k + 1) * rows * sc, w, rows * sc, f"warp {k}\nrows {k * rows}..{(k + 1) * rows - 1}",
                color=matplotlib.colors.to_rgba(cmap(k), 0.35), fs=8)
        ax.text(x + w / 2, 4.2, name, ha="center", fontsize=9)
        x += w + 0.9
    kx = x + 0.3
    box(ax, kx, 2.2, d * sc, Bc * sc * 0.6, f"K_j  [B_c = {Bc} × d]\nshared memory", color="#eeeeee", fs=8)
    box(ax, kx, 0.0, d * sc, Bc * sc * 0.6, f"V_j  [B_c × d]\nshared memory", color="#eeeeee", fs=8)
    ax.text(kx + d * sc / 2, 4.2, "read by every warp", ha="center", fontsize=9)
    ax.set_title(f"05 (TileFor<{d}>): {warps} warps split the B_r = {Br} rows; each warp's S, P and O rows stay in "
                 "its registers, and each reads all of K_j, V_j", fontsize=10)
    blank(ax, (-0.2, kx + d * sc + 0.3), (-0.2, 4.5))
    save(fig, path)


@figure("05_fa2_reordered/figures/swizzle.png")
def fig_05_swizzle(path):
    period = fa2_swizzle()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
    cmap = plt.get_cmap("tab10")
    for ax, swz in ((axes[0], False), (axes[1], True)):
        hit = []
        for r in range(period):
            for c in range(8):  # chunk c of row r stored at bank group c ^ (r % 8)
                g = (c ^ (r % period)) if swz else c
                read = c == 0
                box(ax, g, period - 1 - r, 1, 1, f"c{c}", color=matplotlib.colors.to_rgba(cmap(r % 10), 0.85 if read else 0.12),
                    fs=8, tc="white" if read else "black", lw=2 if read else 0.5)
                if read:
                    hit.append(g)
            ax.text(-0.3, period - 0.5 - r, f"row {r}", ha="right", va="center", fontsize=8)
        for g in range(8):
            ax.text(g + 0.5, period + 0.2, str(g), ha="center", fontsize=8)
        ax.text(4, period + 0.8, "bank group (16 bytes = 4 banks)", ha="center", fontsize=8.5)
        groups = len(set(hit))
        ax.set_title(("swizzled: chunk c of row r at c ^ (r % 8)" if swz else "unswizzled: chunk c at c") +
                     f"\nldmatrix reads chunk 0 of 8 rows: {groups} bank group{'s' if groups > 1 else ''}, "
                     + ("no conflict" if groups == 8 else f"{8 // groups}-way conflict"), fontsize=10)
        blank(ax, (-1.3, 8.2), (-0.2, period + 1.6))
    fig.suptitle("SwizzledRows (fa2_tiles.h), one 128-byte line per 8 chunks of 16 bytes (8 bf16): where row r's chunks sit",
                 fontsize=10, y=1.04)
    save(fig, path)


@figure("05_fa2_reordered/figures/cp_async_ring.png")
def fig_05_ring(path):
    """05's two load schedules (README 3.4) in schematic time units: a K or V copy takes 0.5,
    S = Q K_jᵀ 0.5, softmax and P V together 1.1."""
    copy, gemm_s, rest, blocks = 0.5, 0.5, 1.1, 4
    fig, axes = plt.subplots(2, 1, figsize=(10, 4.4), gridspec_kw=dict(hspace=0.7))
    for ax, d in zip(axes, (128, 256)):
        _, _, _, stages = fa2_tile(d)
        loads, comp = [], []
        if stages >= 2:  # wait K_j, V_j | sync | issue K_j+1, V_j+1 -> other buffer | S | softmax | PV
            ready = 2 * copy  # K_0, V_0 issued at 0
            loads.append((0, 2 * copy, C_LOAD, "K,V 0 → buf 0"))
            t = 0.0
            for j in range(blocks):
                t = max(t, ready)
                if j + 1 < blocks:
                    loads.append((t, 2 * copy, C_LOAD, f"K,V {j + 1} → buf {(j + 1) % stages}"))
                    ready = t + 2 * copy
                comp.append((t, gemm_s + rest, C_GEMM, f"j = {j}: S, softmax, PV"))
                t += gemm_s + rest
            title = f"d = {d}: kStages = {stages}, a ring: block j + 1 copies into the other buffer while block j computes"
        else:  # wait K_j | sync | issue V_j | S | wait V_j | sync | issue K_j+1 | softmax | PV
            k_ready = copy
            loads.append((0, copy, C_LOAD, "K_0"))
            t = 0.0
            for j in range(blocks):
                t = max(t, k_ready)
                loads.append((t, copy, C_LOAD, f"V_{j}"))
                v_ready = t + copy
                comp.append((t, gemm_s, C_GEMM, f"S_{j}"))
                t = max(t + gemm_s, v_ready)
                if j + 1 < blocks:
                    loads.append((t, copy, C_LOAD, f"K_{j + 1}"))
                    k_ready = t + copy
                comp.append((t, rest, C_SOFT, f"softmax, PV"))
                t += rest
            title = f"d = {d}: kStages = {stages} (FA2's split schedule): V_j copies under S, K_j+1 under the softmax and P V"
        gantt(ax, [("cp.async in flight", loads), ("warps compute", comp)], xlabel="time (schematic)")
        ax.set_xticks([])
        ax.set_title(title, fontsize=9.5)
        ax.set_xlim(0, 7.6)
    fig.suptitle("05's load schedules (stages from TileFor<d> in fa2_tiles.h)", fontsize=10, y=1.0)
    save(fig, path)


def lpt_schedule(costs, order, sms):
    """Greedy list schedule: each unit (in `order`) starts on the SM free earliest."""
    free = np.zeros(sms)
    placed = []
    for u in order:
        s = int(np.argmin(free))
        placed.append((s, free[s], costs[u], u))
        free[s] += costs[u]
    return placed, free.max()


def tile_at(m_blocks, heads, heads_per_section, unit):
    """common/tile_order.h: tile_at."""
    per_section = heads_per_section * m_blocks
    section = unit // per_section
    first = section * heads_per_section
    here = min(heads - first, heads_per_section)
    r = unit - section * per_section
    return first + r % here, m_blocks - 1 - r // here


def lazy_rescales(scores_log2, B_c, threshold):
    """One row's scores (log2 units) in blocks of B_c keys: the running max per block, the m_i
    the lazy rule keeps (moved only when the max has grown by more than `threshold`), and how
    many times O_i is rescaled lazily and when rescaling on any growth."""
    block_max = np.maximum.accumulate(scores_log2.reshape(-1, B_c).max(axis=1))
    ref, lazy, refs = block_max[0], 0, []
    for mx in block_max:
        if mx - ref > threshold:
            ref, lazy = mx, lazy + 1
        refs.append(ref)
    return block_max, refs, lazy, int(np.sum(np.diff(block_max) > 0))


@figure("05_fa2_reordered/figures/causal_order_lazy_rescale.png")
def fig_05_causal_lazy(path):
    m_blocks, heads, sms, per_section = 8, 3, 5, 3
    costs = {(h, m): m + 1 for h in range(heads) for m in range(m_blocks)}  # Q block m sees m + 1 K/V blocks
    naive = [(h, m) for h in range(heads) for m in range(m_blocks)]
    lpt = [tile_at(m_blocks, heads, per_section, u) for u in range(heads * m_blocks)]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), gridspec_kw=dict(width_ratios=[1, 1, 1.25]))
    cmap = plt.get_cmap("tab10")
    for ax, order, title in ((axes[0], naive, "Q block 0 first, head after head"),
                             (axes[1], lpt, "longest first (tile_at, common/tile_order.h)")):
        placed, span = lpt_schedule(costs, order, sms)
        for s, t, c, (h, m) in placed:
            ax.broken_barh([(t, c)], (s - 0.4, 0.8), facecolors=matplotlib.colors.to_rgba(cmap(h), 0.3 + 0.7 * m / m_blocks),
                           edgecolor="black", lw=0.5)
            ax.text(t + c / 2, s, f"{m}", ha="center", va="center", fontsize=7)
        ax.axvline(span, color=C_HBM, ls="--")
        ax.set_title(f"{title}\nlast SM done at {span:.0f} (ideal {sum(costs.values()) / sms:.1f})", fontsize=9.5)
        ax.set_xlabel("K/V blocks of work")
        ax.set_yticks(range(sms))
        ax.set_yticklabels([f"SM {s}" for s in range(sms)], fontsize=8)
    fig.text(0.33, -0.04, f"causal mask: Q block m (the label) sees m + 1 K/V blocks; {heads} heads (colours), {sms} SMs, "
             "each SM takes the next tile when it is free", ha="center", fontsize=8.5)
    # lazy rescaling on one row of scores
    thr = fa2_rescale_log2()
    Bc = fa2_tile(128)[1]
    rng = np.random.default_rng(0)
    n_keys = 64 * Bc
    log2e = 1.0 / np.log(2)
    ax = axes[2]
    for label, s, color in (("N(0,1) scores", rng.normal(0, 1, n_keys) * log2e, C_GEMM),
                            ("scores climbing along the keys", (rng.normal(0, 1, n_keys) + np.linspace(0, 12, n_keys)) * log2e, C_SOFT)):
        block_max, refs, lazy, eager = lazy_rescales(s, Bc, thr)  # eager: O_i rescaled whenever the max grows
        jj = np.arange(len(block_max))
        ax.plot(jj, block_max, color=color, label=f"{label}: running max")
        ax.step(jj, refs, where="post", color=color, ls="--", lw=1,
                label=f"m used: rescales {lazy} (lazy) vs {eager} (max grew) of {len(jj) - 1}")
    ax.set_xlabel(f"K/V block j (B_c = {Bc})")
    ax.set_ylabel("row max (log2 units)")
    ax.set_title(f"lazy rescaling: O_i *= α only when the max grows > {thr:g}", fontsize=9.5)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save(fig, path)


@figure("05_fa2_reordered/figures/backward_gemms.png")
def fig_05_backward(path):
    src = source("05_fa2_reordered/fa2_backward.cuh")
    for name in ("rowsum(dO", "dS"):
        if name not in src:
            raise RuntimeError(f"fa2_backward.cuh no longer mentions {name}: update scripts/figures.py")
    fig, ax = plt.subplots(figsize=(10.5, 4.6))
    blank(ax, (0, 21.5), (-0.3, 9.2))
    inp = dict(color="#eeeeee", fs=9)
    box(ax, 0.2, 7.2, 2.2, 1, "Q_i, K_j", **inp)
    box(ax, 0.2, 5.2, 2.2, 1, "L_i (lse)", **inp)
    box(ax, 0.2, 3.2, 2.2, 1, "dO_i, V_j", **inp)
    box(ax, 0.2, 0.6, 2.2, 1, "dO_i, O_i", **inp)
    box(ax, 4, 0.4, 4.2, 1.4, "pre-pass:\nD_i = rowsum(dO_i ∘ O_i)", color="#f3d9a4", fs=8)
    box(ax, 4, 7.0, 4.2, 1.4, "① S_ij = Q_i K_jᵀ\nP_ij = exp(S_ij − L_i)", color=C_GEMM, tc="white")
    box(ax, 4, 3.0, 4.2, 1.4, "③ dP_ij = dO_i V_jᵀ", color=C_GEMM, tc="white")
    box(ax, 10, 5.0, 4.6, 1.4, "dS_ij = P_ij ∘ (dP_ij − D_i)", color=C_SOFT)
    box(ax, 10, 7.0, 4.6, 1.4, "② dV_j += P_ijᵀ dO_i", color=C_GEMM, tc="white")
    box(ax, 16.3, 6.0, 4.4, 1.4, "④ dK_j += dS_ijᵀ Q_i", color=C_GEMM, tc="white")
    box(ax, 16.3, 3.6, 4.4, 1.4, "⑤ dQ_i += dS_ij K_j", color=C_GEMM, tc="white")
    arrow(ax, (2.4, 7.7), (4, 7.7))
    arrow(ax, (2.4, 5.7), (4.3, 7.0))
    arrow(ax, (2.4, 3.7), (4, 3.7))
    arrow(ax, (2.4, 1.1), (4, 1.1))
    arrow(ax, (8.2, 7.7), (10, 7.7), text="P")
    arrow(ax, (8.2, 7.3), (10.3, 6.4), text="P")
    arrow(ax, (8.2, 3.7), (10.3, 5.0), text="dP")
    arrow(ax, (8.2, 1.1), (12.3, 5.0), color=C_HBM)
    arrow(ax, (14.6, 5.9), (16.3, 6.6), text="dS")
    arrow(ax, (14.6, 5.5), (16.3, 4.4), text="dS")
    ax.text(9.6, 1.3, "D_i (one number per row) = Σ_k P_ik dP_ik = rowsum(dO_i ∘ O_i):\nthe softmax's Jacobian, computed once per row\n"
            "from O, so no pass over all keys is needed", fontsize=8.5, color=C_HBM, va="top")
    ax.text(16.3, 9.0, "one CTA per (K/V block, head):\ndK_j, dV_j in registers over all i;\ndQ_i summed across CTAs", fontsize=8.5, va="top")
    ax.set_title("05's backward (fa2_backward.cuh): five GEMMs (blue) per (i, j) block pair, and where D enters", fontsize=10)
    save(fig, path)


# ---------------------------------------------------------------- 06: schematics


@figure("06_fa3_hopper/figures/producer_consumer_ring.png")
def fig_06_ring(path):
    c = fa3_config()
    fig, ax = plt.subplots(figsize=(11, 5))
    ax.set_xlim(0, 24)
    ax.set_ylim(-0.6, 10)
    ax.axis("off")
    box(ax, 0.3, 3.2, 5.0, 3.8, f"producer warpgroup\n(setmaxnreg.dec {c['prod_regs']})\n\nwarp 0, lane 0 issues\n"
        f"every TMA copy:\nQ_i, then K_j, V_j\ninto stage j mod {c['stages']}", color="#e4f1e6", fs=8.5)
    rx, rw = 8.2, 4.4
    slot_y = []
    for s in range(c["stages"]):
        y = 6.6 - s * 3.6
        slot_y.append(y)
        box(ax, rx, y, rw, 0.9, f"K stage {s}: [B_c = {c['B_c']}] × d", color="#eeeeee", fs=8)
        box(ax, rx, y - 1.0, rw, 0.9, f"V stage {s}: [B_c] × d", color="#eeeeee", fs=8)
        ax.text(rx + rw / 2, y + 1.05, f"mbarriers full[{s}], empty[{s}]", ha="center", fontsize=7.5, color=C_HBM)
    ax.text(rx + rw / 2, 9.3, f"shared memory: a ring of {c['stages']} stages", ha="center", fontsize=9)
    cons_y = []
    for k in range(c["consumers"]):
        y = 6.2 - k * 3.6
        cons_y.append(y)
        box(ax, 15.2, y, 8.5, 2.3, f"consumer warpgroup {k + 1} (setmaxnreg.inc {c['cons_regs']})\n"
            f"query rows {k * c['wg_rows']}..{(k + 1) * c['wg_rows'] - 1} of Q_i\n"
            "S = Q_i K_jᵀ (wgmma SS), softmax,\nO_i += P V_j (wgmma RS, P in registers)", color="#e6ecf6", fs=8)
    for y in slot_y:
        arrow(ax, (5.3, 5.1), (rx, y + 0.45), color=C_LOAD)
    ax.text(6.7, 7.6, "TMA copy;\nbytes land on full[s]", fontsize=7.5, color=C_LOAD, ha="center")
    for y in slot_y:  # every consumer reads every stage: its rows of Q_i against all of K_j, V_j
        for cy in cons_y:
            arrow(ax, (rx + rw, y), (15.2, cy + 1.15), color=C_GEMM)
    ax.text(13.9, 8.2, "wait full[s]; every\nconsumer's wgmma\nreads the stage", fontsize=7.5, color=C_GEMM, ha="center")
    arrow(ax, (19.4, cons_y[-1]), (2.8, 3.2), color=C_HBM, connectionstyle="arc3,rad=-0.25")
    ax.text(11, -0.5, "each consumer warp arrives on empty[s] once its GEMM has read the stage; "
            "the producer waits on empty[s] before it refills it", fontsize=8, color=C_HBM, ha="center")
    ax.set_title(f"06b–06d at d = {c['d']}: one producer warpgroup, {c['consumers']} consumer warpgroups "
                 f"(B_r = {c['consumers']} × {c['wg_rows']}), a {c['stages']}-stage K/V ring guarded by mbarriers", fontsize=10)
    save(fig, path)


def event_sim(consumers, blocks, gemm, soft, turns):
    """A two-resource model of 06a-06c: the tensor cores run one warpgroup's GEMM at a time, in
    the order requested; each warpgroup runs, per block, S GEMM -> softmax -> P V GEMM -> next
    block. With `turns` a warpgroup issues its S GEMM only while it holds the turn, which it
    passes on at the issue (06c's ping-pong)."""
    tc_free, turn = 0.0, 0
    req = [(0.0, "S")] * consumers  # each warpgroup's next request: (time, GEMM)
    done = [0] * consumers
    bars = {w: [] for w in range(consumers)}
    tc = []
    while min(done) < blocks:
        eligible = [w for w in range(consumers) if done[w] < blocks and (not turns or req[w][1] == "PV" or w == turn)]
        w = min(eligible, key=lambda w: (req[w][0], w))
        t, kind = req[w]
        start = max(t, tc_free)
        if start > t:
            bars[w].append((t, start - t, C_WAIT, ""))
        bars[w].append((start, gemm, C_GEMM, kind))
        tc.append((start, gemm, w))
        tc_free = start + gemm
        if kind == "S":
            bars[w].append((tc_free, soft, C_SOFT, "softmax"))
            req[w] = (tc_free + soft, "PV")
            turn = (w + 1) % consumers
        else:
            req[w] = (tc_free, "S")
            done[w] += 1
    return bars, tc, max(r[0] for r in req)


def step_durations():
    """GEMM cycles of one warpgroup's S or P V at d = 128 (FLOPs at the SM's dense rate) and
    the softmax's cycles as 06d measured them (tile_timeline: softmax + rescale steps)."""
    c = fa3_config()
    gemm = 2.0 * c["wg_rows"] * c["B_c"] * c["d"] / H100_FLOP_PER_CYCLE
    m1, _, _ = tile_timeline("06d", 4096)
    soft = float(m1[6] - m1[5] + m1[7] - m1[6])
    return c, gemm, soft


def schematic_timeline(path, consumers, turns, title, note):
    c, gemm, soft = step_durations()
    blocks = 4
    if consumers == 1:
        bars, tc, end = event_sim(1, blocks, gemm, soft, turns=False)
    else:
        bars, tc, end = event_sim(consumers, blocks, gemm, soft, turns)
    cmap = plt.get_cmap("tab10")
    rows = [(f"consumer WG {w + 1}" if consumers > 1 else "the warpgroup", bars[w]) for w in range(consumers)]
    rows.append(("tensor cores", [(s, g, matplotlib.colors.to_rgba(cmap(w), 0.6), f"WG{w + 1}") for s, g, w in tc]))
    fig, ax = plt.subplots(figsize=(10, 1.0 + 0.55 * len(rows)))
    gantt(ax, rows)
    busy = sum(g for _, g, _ in tc) / end
    ax.set_title(f"{title}: tensor cores busy {100 * busy:.0f} % of the time", fontsize=10)
    ax.annotate(note + f"\nGEMM = 2·64·{c['B_c']}·{c['d']} FLOP at {H100_FLOP_PER_CYCLE} FLOP/cycle ≈ {gemm:.0f} cycles; "
            f"softmax ≈ {soft:.0f} cycles (06d's, measured: tile_timeline.txt). Grey: waiting.", xy=(0, 0),
                xycoords="axes fraction", xytext=(0, -36), textcoords="offset points", fontsize=8, va="top")
    save(fig, path)


@figure("06_fa3_hopper/figures/06a_timeline.png")
def fig_06a(path):
    schematic_timeline(path, 1, False, "06a: one warpgroup, in order (a model)",
                       "Load, S, softmax, P V, wait: the tensor cores idle during every softmax.")


@figure("06_fa3_hopper/figures/06b_timeline.png")
def fig_06b(path):
    c = fa3_config()
    schematic_timeline(path, c["consumers"], False, f"06b: {c['consumers']} consumer warpgroups, no turns (a model)",
                       "Both start together; WG 2's first S waits for WG 1's, and from then on one's softmax runs under the other's GEMMs.")


@figure("06_fa3_hopper/figures/06c_timeline.png")
def fig_06c(path):
    c = fa3_config()
    schematic_timeline(path, c["consumers"], True, f"06c: {c['consumers']} consumers take turns issuing S (a model)",
                       "The turn orders the S GEMMs WG 1, WG 2, WG 1, ...: the schedule 06b fell into by itself (06c.md).")


def overlap_sim(consumers, blocks, gemm, soft):
    """06d1's intra-warpgroup overlap on top of 06c's turns: per block a warpgroup issues
    S_{j+1} and then P_j V_j back to back (the tensor cores run GEMMs in the order issued), runs
    the softmax of S_{j+1} as soon as it lands, while P_j V_j runs, and issues again once both
    are done. Returns (bars per warpgroup, tensor-core GEMMs, end)."""
    tc_free, turn = 0.0, 0
    t_next = [0.0] * consumers
    j = [0] * consumers  # next S block to issue
    bars = {w: [] for w in range(consumers)}
    tc = []
    while min(j) <= blocks:
        w = turn
        t = t_next[w]
        gemms = (["S"] if j[w] < blocks else []) + (["PV"] if j[w] > 0 else [])
        start = max(t, tc_free)
        s_end = pv_end = start
        for kind in gemms:
            tc.append((tc_free if tc_free > t else t, gemm, w))
            begin = tc[-1][0]
            tc_free = begin + gemm
            if kind == "S":
                s_end = tc_free
            else:
                pv_end = tc_free
        if start > t:
            bars[w].append((t, start - t, C_WAIT, ""))
        busy_end = pv_end
        if j[w] < blocks:
            if s_end > start:
                bars[w].append((start, s_end - start, "#b0c4e8", "S"))
            bars[w].append((s_end, soft, C_SOFT, "softmax"))
            busy_end = max(s_end + soft, pv_end)
            if pv_end > s_end + soft:
                bars[w].append((s_end + soft, pv_end - s_end - soft, C_WAIT, ""))
        t_next[w] = busy_end
        j[w] += 1
        turn = (w + 1) % consumers
    return bars, tc, max(t_next)


@figure("06_fa3_hopper/figures/06d1_overlap.png")
def fig_06d1(path):
    c, gemm, soft = step_durations()
    blocks = 4
    cmap = plt.get_cmap("tab10")
    fig, axes = plt.subplots(2, 1, figsize=(10, 5.4), sharex=True)
    for ax, (title, (bars, tc, end)) in zip(axes, (
            ("06c: S, softmax, P V in order inside each warpgroup",
             event_sim(c["consumers"], blocks, gemm, soft, turns=True)),
            ("06d1: S_{j+1} and P_j V_j issued together; the softmax of S_{j+1} runs under P_j V_j",
             overlap_sim(c["consumers"], blocks, gemm, soft)))):
        rows = [(f"consumer WG {w + 1}", bars[w]) for w in range(c["consumers"])]
        rows.append(("tensor cores", [(s, g, matplotlib.colors.to_rgba(cmap(w), 0.6), f"WG{w + 1}") for s, g, w in tc]))
        gantt(ax, rows)
        busy = sum(g for _, g, _ in tc) / end
        ax.set_title(f"{title}\n{blocks} K/V blocks in {end:.0f} cycles, tensor cores busy {100 * busy:.0f} % (a model)",
                     fontsize=9.5)
    axes[1].annotate(f"GEMM = 2·64·{c['B_c']}·{c['d']} FLOP at {H100_FLOP_PER_CYCLE} FLOP/cycle ≈ {gemm:.0f} cycles; "
                     f"softmax ≈ {soft:.0f} cycles (06d's, measured: tile_timeline.txt). Grey: waiting; light blue: S running.",
                     xy=(0, 0), xycoords="axes fraction", xytext=(0, -36), textcoords="offset points", fontsize=8, va="top")
    fig.tight_layout()
    save(fig, path)


def fa3_bwd_config():
    """06e_bwd_wgmma.cuh's Config: keys per consumer warpgroup, consumers, B_r, ring stages."""
    rel = "06_fa3_hopper/06e_bwd_wgmma.cuh"
    (consumers,) = parse(rel, r"kConsumers = (\d+);")
    (b_r,) = parse(rel, r"B_r = (\d+);")
    (stages,) = parse(rel, r"kStages = (\d+);")
    return dict(wg_keys=64, consumers=consumers, B_c=64 * consumers, B_r=b_r, stages=stages)


@figure("06_fa3_hopper/figures/06e_bwd_operands.png")
def fig_06e(path):
    c = fa3_bwd_config()
    fig, ax = plt.subplots(figsize=(11.5, 5.6))
    blank(ax, (0, 23), (-0.8, 10.2))
    sm = dict(color="#ece6f4", fs=8)
    ax.text(2.6, 9.7, "shared memory", ha="center", fontsize=9, color=C_SMEM)
    box(ax, 0.2, 8.2, 4.8, 0.9, f"K_j [{c['B_c']} keys × d]  TMA, once", **sm)
    box(ax, 0.2, 7.0, 4.8, 0.9, f"V_j [{c['B_c']} keys × d]  TMA, once", **sm)
    box(ax, 0.2, 5.2, 4.8, 0.9, f"Q_i [{c['B_r']} queries × d]  ring", **sm)
    box(ax, 0.2, 4.0, 4.8, 0.9, f"dO_i [{c['B_r']} × d]  ring", **sm)
    box(ax, 0.2, 2.8, 4.8, 0.9, f"L_i, D_i [{c['B_r']}]  ring ({c['stages']} stages)", **sm)
    box(ax, 0.2, 0.6, 4.8, 1.2, f"dSᵀ [{c['wg_keys']} keys × {c['B_r']} queries]\nper warpgroup", **sm)
    ax.text(10.2, 9.7, "wgmma, per consumer warpgroup (M = its 64 keys)", ha="center", fontsize=9, color=C_GEMM)
    g = dict(color=C_GEMM, tc="white", fs=8)
    box(ax, 7.2, 8.2, 6, 0.9, "① Sᵀ = K_j Q_iᵀ      SS, both K-major", **g)
    box(ax, 7.2, 7.0, 6, 0.9, "② dPᵀ = V_j dO_iᵀ    SS, both K-major", **g)
    box(ax, 7.2, 5.2, 6, 0.9, "③ dV_j += Pᵀ dO_i    RS, B N-major", **g)
    box(ax, 7.2, 4.0, 6, 0.9, "④ dK_j += dSᵀ Q_i    RS, B N-major", **g)
    box(ax, 7.2, 0.6, 6, 1.2, "⑤ dQ_i = dS K_j      SS, A M-major (dSᵀ),\nB N-major (K_j as stored)", **g)
    ax.text(18.6, 9.7, "registers (fp32 accumulators, A fragments)", ha="center", fontsize=9)
    r = dict(color="#e6ecf6", fs=8)
    box(ax, 15.4, 8.2, 6.6, 0.9, "Pᵀ = exp2(Sᵀ·scale·log2e − L_i·log2e)", **r)
    box(ax, 15.4, 7.0, 6.6, 0.9, "dSᵀ = Pᵀ ∘ (dPᵀ − D_i)", color=C_SOFT, fs=8)
    box(ax, 15.4, 4.6, 6.6, 0.9, "dV_j, dK_j: d/2 + d/2 per thread, all steps", **r)
    box(ax, 15.4, 0.6, 6.6, 1.2, "dQ_i (fp32) → red.global.add.v2\n→ dQ_acc in HBM (order varies)", color="#f4dcdc", fs=8)
    arrow(ax, (5.0, 8.65), (7.2, 8.65), color=C_GEMM)
    arrow(ax, (5.0, 5.65), (7.2, 8.45), color=C_GEMM)
    arrow(ax, (5.0, 7.45), (7.2, 7.45), color=C_GEMM)
    arrow(ax, (5.0, 4.45), (7.2, 7.25), color=C_GEMM)
    arrow(ax, (13.2, 8.65), (15.4, 8.65))
    arrow(ax, (13.2, 7.45), (15.4, 7.45))
    arrow(ax, (5.0, 3.25), (15.4, 7.2), color=C_SOFT)
    ax.text(5.3, 2.75, "L_i, D_i: one per query (column)", fontsize=7.5, color=C_SOFT, va="top")
    arrow(ax, (16.5, 8.2), (13.2, 5.75), text="Pᵀ as A")
    arrow(ax, (16.5, 7.0), (13.2, 4.55), text="dSᵀ as A")
    arrow(ax, (5.0, 4.35), (7.2, 5.5), color=C_GEMM)
    arrow(ax, (5.0, 5.45), (7.2, 4.3), color=C_GEMM)
    arrow(ax, (13.2, 5.3), (15.4, 5.0))
    arrow(ax, (13.2, 4.3), (15.4, 4.8))
    arrow(ax, (19.5, 7.0), (5.0, 1.3), color=C_SMEM)
    ax.text(16.0, 3.0, "dSᵀ stored swizzled,\nproxy fence, barrier", fontsize=7.5, color=C_SMEM, va="top")
    arrow(ax, (5.0, 1.1), (7.2, 1.1), color=C_GEMM)
    arrow(ax, (5.0, 8.3), (7.2, 1.6), color=C_GEMM, connectionstyle="arc3,rad=0.25")
    arrow(ax, (13.2, 1.2), (15.4, 1.2), color=C_HBM)
    ax.text(11.5, -0.6, f"one CTA per ({c['B_c']}-key block, batch, KV head): a producer warp, "
            f"{c['consumers']} consumer warpgroups; keys as wgmma's M put Pᵀ and dSᵀ in A's register layout",
            ha="center", fontsize=8)
    ax.set_title("06e: which operand of the backward's five GEMMs comes from where", fontsize=10)
    save(fig, path)


def fa3_dq_steps(d=128):
    """What 06f, 06g, 06h do with dQ_i per CTA and step at head dim d, from their Configs:
    registers per thread, shared-memory bytes written and read (the copy engine's read
    included), bulk adds and bytes added in L2."""
    c = fa3_bwd_config()  # 06e's tiles, which 06f-06h keep (static_asserts in their launches)
    consumers, b_r = c["consumers"], c["B_r"]
    tile = b_r * d * 4  # one fp32 dQ_i tile
    return b_r, consumers, {
        "06f": dict(regs=d // 2, smem=consumers * tile + consumers * tile, adds=consumers, l2=consumers * tile),
        "06g": dict(regs=d // 2, smem=tile + 2 * tile + tile, adds=1, l2=tile),
        "06h": dict(regs=d // consumers // 2, smem=tile + tile, adds=1, l2=tile),
    }


@figure("06_fa3_hopper/figures/06gh_dq_partials.png")
def fig_06gh(path):
    d = 128
    b_r, consumers, steps = fa3_dq_steps(d)
    kib = lambda b: f"{b // 1024} KiB"
    fig, axes = plt.subplots(1, 3, figsize=(13.5, 5.4))
    wg = dict(color=C_GEMM, tc="white", fs=8)
    sm = dict(color="#ece6f4", fs=8)
    l2 = dict(color="#f4dcdc", fs=8)
    titles = {"06f": "06f: one add per warpgroup", "06g": "06g: partials summed in shared memory",
              "06h": "06h: dQ_i's columns split"}
    for ax, (step, c) in zip(axes, steps.items()):
        blank(ax, (0, 10), (-1.6, 10))
        ax.set_title(titles[step], fontsize=10)
        if step == "06h":
            box(ax, 0.2, 8.5, 9.6, 1.0, f"dSᵀ of both warpgroups: one tile [{64 * consumers} keys × {b_r}]", **sm)
            box(ax, 0.2, 6.0, 4.5, 1.4, f"WG 0: dQ_i[:, 0:{d // 2}]\nover all {64 * consumers} keys", **wg)
            box(ax, 5.3, 6.0, 4.5, 1.4, f"WG 1: dQ_i[:, {d // 2}:{d}]\nover all {64 * consumers} keys", **wg)
            box(ax, 0.2, 3.6, 9.6, 1.2, f"one buffer [{b_r} × {d}] fp32:\neach warpgroup stores its half", **sm)
            for x in (2.4, 7.6):
                arrow(ax, (x, 8.5), (x, 7.4), color=C_GEMM)
                arrow(ax, (x, 6.0), (x, 4.8), color=C_SMEM, text="store")
        else:
            box(ax, 0.2, 8.0, 4.5, 1.4, f"WG 0: dQ_i[:, 0:{d}]\nover keys 0-63", **wg)
            box(ax, 5.3, 8.0, 4.5, 1.4, f"WG 1: dQ_i[:, 0:{d}]\nover keys 64-127", **wg)
            if step == "06f":
                box(ax, 0.2, 3.6, 4.5, 1.2, f"buffer of WG 0\n[{b_r} × {d}] fp32", **sm)
                box(ax, 5.3, 3.6, 4.5, 1.2, f"buffer of WG 1\n[{b_r} × {d}] fp32", **sm)
                arrow(ax, (2.4, 8.0), (2.4, 4.8), color=C_SMEM)
                arrow(ax, (7.6, 8.0), (7.6, 4.8), color=C_SMEM)
            else:
                box(ax, 0.2, 3.6, 9.6, 1.2, f"buffer n % 2 [{b_r} × {d}] fp32:\nWG 1 writes, WG 0 reads, adds, writes", **sm)
                arrow(ax, (7.6, 8.0), (7.6, 4.8), color=C_SMEM, text="store")
                arrow(ax, (2.4, 4.8), (2.4, 8.0), color=C_SMEM, text="load + add")
        for k in range(c["adds"]):
            x = 2.4 + 5.2 * k if c["adds"] > 1 else 5.0
            arrow(ax, (x, 3.6), (x, 1.9), color=C_HBM, text="bulk add")
        box(ax, 0.2, 0.7, 9.6, 1.2, "dQ_acc (fp32) in L2 / HBM", **l2)
        ax.text(5.0, -0.3, f"dQ accumulators per thread: {c['regs']}; shared memory", ha="center", fontsize=8)
        ax.text(5.0, -1.1, f"written + read: {kib(c['smem'])}; into L2: {c['adds']} × {kib(c['l2'] // c['adds'])}",
                ha="center", fontsize=8)
    fig.suptitle(f"Where the partial sums of dQ_i meet, per CTA and step (d = {d}, B_r = {b_r}, "
                 f"{consumers} consumer warpgroups of 64 keys)", fontsize=10)
    save(fig, path)


def bwd_step_model(d=128, b_r=None):
    """One CTA step of 06i and 06j at head dim d (B_r query rows: the Config's unless given),
    both consumer warpgroups in lockstep (their barriers keep them so): the five GEMMs at the
    SM's dense rate, the elementwise phases at the MUFU / FP32 / shared-memory rates above.
    Returns {step: (warp bars, tensor bars, end)}."""
    c = fa3_bwd_config()
    b_c, b_r = c["B_c"], b_r or c["B_r"]
    gemm = 2.0 * b_c * b_r * d / H100_FLOP_PER_CYCLE  # each of the five, both warpgroups
    exps = b_c * b_r / SM90_MUFU_PER_CYCLE + 2 * b_c * b_r / SM90_FP32_PER_CYCLE  # exp2, FFMA, pack
    ds = 3 * b_c * b_r / SM90_FP32_PER_CYCLE  # dPᵀ − D_i, × Pᵀ, pack
    ds_store = 2 * b_c * b_r / SMEM_BYTES_PER_CYCLE
    dq_store = 4 * b_r * d / SMEM_BYTES_PER_CYCLE  # the fp32 tile (the copy engine's read is not the warps')
    out = {}
    for step in ("06i", "06j"):
        warps, tc = [], []
        tc += [(0, gemm, "①"), (gemm, gemm, "②")]
        warps.append((0, gemm, C_WAIT, ""))
        t = gemm + exps  # Pᵀ in registers
        warps.append((gemm, exps, C_SOFT, "exp2"))
        if step == "06i":
            warps.append((t, max(0, 2 * gemm - t), C_WAIT, ""))
            t = max(t, 2 * gemm)
            warps.append((t, ds, C_SOFT, "dSᵀ"))
            t += ds
            tc += [(t, gemm, "③"), (t + gemm, gemm, "④")]
            warps.append((t, ds_store, C_SMEM, "st"))
            warps.append((t + ds_store, 2 * gemm - ds_store, C_WAIT, ""))
            t += 2 * gemm
            tc.append((t, gemm, "⑤"))
            warps.append((t, gemm, C_WAIT, ""))
            t += gemm
            warps.append((t, dq_store, C_SMEM, "dQ_i"))
            end = t + dq_store
        else:
            start3 = max(t, 2 * gemm)
            tc.append((start3, gemm, "③"))
            t = max(t, 2 * gemm)  # dPᵀ done
            warps.append((t, ds, C_SOFT, "dSᵀ"))
            t += ds
            warps.append((t, ds_store, C_SMEM, "st"))
            t += ds_store
            start5 = max(t, start3 + gemm)
            tc += [(start5, gemm, "⑤"), (start5 + gemm, gemm, "④")]
            warps.append((t, start5 + gemm - t, C_WAIT, ""))
            t = start5 + gemm
            warps.append((t, dq_store, C_SMEM, "dQ_i"))
            warps.append((t + dq_store, max(0, start5 + 2 * gemm - t - dq_store), C_WAIT, ""))
            end = max(t + dq_store, start5 + 2 * gemm)
        out[step] = (warps, [(a, b, C_GEMM, txt) for a, b, txt in tc], end)
    return c, gemm, out


@figure("06_fa3_hopper/figures/06ij_issue_order.png")
def fig_06ij(path):
    c, gemm, steps = bwd_step_model()
    fig, axes = plt.subplots(2, 1, figsize=(10.5, 3.9), sharex=True)
    titles = {"06i": "06i: ③ ④ issued together after dSᵀ, ⑤ after both",
              "06j": "06j: ③ as soon as Pᵀ is ready, ⑤ before ④, wait for ⑤ alone"}
    for ax, (step, (warps, tc, end)) in zip(axes, steps.items()):
        gantt(ax, [("warps (both WGs)", warps), ("tensor cores", tc)], xlabel="cycles" if step == "06j" else "")
        busy = 5 * gemm / end
        ax.set_title(f"{titles[step]}: one step ≈ {end:.0f} cycles, tensor cores busy {100 * busy:.0f} %", fontsize=9.5)
    axes[1].annotate(f"A model of one CTA step at d = 128 (B_c = {c['B_c']}, B_r = {c['B_r']}): each GEMM "
                     f"≈ {gemm:.0f} cycles at {H100_FLOP_PER_CYCLE} FLOP/cycle; exp2 at {SM90_MUFU_PER_CYCLE}/cycle, "
                     f"fp32 at {SM90_FP32_PER_CYCLE}/cycle,\nshared memory at {SMEM_BYTES_PER_CYCLE} B/cycle. "
                     "Grey: waiting. No latencies: the measured step is longer (06i_bwd.md).",
                     xy=(0, 0), xycoords="axes fraction", xytext=(0, -40), textcoords="offset points", fontsize=8, va="top")
    save(fig, path)


H200_SMS, H200_MAX_CLOCK_HZ = 132, 1.98e9  # the reference run's GPU (nvidia-smi: clocks.max.sm)


@figure("06_fa3_hopper/figures/06k_tall_steps.png")
def fig_06k(path):
    """06j's step at d = 64 as the reference run measured it, split into the model's busy cycles
    (bwd_step_model) and the rest, a fixed cost per step; 06k's 128-row step predicted from the
    model and that fixed cost."""
    (rows_k,) = parse("06_fa3_hopper/fa3_launch.h", r"rows_per_step\(int d\) \{ return d == 64 \? (\d+) : 64;")
    c, _, m64 = bwd_step_model(64)
    _, _, m128 = bwd_step_model(64, rows_k)
    busy64, busy128 = m64["06j"][2], m128["06i"][2]  # 06k at d = 64 issues in 06i's order
    ref = REPO / "results/nvidia_h200/backward_06.csv"
    with open(ref, newline="") as fh:
        row = next(r for r in csv.DictReader(fh) if r["rung"] == "06j_bwd_issue_order_bwd" and r["d"] == "64"
                   and r["causal"] == "0" and r["Nq"] == "16384")
    B, Hkv, Nq, Nk = (int(row[k]) for k in ("B", "Hkv", "Nq", "Nk"))
    ctas = -(-Nk // c["B_c"]) * B * Hkv
    steps = Nq // c["B_r"]
    step = float(row["time_ms_median"]) * 1e-3 * H200_MAX_CLOCK_HZ / (ctas / H200_SMS) / steps
    fixed = step - busy64
    t_j, t_k = 2 * step, busy128 + fixed  # per 128 queries of one CTA
    fig, ax = plt.subplots(figsize=(10.5, 2.9))
    bars = [("06k: one step of 128 rows (model)", [(0, busy128, C_GEMM, "GEMMs + elementwise (model)"),
                                                    (busy128, fixed, C_WAIT, "fixed")]),
            ("06j: two steps of 64 rows (measured)", [(0, busy64, C_GEMM, "busy (model)"), (busy64, fixed, C_WAIT, "fixed"),
                                                      (step, busy64, C_GEMM, "busy (model)"),
                                                      (step + busy64, fixed, C_WAIT, "fixed")])]
    gantt(ax, bars, xlabel="cycles per 128 queries of one CTA (d = 64)")
    ax.set_title(f"06j's measured step at d = 64 is {step:.0f} cycles, the model's busy part {busy64:.0f}: "
                 f"{fixed:.0f} cycles of waits, barriers and fences per step.\n"
                 f"Paid once per 128 rows instead of twice: 06k predicted {t_j / t_k:.2f}x 06j", fontsize=9.5)
    ax.annotate(f"Measured: 06j at d = 64, N = 16k (results/nvidia_h200/backward_06.csv, {ctas} CTAs on {H200_SMS} SMs, "
                f"{steps} steps each, at {H200_MAX_CLOCK_HZ / 1e9:.2f} GHz); busy: bwd_step_model (no latencies).",
                xy=(0, 0), xycoords="axes fraction", xytext=(0, -34), textcoords="offset points", fontsize=8, va="top")
    save(fig, path)


def bwd_timeline(step, d, n):
    """A backward CTA's phase medians (cycles) from results/nvidia_h200/tile_timeline.txt
    (`tile_timeline --backward`): {phase: cycles}, and the section's first line."""
    for head, section in timeline_sections(REPO / "results/nvidia_h200/tile_timeline.txt"):
        if head.startswith(f"{step} backward d = {d}, N = {n} "):
            return {k: float(v) for k, v in re.findall(r"^  (\S.*?)\s{2,}(\d+)$", section, re.M)}, head
    raise RuntimeError(f"tile_timeline.txt has no '{step} backward d = {d}, N = {n}' section")


@figure("06_fa3_hopper/figures/06l_cta_timeline.png")
def fig_06l(path):
    """A backward CTA of 06k and of 06l outside its steps (the measured medians of
    tile_timeline --backward on the H200), at d = 128 and 64, N = 2k."""
    n = 2048
    parts = [("start -> K_j, V_j landed", C_LOAD, "K_j, V_j"), ("-> first ring stage full", C_LOAD, "stage 0"),
             ("epilogue: dK_j, dV_j stored", C_HBM, "dK_j, dV_j stored"), ("-> last dQ add done", C_SMEM, ""),
             ("between two CTAs on one SM", C_WAIT, "next CTA")]
    fig, axes = plt.subplots(2, 1, figsize=(10.5, 4.6), sharex=True)
    for ax, d in zip(axes, (128, 64)):
        rows, notes = [], []
        for step in ("06k", "06l"):
            ph, _ = bwd_timeline(step, d, n)
            x, bars = 0.0, []
            for key, color, text in parts:  # the steps between stage 0 and the epilogue: in the label
                bars.append((x, ph[key], color, text if ph[key] > 1500 else ""))
                x += ph[key]
            rows.append((f"{step}: {x / 1e3:.1f} k cycles outside {ph['the steps'] / 1e3:.0f} k of steps", bars))
        gantt(ax, rows, xlabel="cycles per CTA outside its steps (medians over every CTA)" if d == 64 else "")
        ax.set_title(f"d = {d}, N = {n}", fontsize=9.5, loc="left")
    legend = [("K_j, V_j landed; first ring stage", C_LOAD), ("epilogue: dK_j, dV_j stored", C_HBM),
              ("last dQ add", C_SMEM), ("until the next CTA starts on the SM", C_WAIT)]
    axes[0].legend(handles=[Rectangle((0, 0), 1, 1, facecolor=c, edgecolor="black", lw=0.6, label=l) for l, c in legend],
                   fontsize=8, loc="lower right")
    fig.suptitle("A backward CTA outside its steps: 06l stores dK_j, dV_j through shared memory by TMA, 06k from registers\n"
                 "(the steps themselves are the same; measured: results/nvidia_h200/tile_timeline.txt, tile_timeline --backward)",
                 fontsize=9.5, y=1.02)
    save(fig, path)


def list_schedule(costs, sms):
    """The hardware's hand-out of a grid, CTA after CTA in launch order, each to the first SM
    free (a greedy list schedule): [(sm, start, end)] per CTA."""
    import heapq
    free = [(0.0, sm) for sm in range(sms)]
    out = []
    for c in costs:
        t, sm = heapq.heappop(free)
        out.append((sm, t, t + c))
        heapq.heappush(free, (t + c, sm))
    return out


def bwd_grid_costs(order_heads_per_section, n, d, heads, fixed_steps):
    """Steps (plus a fixed part) of each backward CTA of the causal grid at N = n in 06m's
    order (fa3_launch.h: cta_order over tile_order.h's sections); 1 head per section is 06l's."""
    (B_c,) = parse("06_fa3_hopper/fa3_launch.h", r"kBwdKeysPerCta = (\d+);")
    B_r = fa3_by_d("rows_per_step", d)
    T_c, T_r = -(-n // B_c), -(-n // B_r)
    costs = []
    per = order_heads_per_section
    for x in range(T_c * heads):  # tile_at(), then j = T_c - 1 - m_block (cta_order)
        section, r = divmod(x, per * T_c)
        here = min(per, heads - section * per)
        j = r // here  # T_c - 1 - (T_c - 1 - r // here)
        first_i = j * B_c // B_r
        costs.append(T_r - first_i + fixed_steps)
    return costs


@figure("06_fa3_hopper/figures/06m_grid_tail.png")
def fig_06m(path):
    """The causal backward grid at d = 128, N = 2k (the paper sweep's B = 8, H = 16) handed out
    to 132 SMs in 06l's order and in 06m's, each CTA as long as its steps plus its fixed part
    (results/nvidia_h200/tile_timeline.txt, 06l): how many SMs are busy as the grid ends."""
    n, d, heads, sms, l2 = 2048, 128, 8 * 16, H200_SMS, 50 << 20
    ph, _ = bwd_timeline("06l", d, n)
    fixed = (ph["whole CTA"] - ph["the steps"] + ph["between two CTAs on one SM"]) / ph["each step"]
    head_bytes = n * d * (2 + 2 + 4)  # bwd_order: Q, dO, dQ_acc of the group's one query head
    per = max(1, min(heads, l2 // 3 // head_bytes))
    fig, ax = plt.subplots(figsize=(10.5, 3.6))
    total = sum(bwd_grid_costs(1, n, d, heads, fixed))
    for label, k, color in (("06l: head after head, j = 0, 1, ... in each", 1, C_HBM),
                            (f"06m: sections of {per} heads, block j of each before block j + 1", per, C_GEMM)):
        runs = list_schedule(bwd_grid_costs(k, n, d, heads, fixed), sms)
        end = max(e for _, _, e in runs)
        t = np.linspace(0, end, 2000)
        busy = [sum(1 for _, a, b in runs if a <= x < b) for x in t]
        ax.step(t, busy, where="post", color=color, lw=1.4,
                label=f"{label}: ends at {end:.0f} steps, {end / (total / sms):.3f}x the even share")
    ax.axvline(total / sms, color="black", ls="--", lw=0.9)
    ax.text(total / sms, sms * 1.03, " the grid's work / 132 SMs", fontsize=8, va="bottom")
    ax.set_xlim(0.7 * total / sms, None)
    ax.set_ylim(0, sms * 1.16)
    ax.set_xlabel("time, in steps of a CTA (the grid's last 30 %)")
    ax.set_ylabel("SMs running a CTA")
    ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0, 0.12))
    ax.set_title(f"Causal backward, d = {d}, N = {n}: {heads} (batch, KV head)s x {-(-n // 128)} K/V blocks on {sms} SMs, "
                 f"each CTA its steps + {fixed:.1f} steps of fixed work\n(a greedy list schedule of the grid "
                 "in launch order, from the code's tiles and 06l's measured CTA timeline)", fontsize=9.5)
    save(fig, path)


def bwd_smem_bytes(d, k_in_registers):
    """Shared-memory bytes one step of a backward CTA moves (06m's kernel; 06n_bwd.md's table),
    by what moves them: the two consumer warpgroups' wgmma operand reads, the dSᵀ and dQ_i
    stores, the bulk add's read of dQ_i and TMA's writes of Q_i, dO_i."""
    (B_c,) = parse("06_fa3_hopper/fa3_launch.h", r"kBwdKeysPerCta = (\d+);")
    B_r, e, w = fa3_by_d("rows_per_step", d), 2, 2  # bf16 operands; two consumer warpgroups
    # dQ_i by column halves at 64 rows (each warpgroup: dSᵀ of all B_r queries, d/2 columns of
    # K_j), by query halves at 128 (64 queries, all d columns)
    dq_a, dq_b = (B_c * B_r * e, B_c * d // 2 * e) if B_r == 64 else (B_c * 64 * e, B_c * d * e)
    return {
        "Sᵀ = K_j Q_iᵀ: K_j": 0 if k_in_registers else B_c * d * e,
        "Sᵀ: Q_i": w * B_r * d * e,
        "dPᵀ = V_j dO_iᵀ: V_j": B_c * d * e,
        "dPᵀ: dO_i": w * B_r * d * e,
        "dV += Pᵀ dO_i: dO_i": w * B_r * d * e,
        "dK += dSᵀ Q_i: Q_i": w * B_r * d * e,
        "dQ_i = dS K_j: dSᵀ, K_j": w * (dq_a + dq_b),
        "dSᵀ stores": B_c * B_r * e,
        "dQ_i stores, bulk add's read": 2 * B_r * d * 4,
        "TMA: Q_i, dO_i": 2 * B_r * d * e,
    }


def tail_constants():
    """fa3_launch.h's step06o::kPieceCostSteps and kMaxPieces."""
    src = "06_fa3_hopper/fa3_launch.h"
    return parse(src, r"kPieceCostSteps = (\d+);")[0], parse(src, r"kMaxPieces = (\d+);")[0]


def tail_plan(tiles, steps, sms, causal=False):
    """fa3_launch.h's step06o::tail_plan on the constants parsed from it: (full CTAs, pieces p,
    tail tiles, long tiles in p pieces; the others in p + 1). Each plan's end is the greedy
    list schedule of its CTAs, longest first (what two_size_end gives in closed form)."""
    cost, most = tail_constants()
    if causal or sms < 1 or steps < 2 or tiles % sms == 0:
        return tiles, 1, 0, 0
    tail = tiles % sms
    best, plan = steps + cost, (1, 0)
    for p in range(2, min(steps, most) + 1):
        for R in range(5):  # R = 0: every tail tile in p pieces
            a = tail if R == 0 else R * sms // p
            if R > 0 and (a >= tail or p + 1 > steps or p + 1 > most):
                continue
            end = lpt_schedule(tail_costs(steps, p, a, tail, cost), range(a * p + (tail - a) * (p + 1)), sms)[1]
            if end < best:
                best, plan = end, (p, a)
    p, a = plan
    return (tiles - tail, p, tail, a) if p > 1 else (tiles, 1, 0, 0)


def tail_costs(steps, p, long_tiles, tail, cost):
    """The tail's CTAs in the pieces' grid order: long_tiles tiles in p pieces, then the rest in
    p + 1; the model's cost of each, ceil(steps / pieces) + cost (06o_bwd_tail_pieces.cuh: Work)."""
    return ([-(-steps // p) + cost] * (long_tiles * p) +
            [-(-steps // (p + 1)) + cost] * ((tail - long_tiles) * (p + 1)))


@figure("06_fa3_hopper/figures/06o_tail_pieces.png")
def fig_06o(path):
    """SMs busy over the end of the backward's grid at the papers' shapes (d = 128 and 64, N = 2k,
    no mask), 06n's whole tiles against 06o's pieces, as a greedy list schedule in units of
    steps with kPieceCostSteps per CTA (the hardware starts CTAs in order on the first free SM)."""
    cost, _ = tail_constants()
    rows64, rows128 = parse("06_fa3_hopper/fa3_launch.h", r"rows_per_step\(int d\) \{ return d == 64 \? (\d+) : (\d+);")
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.9))
    for ax, d, rows in ((axes[0], 128, rows128), (axes[1], 64, rows64)):
        B, H, N = 16384 // 2048, 2048 // d, 2048
        tiles, steps = (N // 128) * B * H, N // rows
        full, pieces, tail, long_tiles = tail_plan(tiles, steps, H200_SMS)
        whole = [steps + cost] * tiles
        equal = [steps + cost] * full + tail_costs(steps, pieces, tail, tail, cost)
        split = [steps + cost] * full + tail_costs(steps, pieces, long_tiles, tail, cost)
        label = (f"06o: {tail} tiles x {pieces} pieces" if long_tiles == tail else
                 f"06o: {long_tiles} tiles x {pieces} pieces, then {tail - long_tiles} x {pieces + 1}")
        runs = [(whole, C_WAIT, "06n: whole tiles")]
        if long_tiles < tail:
            runs.append((equal, C_SOFT, f"equal pieces: {tail} tiles x {pieces}"))
        runs.append((split, C_GEMM, label))
        for costs, color, label in runs:
            placed, span = lpt_schedule(costs, range(len(costs)), H200_SMS)
            t = np.linspace(span - 3 * (steps + cost), span, 600)
            busy = [sum(1 for s, start, c, u in placed if start <= x < start + c) for x in t]
            ax.step(t, busy, where="post", color=color if color != C_WAIT else "black", lw=1.6,
                    label=f"{label}: ends at {span:.0f} steps")
        ax.set_title(f"d = {d}, N = 2k: {tiles} tiles of {steps} steps on {H200_SMS} SMs", fontsize=10)
        ax.set_xlabel(f"time (steps of one CTA; {cost} more per CTA)")
        ax.set_ylabel("SMs running a CTA")
        ax.set_ylim(0, H200_SMS * 1.08)
        ax.legend(fontsize=8, loc="lower left")
        ax.grid(alpha=0.3)
    fig.suptitle("The last partial wave: 06n leaves SMs idle for a whole CTA; 06o splits its tiles into pieces of steps "
                 "(tail_plan, fa3_launch.h)", fontsize=10)
    fig.tight_layout()
    save(fig, path)


@figure("06_fa3_hopper/figures/06p_dq_writer.png")
def fig_06p(path):
    """Left: one step's barriers at d = 128, 06o against 06p (06p_bwd_dq_writer.cuh: who syncs,
    who only arrives, and the counts, parsed from the code). Right: 06p's speedup over cuDNN
    divided by 06o's at d = 128, from the reference run's rows (results/nvidia_h200/vs_cudnn.csv,
    the run that has 06p_bwd_dq_writer; each rung with its own cuDNN calls in the same rounds)."""
    (wg_threads,) = parse("06_fa3_hopper/06p_bwd_dq_writer.cuh", r"kWgThreads = (\d+);")
    (writer_threads,) = parse("06_fa3_hopper/06p_bwd_dq_writer.cuh", r"kAtDsAndDq = 2 \* Cfg::kWgThreads \+ \(Cfg::kDqWriter \? (\d+) : 0\);")
    both, with_writer = 2 * wg_threads, 2 * wg_threads + writer_threads
    fig = plt.figure(figsize=(14, 4.8))
    ax = fig.add_axes([0.0, 0.02, 0.64, 0.9])
    blank(ax, (0, 12), (0, 10.4))
    steps_06o = [("dSᵀ → shared", "dSᵀ → shared", None), ("bar.sync dSᵀ", "bar.sync dSᵀ", None),
                 ("dQ_i, dK", "dQ_i, dK", None), ("dQ_i → buffer", "dQ_i → buffer", None),
                 ("bar.sync dQ", "bar.sync dQ", None), ("bulk add dQ_i", "", None), ("next Sᵀ, dPᵀ", "next Sᵀ, dPᵀ", None)]
    steps_06p = [("dSᵀ → buf n % 2", "dSᵀ → buf n % 2", "bar.arrive dSᵀ"), ("bar.sync dSᵀ", "bar.sync dSᵀ", ""),
                 ("dQ_i, dK", "dQ_i, dK", ""), ("dQ_i → buffer", "dQ_i → buffer", ""),
                 ("bar.arrive dQ", "bar.arrive dQ", "bar.sync dQ"), ("next Sᵀ, dPᵀ", "next Sᵀ, dPᵀ", "bulk add dQ_i"),
                 ("", "", "wait: read")]
    for x0, width, title, rows, lanes in ((0.1, 4.4, f"06o: barriers of {both} threads", steps_06o, ("wg 0", "wg 1")),
                                          (4.9, 7.0, f"06p: barriers of {with_writer} threads", steps_06p,
                                           ("wg 0", "wg 1", "writer warp"))):
        ax.text(x0 + width / 2, 10.1, title, ha="center", fontsize=9.5, weight="bold")
        w = width / len(lanes)
        for c, name in enumerate(lanes):
            ax.text(x0 + c * w + w / 2, 9.5, name, ha="center", fontsize=8.5)
        for r, row in enumerate(rows):
            y = 8.6 - 1.25 * r
            for c, text in enumerate(row[:len(lanes)]):
                if not text:
                    continue
                kind = ("wait" if text.startswith("bar.sync") or text.startswith("wait") else
                        "load" if text.startswith("bulk") or text.startswith("bar.arrive") else
                        "gemm" if "dK" in text or "Sᵀ, dPᵀ" in text else "smem")
                color = {"wait": C_WAIT, "load": C_LOAD, "gemm": C_GEMM, "smem": C_SMEM}[kind]
                box(ax, x0 + c * w + 0.05, y, w - 0.1, 0.8, text, color, fs=7 if len(lanes) == 3 else 7.5,
                    tc="white" if kind == "gemm" else "black")
    ax.text(0.2, 0.1, "grey: waits for the others; green: arrives and goes on, or the copy engine's add; the writer's "
            "arrival after the read opens the next step's dSᵀ barrier", fontsize=8)
    ax2 = fig.add_axes([0.7, 0.14, 0.29, 0.72])
    with open(REPO / "results/nvidia_h200/vs_cudnn.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    shas = {r["git_sha"] for r in rows if r["rung"] == "06p_bwd_dq_writer_bwd"}
    run = [r for r in rows if r["git_sha"] in shas and r["d"] == "128"]
    for causal, marker, color in ((0, "o", C_GEMM), (1, "s", C_SOFT)):
        # each rung's speedup over its own cuDNN calls: the two rungs' ratio under matched clocks
        sp = {(r["rung"], int(r["N"])): float(r["speedup"]) for r in run if int(r["causal"]) == causal}
        ns = sorted(n for (rung, n) in sp if rung == "06p_bwd_dq_writer_bwd")
        ratio = [sp[("06p_bwd_dq_writer_bwd", n)] / sp[("06o_bwd_tail_pieces_bwd", n)] for n in ns]
        ax2.plot(ns, ratio, marker=marker, color=color, label="causal" if causal else "no mask")
    ax2.axhline(1.0, color="black", lw=0.8)
    ax2.set_xscale("log", base=2)
    ax2.set_xticks([1024, 2048, 4096, 8192, 16384], ["1k", "2k", "4k", "8k", "16k"])
    ax2.set_xlabel("N (B·N = 16384), d = 128")
    ax2.set_ylabel("06p's speedup over cuDNN / 06o's (> 1: 06p faster)")
    ax2.set_title(f"measured, one H200, commit {', '.join(sorted(shas))}", fontsize=9)
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    fig.suptitle("06o → 06p: the dQ barrier no longer holds the consumers; a writer warp waits there instead", fontsize=10.5)
    save(fig, path)


@figure("06_fa3_hopper/figures/06q_walking_ctas.png")
def fig_06q(path):
    """Left: one SM's time line for three short tiles, 06p (a CTA per tile: its start, the wait
    for K_j, V_j, the steps, the dK, dV stores) against 06q (one CTA walks them: tile u + 1's
    K_j, V_j land in the other buffer under tile u's last steps); a drawing, the buffer count
    parsed from 06q_bwd_persistent.cuh. Right: what the walk saved per tile at d = 64, from the
    reference run's rows (results/nvidia_h200/vs_cudnn.csv, the run that has
    06q_bwd_persistent): (06p's time - 06q's) x SMs / tiles, tiles = B·H·N/128."""
    (buffers,) = parse("06_fa3_hopper/06q_bwd_persistent.cuh", r"kKvBuffers = kPersistent \? (\d+) : 1;")
    (B_c,) = parse("06_fa3_hopper/fa3_launch.h", r"kBwdKeysPerCta = (\d+);")
    fig = plt.figure(figsize=(14, 4.6))
    ax = fig.add_axes([0.0, 0.04, 0.6, 0.86])
    blank(ax, (0, 27.5), (0, 10))
    steps, start, kv, store = (3, 2, 1), 0.6, 1.6, 1.2  # a drawing: steps of 2.2 units, fixed parts as measured in proportion
    step_w = 2.2

    def lane(y, label):
        ax.text(0.1, y + 0.35, label, fontsize=8.5, ha="left")

    # 06p: CTA after CTA
    ax.text(0.1, 9.4, "06p: one CTA per tile (one per SM at a time)", fontsize=9.5, weight="bold")
    lane(8.0, "producer")
    lane(6.9, "consumers")
    x = 3.0
    for t, n in enumerate(steps):
        box(ax, x, 6.9, start, 0.8, "", C_WAIT)
        x += start
        box(ax, x, 8.0, kv, 0.8, f"K,V {t}", C_LOAD, fs=7)
        box(ax, x, 6.9, kv, 0.8, "wait", C_WAIT, fs=7)
        x += kv
        for k in range(n):
            box(ax, x + 0.05, 6.9, step_w - 0.1, 0.8, f"{t}.{k}", C_GEMM, fs=7, tc="white")
            x += step_w
        box(ax, x, 6.9, store, 0.8, "dK,dV", C_SMEM, fs=7)
        x += store
    end_06p = x
    # 06q: one CTA walks them
    ax.text(0.1, 5.1, f"06q: one CTA walks the tiles ({buffers} K_j, V_j buffers)", fontsize=9.5, weight="bold")
    lane(3.7, "producer")
    lane(2.6, "consumers")
    x = 3.0
    box(ax, x, 2.6, start, 0.8, "", C_WAIT)
    x += start
    box(ax, x, 3.7, kv, 0.8, "K,V 0", C_LOAD, fs=7)
    box(ax, x, 2.6, kv, 0.8, "wait", C_WAIT, fs=7)
    x += kv
    for t, n in enumerate(steps):
        for k in range(n):
            box(ax, x + 0.05, 2.6, step_w - 0.1, 0.8, f"{t}.{k}", C_GEMM, fs=7, tc="white")
            if t + 1 < len(steps) and k == max(n - 2, 0):  # the next tile's K, V under the last steps
                box(ax, x + 0.05, 3.7, kv, 0.8, f"K,V {t + 1}", C_LOAD, fs=7)
            x += step_w
        box(ax, x, 2.6, store / 3, 0.8, "", C_SMEM)
        x += store / 3
    ax.annotate("", xy=(x, 2.2), xytext=(end_06p, 2.2), arrowprops=dict(arrowstyle="<->", color="black"))
    ax.text((x + end_06p) / 2, 1.1, "saved per tile: a CTA start, the\nK_j, V_j wait, most of the stores",
            ha="center", fontsize=8)
    ax.text(0.1, 0.1, "t.k: tile t, step k (blue); purple: dK_j, dV_j staged in shared memory (06q: in the dSᵀ tile)\n"
            "for their TMA stores, whose read 06q waits for only before the next tile's first dSᵀ store", fontsize=7.5)
    ax2 = fig.add_axes([0.67, 0.14, 0.31, 0.72])
    with open(REPO / "results/nvidia_h200/vs_cudnn.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    shas = {r["git_sha"] for r in rows if r["rung"] == "06q_bwd_persistent_bwd"}
    run = [r for r in rows if r["git_sha"] in shas and r["d"] == "64"]
    for causal, marker, color in ((0, "o", C_GEMM), (1, "s", C_SOFT)):
        t = {(r["rung"], int(r["N"])): r for r in run if int(r["causal"]) == causal}
        ns = sorted(n for (rung, n) in t if rung == "06q_bwd_persistent_bwd")
        saved = []
        for n in ns:
            q, p = t[("06q_bwd_persistent_bwd", n)], t[("06p_bwd_dq_writer_bwd", n)]
            tiles = int(q["B"]) * int(q["H"]) * -(-n // B_c)
            saved.append((float(p["rung_ms"]) - float(q["rung_ms"])) * 1e3 * H200_SMS / tiles)
        ax2.plot(ns, saved, marker=marker, color=color, label="causal" if causal else "no mask")
    ax2.axhline(0.0, color="black", lw=0.8)
    ax2.set_xscale("log", base=2)
    ax2.set_xticks([1024, 2048, 4096, 8192, 16384], ["1k", "2k", "4k", "8k", "16k"])
    ax2.set_xlabel(f"N (B·N = 16384), d = 64; tiles of {B_c} keys")
    ax2.set_ylabel(f"µs saved per tile: (06p − 06q) × {H200_SMS} SMs / tiles")
    ax2.set_title(f"measured, one H200, commit {', '.join(sorted(shas))}", fontsize=9)
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    fig.suptitle("06p → 06q: the fixed part of each tile goes under the steps of the one before", fontsize=10.5)
    save(fig, path)


@figure("06_fa3_hopper/figures/bwd_vs_cudnn_turns.png")
def fig_bwd_vs_cudnn(path):
    """The backward passes against cuDNN's, timed call by call in turns (scripts/vs_cudnn.py
    --backward; results/nvidia_h200/vs_cudnn.csv): median speedup by N, the rounds' range as a
    band. A rung at a head dim timed in several runs: its latest run's rows (the CSV's last)."""
    with open(REPO / "results/nvidia_h200/vs_cudnn.csv", newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["rung"].endswith("_bwd")]
    latest = {(r["rung"], r["d"]): r["git_sha"] for r in rows}
    rows = [r for r in rows if r["git_sha"] == latest[(r["rung"], r["d"])]]
    styles = {"06q_bwd_persistent_bwd": (C_HBM, "-", "06q (06d_fa3's backward)"),
              "06p_bwd_dq_writer_bwd": (C_GEMM, "-", "06p (at d = 128 also 06q's kernel)"),
              "06o_bwd_tail_pieces_bwd": (C_SMEM, "-.", "06o (at d = 64 also 06p's kernel)"),
              "06n_bwd_k_in_registers_bwd": (C_SOFT, "--", "06n"),
              "05_fa2_reordered_bwd": (C_LOAD, ":", "05 (FlashAttention-2's)")}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for ax, d in zip(axes, (64, 128)):
        for rung, (color, ls, label) in styles.items():
            for causal in (0, 1):
                pts = sorted((int(r["N"]), float(r["speedup"]), float(r["speedup_min"]), float(r["speedup_max"]))
                             for r in rows if r["rung"] == rung and int(r["d"]) == d and int(r["causal"]) == causal)
                if not pts:
                    continue
                n, med, lo, hi = (np.array(v) for v in zip(*pts))
                ax.plot(n, med, color=color, ls=ls, marker="o" if causal == 0 else "s", ms=4,
                        label=f"{label}{', causal' if causal else ''}")
                ax.fill_between(n, lo, hi, color=color, alpha=0.12)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks([1024, 2048, 4096, 8192, 16384], ["1k", "2k", "4k", "8k", "16k"])
        ax.set_xlabel("N (B·N = 16384)")
        ax.set_title(f"d = {d}", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("speedup over cuDNN's backward (> 1: faster)")
    seen = {}  # a rung drawn in one panel only (06q at d = 64) still gets its legend entry
    for a in axes:
        for h, label in zip(*a.get_legend_handles_labels()):
            seen.setdefault(label, h)
    axes[1].legend(seen.values(), seen.keys(), fontsize=7, loc="lower right")
    shas = ", ".join(sorted({r["git_sha"] for r in rows}))
    fig.suptitle("Backward passes against SDPA's cuDNN, timed call by call in turns in one process (median of the rounds; "
                 f"band: lowest to highest round); NVIDIA H200, commits {shas}", fontsize=9.5)
    fig.tight_layout()
    save(fig, path)


@figure("06_fa3_hopper/figures/06n_smem_bytes.png")
def fig_06n(path):
    """Shared-memory bytes per step of a backward CTA, 06m against 06n, against what shared
    memory moves while the tensor cores run the step's five GEMMs (128 B a cycle)."""
    (held,) = parse("06_fa3_hopper/06n_bwd_k_in_registers.cuh", r"kKInRegisters = D == (\d+);")
    (B_c,) = parse("06_fa3_hopper/fa3_launch.h", r"kBwdKeysPerCta = (\d+);")
    bars = []
    for d in (64, 128):
        bars.append((f"06m, d = {d}", bwd_smem_bytes(d, False), d, False))
        bars.append((f"06n, d = {d}" + ("" if d == held else " (= 06m: K_j's 32 registers spill)"),
                     bwd_smem_bytes(d, d == held), d, False))
        if d != held:
            bars.append((f"K_j held at d = {d} (not built)", bwd_smem_bytes(d, True), d, True))
    colors = plt.get_cmap("tab20").colors
    fig, ax = plt.subplots(figsize=(10.5, 5.0))
    keys = list(bars[0][1])
    for y, (label, parts, d, hatched) in enumerate(bars):
        x = 0
        for k, key in enumerate(keys):
            v = parts[key] / 1024
            ax.barh(y, v, left=x, color=colors[k % 20], edgecolor="white", hatch="//" if hatched else None,
                    label=key if y == 0 else None, alpha=0.55 if hatched else 1)
            x += v
        ax.text(x + 4, y, f"{x:.0f} KiB", va="center", fontsize=8.5)
    for d, y0 in ((64, -0.45), (128, 1.55)):
        B_r = fa3_by_d("rows_per_step", d)
        cycles = 5 * 2 * B_c * B_r * d / H100_FLOP_PER_CYCLE
        kib = cycles * SMEM_BYTES_PER_CYCLE / 1024
        ax.plot([kib, kib], [y0, y0 + (2 if d == held else 3) - 0.1], color="black", ls="--", lw=1)
        ax.text(kib + 2, y0 + 0.02, f"d = {d}: {cycles:,.0f} tensor cycles x {SMEM_BYTES_PER_CYCLE} B = {kib:.0f} KiB",
                fontsize=7.5, ha="left", va="top", bbox=dict(facecolor="white", edgecolor="none", pad=1))
    ax.set_yticks(range(len(bars)), [b[0] for b in bars], fontsize=8.5)
    ax.invert_yaxis()
    ax.set_xlabel("KiB through shared memory per step of a CTA (both consumer warpgroups)")
    ax.set_xlim(0, 450)
    ax.legend(fontsize=7.5, ncol=4, loc="upper center", bbox_to_anchor=(0.45, -0.14))
    ax.set_title(f"A backward step's shared-memory traffic (B_c = {B_c} keys, B_r = {fa3_by_d('rows_per_step', 64)} rows at d = 64, "
                 f"{fa3_by_d('rows_per_step', 128)} at 128; from the code's tiles):\nat d = 64 06n reads Sᵀ's A operand, K_j, "
                 "from registers; shared memory moves 128 B a cycle", fontsize=9.5)
    save(fig, path)


@figure("06_fa3_hopper/figures/06d2_lazy_rescale.png")
def fig_06d2(path):
    (thr,) = parse("06_fa3_hopper/fa3_launch.h", r"kRescaleLog2 = ([\d.]+)f;", float)
    Bc = fa3_config()["B_c"]
    rng = np.random.default_rng(1)
    blocks = 48
    log2e = 1.0 / np.log(2)
    fig, ax = plt.subplots(figsize=(8.5, 3.6))
    for label, drift, color in (("N(0,1) scores", 0, C_GEMM), ("scores climbing along the keys", 12, C_SOFT)):
        s = (rng.normal(0, 1, blocks * Bc) + np.linspace(0, drift, blocks * Bc)) * log2e
        block_max, refs, lazy, grew = lazy_rescales(s, Bc, thr)
        jj = np.arange(blocks)
        ax.plot(jj, block_max, color=color, label=f"{label}: running max")
        ax.step(jj, refs, where="post", color=color, ls="--", lw=1,
                label=f"m_i used: O_i rescaled {lazy}× (lazy) against {grew}× (every growth)")
    ax.set_xlabel(f"K/V block j (B_c = {Bc}, 06d's tile at d = 128)")
    ax.set_ylabel("row max (log2 units)")
    ax.set_title(f"06d2: m_i moves only when a row max grows by more than {thr:g} (kRescaleLog2); "
                 f"P ≤ 2^{thr:g} meanwhile", fontsize=9.5)
    ax.legend(fontsize=7.5, loc="upper left")
    ax.grid(alpha=0.3)
    save(fig, path)


# Device models for the decode figures: what cudaDeviceGetAttribute gives on an H100 SXM and
# an H200 (SMs; memory clock x bus width), as tests/test_cpu.cpp's h100_like / h200_like.
DECODE_DEVICES = {"H100-like (3.35 TB/s)": (132, 2 * 2619e6 * 5120 / 8),
                  "H200-like (4.92 TB/s)": (132, 2 * 3201e6 * 6144 / 8)}
SMEM_PER_SM, SMEM_RESERVED = 233472, 1024  # cudaDevAttrMaxSharedMemoryPerMultiprocessor, ...PerBlock (sm_90)


def decode_pipeline(sms, bandwidth, d=128, narrow=True):
    """fa2_decode.h's decode_pipeline on the constants parsed from it: (stages, CTAs per SM,
    bytes in flight per SM the model asks for)."""
    src = "05_fa2_reordered/fa2_decode.h"
    (latency_ns,) = parse(src, r"kDecodeLoadedLatencyNs = ([\d.]+);", float)
    (bc,) = parse(src, r"kDecodeBc = (\d+);")
    (s_lo, s_hi) = parse(src, r"kDecodeNarrowStages\[\] = \{(\d+), (\d+)\};")
    (wide_stages,) = parse(src, r"kDecodeWideStages = (\d+);")
    need = bandwidth * latency_ns * 1e-9 / sms
    block = 2 * bc * d * 2
    rows = 16 if narrow else 64
    most, pick = -1, None
    for s in ((s_lo, s_hi) if narrow else (wide_stages,)):
        smem = 2 * d * (rows + 2 * s * bc) + 128
        for c in range(1, SMEM_PER_SM // (smem + SMEM_RESERVED) + 1):
            if c * (s - 1) * block >= need:
                return s, c, need
            if c * (s - 1) * block > most:
                most, pick = c * (s - 1) * block, (s, c)
    return pick[0], pick[1], need


def decode_split(B, Hkv, group, Nq, Nk, sms, ctas_per_sm=1):
    """fa2_decode.h's decode_split, on the constants parsed from it: (splits, keys per split, CTAs)."""
    src = "05_fa2_reordered/fa2_decode.h"
    (bc,) = parse(src, r"kDecodeBc = (\d+);")
    (min_keys,) = parse(src, r"kDecodeMinSplitKeys = (\d+);")
    (max_waves,) = parse(src, r"kDecodeMaxWaves = (\d+);")
    (fill,) = parse(src, r"kDecodeWaveFill = ([\d.]+);", float)
    (narrow,) = parse(src, r"kDecodeNarrowRows = (\d+);")
    rows = group * Nq
    row_blocks = -(-rows // (narrow if rows <= narrow else 64))
    base = B * Hkv * row_blocks
    slots = sms * ctas_per_sm  # a wave
    most = max(1, min(Nk // min_keys, -(-(max_waves * slots) // base)))
    keys_for = lambda n: -(-(-(-Nk // n)) // bc) * bc  # noqa: E731
    time = lambda n: -(-base * -(-Nk // keys_for(n)) // slots) * keys_for(n)  # noqa: E731  waves x longest CTA
    best = min(time(n) for n in range(1, most + 1))
    for n in range(1, most + 1):
        sp = -(-Nk // keys_for(n))
        if fill * time(n) <= best:
            return sp, keys_for(n), base * sp
    raise RuntimeError("decode_split found no split")


@figure("05_fa2_reordered/figures/decode_littles_law.png")
def fig_decode_littles_law(path):
    """Bandwidth a GPU can reach with F bytes in flight per SM (Little's law: F x SMs / latency,
    capped by the HBM), for both device models, and what the decode tiles keep in flight."""
    (latency_ns,) = parse("05_fa2_reordered/fa2_decode.h", r"kDecodeLoadedLatencyNs = ([\d.]+);", float)
    fig, ax = plt.subplots(figsize=(9.5, 4.6))
    F = np.linspace(1, 200, 400) * 1e3
    colors = (C_GEMM, C_SOFT)
    for (name, (sms, bw)), color in zip(DECODE_DEVICES.items(), colors):
        ax.plot(F / 1e3, np.minimum(bw, F * sms / (latency_ns * 1e-9)) / 1e12, color=color, lw=2, label=name)
        s, c, need = decode_pipeline(sms, bw)
        ax.axvline(need / 1e3, color=color, ls=":", lw=1)
        ax.text(need / 1e3 + 1.5, 1.6 if color == C_GEMM else 2.4,
                f"needs {need / 1e3:.0f} kB/SM:\n{c} CTA{'s' if c > 1 else ''} x {s - 1} blocks", fontsize=8,
                color=color)
    block = 2 * 64 * 128 * 2 / 1e3
    for c, label in ((1, "1 CTA, 3-stage ring"), (2, "2 CTAs, 3-stage ring")):
        x = c * 2 * block
        ax.plot([x], [0.1], marker="v", color="black")
        ax.text(x, 0.18, f"{label}\n{x:.0f} kB", ha="center", fontsize=8)
    ax.set_xlabel("bytes in flight per SM (kB)")
    ax.set_ylabel("reachable read bandwidth (TB/s)")
    ax.set_ylim(0, 5.4)
    ax.set_xlim(0, 200)
    ax.set_title(f"Little's law: bandwidth = bytes in flight / latency (model latency {latency_ns:.0f} ns, 132 SMs);"
                 "\nthe decode tiles keep (stages - 1) K + V blocks of 32 kB (d = 128) in flight per CTA",
                 fontsize=9.5)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save(fig, path)


@figure("05_fa2_reordered/figures/decode_warps_split_keys.png")
def fig_decode_warps(path):
    """The narrow decode tile (fa2_decode.h): its warps split each K/V block's keys, each keeps
    its own (m, l, O) over the loop, and the states merge once at the end."""
    src = "05_fa2_reordered/fa2_decode.h"
    (bc,) = parse(src, r"kDecodeBc = (\d+);")
    (rows,) = parse(src, r"kDecodeNarrowRows = (\d+);")
    (warps,) = parse(src, r"kKeyWarps = (\d+);")
    keys = bc // warps
    cmap = plt.get_cmap("tab10")
    col = lambda w, a=0.35: matplotlib.colors.to_rgba(cmap(w), a)  # noqa: E731
    fig, ax = plt.subplots(figsize=(11, 4.6))
    u = 0.06  # drawing units per key or column
    h = 1.2
    box(ax, 0, 2.8, 2.2, h, f"Q  [{rows} rows × d]\n(R = 4 real at N_q = 1,\n4 heads per KV head)", color="#eeeeee", fs=8)
    ax.text(1.1, 2.8 + h + 0.15, "shared by all warps", ha="center", fontsize=8.5)
    x0 = 3.0
    for w in range(warps):  # K_j's rows, one colour per warp
        box(ax, x0 + w * keys * u, 2.8, keys * u, h, f"keys\n{w * keys}..{(w + 1) * keys - 1}", color=col(w), fs=7.5)
        box(ax, x0 + w * keys * u, 0.9, keys * u, h, f"warp {w}\nS, P", color=col(w), fs=7.5)
    ax.text(x0 + bc * u / 2, 2.8 + h + 0.15, f"K_j, V_j: one block of B_c = {bc} keys (the ring)", ha="center", fontsize=8.5)
    ax.text(x0 + bc * u / 2, 0.9 - 0.3, f"S = Q K_jᵀ, P, and O_w += P V_j on the warp's {keys} keys", ha="center", fontsize=8.5)
    xo = x0 + bc * u + 1.0
    for w in range(warps):
        box(ax, xo, 3.3 - w * 0.85, 2.4, 0.65, f"warp {w}: m_{w}, ℓ_{w}, O_{w}", color=col(w), fs=8)
        arrow(ax, (xo + 2.4, 3.62 - w * 0.85), (xo + 3.2, 2.0), color=cmap(w))
    ax.text(xo + 1.2, 4.2, "four online softmaxes,\nall blocks of the split", ha="center", fontsize=8.5)
    box(ax, xo + 3.2, 1.5, 2.6, 1.0, "merge (once):\nM = max m_w\nO = Σ e^(m_w − M) O_w / ℓ", color="#fff3c4", fs=8)
    ax.set_title(f"The narrow decode tile: {warps} warps split each block's {bc} keys ({keys} each) instead of its "
                 f"{rows} rows;\neach warp's state stays in its registers until one merge in shared memory "
                 "(merge_key_warps, fa2_decode.cuh)", fontsize=9.5)
    blank(ax, (-0.2, xo + 6.0), (0.2, 4.6))
    save(fig, path)


@figure("05_fa2_reordered/figures/decode_splits.png")
def fig_decode(path):
    sms = 132  # an H100 SXM's (the reference run's) SMs
    Hkv, group = 8, 4
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2), gridspec_kw=dict(width_ratios=[1.15, 1]))
    ax = axes[0]
    sp, keys, ctas = decode_split(1, Hkv, group, 1, 16384, sms)
    blank(ax, (0, 20), (-2.2, 7.4))
    ax.set_aspect("auto")
    ax.set_title(f"B = 1, H = 32 over Hkv = 8, Nq = 1, Nk = 16k: {sp} splits of {keys} keys\n"
                 f"per KV head → {ctas} CTAs on {sms} SMs (one wave, H100-like: one CTA per SM)", fontsize=9.5)
    ax.text(0.2, 6.5, f"per KV head: its {group} query heads packed as {group} rows of one tile (GQA)", fontsize=8.5)
    xs = [0.2, 4.9, 9.6, 15.3]
    labels = [(f"keys 0–{keys - 1}", "CTA 0"), (f"keys {keys}–{2 * keys - 1}", "CTA 1"), ("…", "…"),
              (f"keys {(sp - 1) * keys}–{sp * keys - 1}", f"CTA {sp - 1}")]
    for x, (k, c) in zip(xs, labels):
        if k == "…":
            ax.text(x + 1.5, 4.6, "…", fontsize=14, ha="center")
            ax.text(x + 1.5, 2.2, "…", fontsize=14, ha="center")
            continue
        box(ax, x, 4.2, 4.2, 1.4, k, color="#e6ecf6", fs=8)
        arrow(ax, (x + 2.1, 4.2), (x + 2.1, 3.2), text=" S_s = Q K_sᵀ, online softmax", fs=6.5)
        box(ax, x, 1.8, 4.2, 1.4, f"{c}:\nO_s (fp32), lse_s", color="#fde2cc", fs=8)
        arrow(ax, (x + 2.1, 1.8), (10, 0.1), color="#888888")
    box(ax, 2.5, -1.9, 15, 2.0, "combine (rung 03's ⊕ over the splits):\nlse = log Σ_s e^(lse_s),   O = Σ_s e^(lse_s − lse) O_s",
        color="#dff0d8", fs=8.5)
    ax = axes[1]
    nks = [1024, 2048, 4096, 16384, 131072]
    for (name, (n_sms, bw)), ls, marker in zip(DECODE_DEVICES.items(), ("-", "--"), ("o", "s")):
        _, per_sm, _ = decode_pipeline(n_sms, bw)
        for B, color in ((1, C_GEMM), (8, C_SOFT), (32, C_LOAD)):
            got = [decode_split(B, Hkv, group, 1, nk, n_sms, per_sm) for nk in nks]
            ax.plot(range(len(nks)), [g[0] for g in got], marker + ls, color=color, ms=5,
                    label=f"B = {B}, {name.split(' ')[0]}: {per_sm} CTA{'s' if per_sm > 1 else ''}/SM")
    ax.set_yscale("log", base=2)
    ax.set_xticks(range(len(nks)))
    ax.set_xticklabels([f"{n // 1024}k" for n in nks])
    ax.set_xlabel("Nk (keys in the cache)")
    ax.set_ylabel("splits per (batch, KV head)")
    ax.set_title("decode_split (fa2_decode.h) on two device models: a wave is CTAs/SM x SMs;"
                 "\nat least 256 keys a split, the fewest splits whose last wave is nearly full", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save(fig, path)


@figure("05_fa2_reordered/figures/decode_paged.png")
def fig_decode_paged(path):
    """The paged KV cache (fa2_decode.h, fa2_decode.cuh): how a K/V block of B_c keys finds its
    rows through the block table, and what a paged CTA waits on before its first copy."""
    (bc,) = parse("05_fa2_reordered/fa2_decode.h", r"kDecodeBc = (\d+);")
    Hkv, head = 8, 2
    fig, axes = plt.subplots(1, 2, figsize=(13.5, 4.8), gridspec_kw=dict(width_ratios=[1.25, 1]))
    ax = axes[0]
    blank(ax, (-0.3, 10.6), (-0.6, 8.4))
    table = [5, 2, 7, 0]  # sequence b's first columns: pages handed out in any order
    ax.text(0, 5.45, "block_table[b] (int32)", fontsize=9)
    for c, page in enumerate(table):
        box(ax, c * 0.9, 6.1, 0.9, 0.8, str(page), color="#e6ecf6", fs=9)
        ax.text(c * 0.9 + 0.45, 6.05, f"col {c}", ha="center", va="top", fontsize=7)
    ax.text(3.75, 6.5, "…", fontsize=12, va="center")
    pool_x, w = 5.0, 0.55
    ax.text(pool_x, 5.95, "k_cache [num_pages, P, H_kv, d]:\npages handed out from one pool", fontsize=8.5, va="top")
    for i in range(8):
        color = "#fde2cc" if i in table else "#f4f4f4"
        box(ax, pool_x + i * w, 6.1, w, 0.8, str(i), color=color, fs=8)
    for c, page in enumerate(table):
        arrow(ax, (c * 0.9 + 0.45, 6.9), (pool_x + page * w + w / 2, 6.95), color="#4a6fa5",
              connectionstyle="arc3,rad=-0.35")
    # one page of P = B_c tokens: token rows of H_kv heads × d, this CTA's head is one column
    x0, y0, cw, rh, rows_drawn = 0.3, 0.6, 0.62, 0.42, 8
    ax.text(x0, y0 + rows_drawn * rh + 0.35, f"page 5, P = {bc} tokens (rows); a token holds all H_kv = {Hkv} heads",
            fontsize=8.5)
    for r in range(rows_drawn):
        for h in range(Hkv):
            mine = h == head
            box(ax, x0 + h * cw, y0 + (rows_drawn - 1 - r) * rh, cw, rh, "", color="#c9dcf0" if mine else "white",
                lw=0.5)
    ax.text(x0 + Hkv * cw / 2, y0 - 0.35, f"token slot 0 … {bc - 1} (8 drawn)", ha="center", fontsize=7.5)
    ax.text(x0 + head * cw + cw / 2, y0 + rows_drawn * rh + 0.05, f"head {head}", ha="center", fontsize=7.5,
            color="#4a6fa5")
    tx = x0 + Hkv * cw + 0.4
    ax.text(tx, 3.5, f"P a power-of-two multiple of B_c = {bc}:\n"
            f"  a block of {bc} keys lies in one page:\n"
            "  one table entry, then rows at a fixed\n"
            f"  stride of H_kv·d elements (as contiguous)", fontsize=8.3, va="top")
    ax.text(tx, 1.65, f"P = 16: a block spans {bc // 16} pages: an entry per row\n"
            "  (shift and mask; P no power of two: division)", fontsize=8.3, va="top")
    ax.text(tx, 0.55, "each copy checks its own page index:\nnot in [0, num_pages) → zero-filled, never read",
            fontsize=8.3, va="top", color="#a04040")
    ax.set_title("Where key n of sequence b lives: page block_table[b][n / P], slot n % P", fontsize=9.5)
    ax = axes[1]
    L, issue, compute = 6.0, 1.2, 3.0  # schematic units: a DRAM round trip, issue work, a block's math
    rows = [
        ("contiguous", [(0, issue, "#eeeeee", "addresses"), (issue, L, C_LOAD, "K_j, V_j trip"),
                        (issue + L, compute, C_GEMM, "compute")]),
        ("paged", [(0, issue, "#eeeeee", "shifts"), (issue, L, "#c9dcf0", "len + table trip"),
                   (issue + L, issue, "#eeeeee", "pages"), (2 * issue + L, L, C_LOAD, "K_j, V_j trip"),
                   (2 * issue + 2 * L, compute, C_GEMM, "compute")]),
        ("paged: the check", [(issue, L, "#c9dcf0", "its split's entries"), (2 * issue + L, 0.4, "#a04040", ""),
                              (2 * issue + L + 0.4, L - 0.4, "#f4f4f4", "barrier → verdict (NaN if bad)")]),
    ]
    gantt(ax, rows, xlabel="time (schematic, not to scale)")
    ax.set_xticks([])
    ax.set_title("A CTA's start: one more dependent memory trip, the table's, before the first copy;\n"
                 "the barrier on the check's verdict (__syncthreads_or, red) comes after the first copies are requested", fontsize=9)
    fig.tight_layout()
    save(fig, path)


def ring_math():
    """python/attn_ladder/ring_math.py (torch-free), loaded by its path: the ring's schedule."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ring_math", REPO / "python" / "attn_ladder" / "ring_math.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@figure("05_fa2_reordered/figures/context_parallel_ring.png")
def fig_05_context_parallel(path):
    rm, P = ring_math(), 4
    colors = ["#4c72b0", "#dd8452", "#55a868", "#c44e52"]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12.5, 5.2), gridspec_kw={"width_ratios": [1, 1.25]})
    # left: the causal mask in 2P chunks; each computed block in its rank's colour with its step
    C = 2 * P
    blank(ax, (-0.9, C + 0.1), (-0.4, C + 0.9))
    for i in range(C):
        for j in range(i + 1):
            box(ax, j, C - 1 - i, 1, 1, color="#f4f4f4", ec="#bbbbbb", lw=0.5)
    for r in range(P):
        mine = (r, C - 1 - r)
        for step in range(P):
            src, kind = rm.ring_block(r, P, step, True)
            theirs = (src, C - 1 - src)
            pairs = [(qc, kc) for qc in mine for kc in theirs if kc <= qc]
            if kind == "front":
                pairs = [(qc, theirs[0]) for qc in mine]
            elif kind == "back":
                pairs = [(mine[1], kc) for kc in theirs]
            for qc, kc in pairs:
                y = C - 1 - qc
                if qc == kc:  # the diagonal chunk: the kernel's causal flag, half the block
                    ax.add_patch(plt.Polygon([(kc, y + 1), (kc, y), (kc + 1, y)], facecolor=colors[r], ec="black", lw=0.6))
                    ax.text(kc + 0.3, y + 0.3, str(step), fontsize=8, color="white", ha="center", va="center")
                else:
                    box(ax, kc, y, 1, 1, str(step), color=colors[r], tc="white", fs=9, lw=0.6)
    for c in range(C):
        ax.text(-0.45, C - 1 - c + 0.5, f"q{c}", fontsize=8, ha="center", va="center")
        ax.text(c + 0.5, C + 0.3, f"k{c}", fontsize=8, ha="center", va="center")
    ax.set_title(f"zigzag over P = {P}: rank r holds chunks r and {C - 1}−r;\n"
                 "colour = the rank that computes a block, number = its ring step; white = skipped",
                 fontsize=9)
    # right: the forward ring, every rank computes a half block per step while K/V move on
    rows = []
    for r in range(P):
        comp, comm = [], []
        for step in range(P):
            src, kind = rm.ring_block(r, P, step, True)
            comp.append((step, 0.95, colors[r], f"K/V of {src}: {kind}"))
            if step + 1 < P:
                comm.append((step, 0.95, C_WAIT, f"K/V of {src} → rank {(r + 1) % P}"))
        rows += [(f"rank {r} compute", comp), (f"rank {r} NCCL", comm)]
    gantt(ax2, rows, xlabel="ring step (each: ½ of a (N/P)² block; the next K/V arrives meanwhile)")
    ax2.set_xticks(range(P + 1))
    ax2.set_title("the forward ring: K/V shards rotate r → r+1 on a communication stream;\n"
                  "each block's (O, lse) is merged with rung 03's ⊕", fontsize=9)
    fig.tight_layout()
    save(fig, path)


# ---------------------------------------------------------------- 06d and FP8: measured


MEASURED_STEPS = [("K_j ready", C_WAIT), ("turn", "#999999"), ("issue S", C_GEMM), ("V_j−1 ready, issue P V", "#7f9fd0"),
                  ("S lands", "#b0c4e8"), ("softmax under P V", C_SOFT), ("rescale, P → operand", "#f2c6a0")]


def measured_timeline(path, kernel, n, title, softmax_step=("softmax under P V", "softmax of S_ij\n(P V_j−1 running)")):
    """softmax_step: the legend and bar text of the step between S landing and the rescale
    (06d: the softmax while P V runs; FP8 at d = 128 waits for P V first)."""
    m1, m2, head = tile_timeline(kernel, n)
    steps = list(MEASURED_STEPS)
    steps[5] = (softmax_step[0], steps[5][1])
    (whole,) = parse(REF.relative_to(REPO) / "tile_timeline.txt",
                     re.escape(head) + r"[\s\S]*?the whole block\s+[\d.]+ us\s+\((\d+) cycles\)")
    rows = []
    for label, marks in (("consumer WG 1", m1), ("consumer WG 2", m2)):
        rows.append((label, [(marks[k], marks[k + 1] - marks[k], steps[k][1], "") for k in range(len(marks) - 1)]))
    fig, ax = plt.subplots(figsize=(10.5, 2.9))
    gantt(ax, rows, xlabel="SM cycles from WG 1's block_begin (medians over every tile)")
    for k in range(len(rows)):
        marks = m1 if k == 0 else m2
        y = 1 - k
        sm = (marks[5], marks[6])
        ax.text((sm[0] + sm[1]) / 2, y, softmax_step[1], ha="center", va="center", fontsize=7.5)
        ax.text((marks[3] + marks[4]) / 2, y, "wait V_j−1,\nissue P V_j−1", ha="center", va="center", fontsize=7.5)
        span = (f"{marks[-1] - marks[0]:.0f} cycles (step medians; whole-block median {whole})" if k == 0
                else f"{marks[-1] - marks[0]:.0f} cycles")
        ax.text(marks[-1] + 20, y, span, va="center", fontsize=8)
    handles = [Rectangle((0, 0), 1, 1, facecolor=col, edgecolor="black", lw=0.5) for _, col in steps]
    ax.legend(handles, [s for s, _ in steps], fontsize=7.5, ncol=4, loc="upper center",
              bbox_to_anchor=(0.5, -0.32), frameon=False)
    share = 100 * (m1[6] - m1[5]) / whole
    ax.set_title(f"{title} (step '{softmax_step[0]}': {share:.0f} % of WG 1's block)\n{head.split(':')[0]}: the middle K/V block, measured (results/nvidia_h100_80gb_hbm3/tile_timeline.txt)",
                 fontsize=9.5)
    ax.set_xlim(0, max(m1[-1], m2[-1]) * 1.15)
    save(fig, path)


@figure("06_fa3_hopper/figures/06d_timeline.png")
def fig_06d(path):
    measured_timeline(path, "06d", 4096, "06d: each warpgroup's softmax runs under its own P V; WG 2 trails WG 1")


@figure("06_fa3_hopper/figures/fp8_timeline.png")
def fig_fp8_timeline(path):
    measured_timeline(path, "06_fp8", 4096, "06_fp8: the same block with e4m3 GEMMs at twice the rate",
                      softmax_step=("P V lands, then softmax", "P V_j−1 lands,\nthen the softmax"))


@figure("06_fa3_hopper/figures/fp8_layouts.png")
def fig_fp8_layouts(path):
    """V̂ᵀ's key order (wgmma_key_position) and P's packing into the e4m3 A operand."""
    src = source("06_fa3_hopper/fp8h_fa3.cuh")
    if "16h + {2t, 2t+1, 8+2t, 9+2t}" not in src:
        raise RuntimeError("fp8h_fa3.cuh: the key order comment moved: update scripts/figures.py")
    pos = {}
    for t in range(4):  # quad lane t: keys {2t, 2t+1, 8+2t, 9+2t} at positions 4t..4t+3 (per 16 keys)
        for q, key in enumerate((2 * t, 2 * t + 1, 8 + 2 * t, 9 + 2 * t)):
            pos[key] = 4 * t + q
    cmap = plt.get_cmap("tab10")
    fig, axes = plt.subplots(2, 1, figsize=(10, 5.6), gridspec_kw=dict(height_ratios=[1.15, 1]))
    ax = axes[0]
    blank(ax, (-3.2, 16.5), (-0.6, 5.0))
    ax.text(-3.1, 3.9, "S accumulator:\nlane t of a quad\nholds keys", fontsize=8, va="center")
    ax.text(-3.1, 0.6, "V̂ᵀ in smem\n(the transpose\nwrites keys here)", fontsize=8, va="center")
    for key in range(16):
        t = (key % 8) // 2
        box(ax, key, 3.4, 1, 1, str(key), color=matplotlib.colors.to_rgba(cmap(t), 0.45), fs=8)
        box(ax, pos[key], 0.1, 1, 1, str(key), color=matplotlib.colors.to_rgba(cmap(t), 0.45), fs=8)
        ax.add_patch(FancyArrowPatch((key + 0.5, 3.4), (pos[key] + 0.5, 1.1), arrowstyle="-|>", mutation_scale=8,
                                     color=cmap(t), lw=0.8))
    for t in range(4):
        ax.text(4 * t + 2, -0.45, f"lane {t}: one 32-bit register", ha="center", fontsize=7.5, color=cmap(t))
    ax.set_title("FP8 wgmma reads B K-major: for O += P V the K dimension is the keys, so V̂ is transposed in shared memory\n"
                 "(V̂ᵀ [d][keys]), in the key order lane t of the S accumulator already holds: P needs no shuffle "
                 "(wgmma_key_position)", fontsize=9.5)
    ax = axes[1]
    blank(ax, (-3.2, 16.5), (-0.3, 3.6))
    rows = [("Q̂_i [B_r][d]", "A operand, K = d: rows of Q are K-major as stored", "#e6ecf6"),
            ("K̂_j [B_c][d]", "B operand of S = Q Kᵀ, K = d: K-major as stored (TMA)", "#e6ecf6"),
            ("V̂_j [B_c][d] → V̂_jᵀ [d][B_c]", "B operand of O += P V, K = keys: producer warps 1–3 transpose it\n"
             "(ldmatrix.trans, prmt, stmatrix) a block or two ahead of the consumers", "#f3d9a4")]
    for k, (name, what, col) in enumerate(rows):
        y = 2.5 - k * 1.15
        box(ax, -3.1, y, 5.8, 0.9, name, color=col, fs=8.5)
        ax.text(3.1, y + 0.45, what, fontsize=8.5, va="center")
    ax.set_title("e4m3 operands of the two GEMMs (fp8h_fa3.cuh, fp8.md: The layouts)", fontsize=9.5)
    save(fig, path)


# ---------------------------------------------------------------- main, --check

FIG_LINK = re.compile(r"\]\((figures/[^)\s]+\.png)\)")


def lesson_links():
    """{figure path relative to the repository: [lessons linking it]} over every lesson."""
    links = {}
    for md in sorted(REPO.glob("0[1-6]_*/*.md")) + sorted(REPO.glob("*.md")):
        for m in FIG_LINK.finditer(md.read_text()):
            rel = str((md.parent / m.group(1)).resolve().relative_to(REPO))
            links.setdefault(rel, []).append(str(md.relative_to(REPO)))
    return links


def draw(out_root, only=None):
    failures = []
    for rel, fn in FIGURES.items():
        if only and only not in rel:
            continue
        try:
            fn(out_root / rel)
            size = (out_root / rel).stat().st_size
            print(f"  {rel:<58} {size / 1024:6.0f} KiB")
        except Exception as exc:  # report every figure that fails, not just the first
            failures.append(f"{rel}: {type(exc).__name__}: {exc}")
    return failures


def check_links():
    failures = []
    links = lesson_links()
    for rel, lessons in links.items():
        if rel not in FIGURES:
            failures.append(f"{', '.join(lessons)} links {rel}, which scripts/figures.py does not draw")
        elif not (REPO / rel).exists():
            failures.append(f"{', '.join(lessons)} links {rel}, which is not committed: run scripts/figures.py")
    committed = sorted(str(p.relative_to(REPO)) for p in REPO.glob("0[1-6]_*/figures/*.png"))
    for rel in committed:
        if rel not in links and rel not in AWAITING:
            failures.append(f"{rel} is linked by no lesson (link it, or list it in AWAITING with a reason)")
        if rel not in FIGURES:
            failures.append(f"{rel} is not drawn by scripts/figures.py (no hand-made figures)")
    for rel, why in AWAITING.items():
        if rel in links:
            failures.append(f"{rel} is linked now: remove it from AWAITING")
        else:
            print(f"  awaiting a lesson: {rel} ({why})")
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="draw into a temporary folder and check the lessons' links")
    ap.add_argument("--only", help="draw only the figures whose path contains this")
    args = ap.parse_args()
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            print("drawing every figure into a temporary folder:")
            failures = draw(pathlib.Path(tmp))
        failures += check_links()
    else:
        failures = draw(REPO, args.only)
    for f in failures:
        print("FAIL:", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
