#!/usr/bin/env bash
# Profile one rung with Nsight Compute: DRAM bytes, tensor-pipe activity, achieved
# occupancy and the top warp stall reasons of each kernel the bench launches for it.
#
#   scripts/profile.sh RUNG [bench args]
#   scripts/profile.sh 05_fa2_reordered --d 128 --n 4096 --causal 0
#
# Runs build/bench/attn_bench --rungs RUNG --repeats 1 --no-ceilings [bench args] under
# ncu with --clock-control none (the clocks the bench itself sees) and ATTN_NO_CUPTI=1
# (ncu and the in-process CUPTI counter cannot share the hardware counters). The report
# goes to $PROFILE_OUT/RUNG.ncu-rep (default results/profile/); a table per kernel name
# is printed at the end. ncu replays each kernel and flushes caches between passes, so
# its DRAM bytes are a cross-check of the bench's --measure-bytes columns.
#
# Environment: ATTN_BENCH (bench binary), NCU (ncu binary), PROFILE_OUT (folder),
# PROFILE_KERNELS (regex: profile only kernels whose name matches; default all, which
# includes the bench's input fills next to the rung's own kernels).
set -euo pipefail

die() { echo "profile.sh: $*" >&2; exit 1; }

[[ $# -ge 1 && $1 != -* ]] || die "usage: scripts/profile.sh RUNG [bench args]"
rung=$1
shift

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bench=${ATTN_BENCH:-$repo/build/bench/attn_bench}
ncu=${NCU:-ncu}
out_dir=${PROFILE_OUT:-$repo/results/profile}
report=$out_dir/$rung

command -v "$ncu" >/dev/null || die "Nsight Compute ($ncu) not found; install it or set NCU=/path/to/ncu"
[[ -x $bench ]] || die "$bench not found; build first: cmake --preset default && cmake --build --preset default"
mkdir -p "$out_dir"

metrics=(
  gpu__time_duration.sum
  dram__bytes_read.sum
  dram__bytes_write.sum
  # Tensor pipe busy: on GH100 this counts mma.sync (HMMA) and wgmma (HGMMA/QGMMA) alike;
  # GH100 has no sm__pipe_tensor_op_gmma_cycles_active, so wgmma use shows as an
  # instruction count instead (0 for a kernel built on mma.sync).
  sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
  smsp__inst_executed_pipe_tensor_op_gmma.sum
  sm__warps_active.avg.pct_of_peak_sustained_active  # achieved occupancy
  smsp__issue_active.avg.pct_of_peak_sustained_active  # cycles an instruction issued
  l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_active  # shared-memory pipe busy
  l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum  # extra wavefronts from bank conflicts
)
kernel_filter=()
if [[ -n ${PROFILE_KERNELS:-} ]]; then
  kernel_filter=(--kernel-name "regex:$PROFILE_KERNELS")
fi

echo "profile.sh: $ncu on $bench --rungs $rung --repeats 1 --no-ceilings $*"
ATTN_NO_CUPTI=1 "$ncu" --clock-control none \
  --metrics "$(IFS=,; echo "${metrics[*]}")" \
  --section WarpStateStats \
  ${kernel_filter[@]+"${kernel_filter[@]}"} \
  --force-overwrite --export "$report" \
  "$bench" --rungs "$rung" --repeats 1 --no-ceilings "$@"

raw=$report.csv
"$ncu" --import "$report.ncu-rep" --csv --page raw --print-units base --print-kernel-base function >"$raw"
echo "profile.sh: report $report.ncu-rep, raw metrics $raw"

# Summary: one line per kernel name, per-launch means: time, DRAM MB, tensor pipe busy %,
# wgmma warp instructions (thousands), achieved occupancy %, issue-slot and shared-memory
# pipe utilization %, bank-conflict wavefronts (thousands), and the three largest stall
# reasons in warp cycles per issued instruction (WarpStateStats).
python3 - "$raw" <<'EOF'
import csv, re, sys
from collections import defaultdict

STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio")
COLUMNS = {
    "time_us": "gpu__time_duration.sum",
    "read_MB": "dram__bytes_read.sum",
    "write_MB": "dram__bytes_write.sum",
    "tensor_%": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "wgmma_k": "smsp__inst_executed_pipe_tensor_op_gmma.sum",
    "occup_%": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "issue_%": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "smem_%": "l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_active",
    "conflict_k": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
}
HARNESS_KERNELS = {"fill_kernel", "nonfinite_kernel", "diff_norm_kernel", "read_kernel"}  # common/device_buffer.cu
SCALE = {"time_us": 1e-3, "read_MB": 1e-6, "write_MB": 1e-6, "wgmma_k": 1e-3, "conflict_k": 1e-3}  # ns -> us, B -> MB, -> thousands

def value(text):
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None

with open(sys.argv[1], newline="") as f:
    rows = [r for r in csv.DictReader(f) if r.get("ID", "").strip().isdigit()]  # skip the units row
if not rows:
    sys.exit("profile.sh: ncu profiled no kernel (check PROFILE_KERNELS and the bench arguments)")

kernels = defaultdict(list)
for r in rows:
    kernels[r["Kernel Name"]].append(r)

def mean(rs, column):
    vals = [v for v in (value(r.get(column)) for r in rs) if v is not None]
    return sum(vals) / len(vals) if vals else None

def line(name, rs):
    cells = []
    for key, column in COLUMNS.items():
        m = mean(rs, column)
        cells.append(f"{m * SCALE.get(key, 1):9.1f}" if m is not None else f"{'-':>9s}")
    stalls = {STALL.match(c).group(1): mean(rs, c) for c in rs[0] if STALL.match(c)}
    stalls.pop("selected", None)  # the issuing warp: not a stall
    top = sorted(((v, k) for k, v in stalls.items() if v), reverse=True)[:3]
    short = name if len(name) <= 42 else name[:39] + "..."
    print(f"{short:42s} {len(rs):3d} " + " ".join(cells) + "  " + ", ".join(f"{k} {v:.1f}" for v, k in top))

def dram_mb(groups, column):
    return sum(value(r.get(column)) or 0 for rs in groups for r in rs) / 1e6

rung = {n: rs for n, rs in kernels.items() if n not in HARNESS_KERNELS}
harness = {n: rs for n, rs in kernels.items() if n in HARNESS_KERNELS}
head = f"{'kernel':42s} {'n':>3s} " + " ".join(f"{c:>9s}" for c in COLUMNS) + "  top stalls (cycles/issue)"
print(head)
print("-" * len(head))
for name, rs in rung.items():
    line(name, rs)
print(f"rung kernels, all launches: DRAM read {dram_mb(rung.values(), COLUMNS['read_MB']):.1f} MB, "
      f"write {dram_mb(rung.values(), COLUMNS['write_MB']):.1f} MB")
if harness:
    print("harness kernels (input fills, output checks, L2 flush):")
    for name, rs in harness.items():
        line(name, rs)
EOF
