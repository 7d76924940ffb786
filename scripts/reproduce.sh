#!/usr/bin/env bash
# Run the ladder: build, optionally test, bench every rung on the paper sweep, time the
# PyTorch peers on the same problems, plot, and (for the reference GPU) rewrite the lessons' tables.
#
#   scripts/reproduce.sh [--out DIR] [--tests] [--quick]
#
#   --out DIR  where the CSVs, logs and PNGs go (default results/<gpu>, the GPU's name
#              lowercased, other characters '_', e.g. results/nvidia_h100_80gb_hbm3)
#   --tests    first run the CPU, GPU and Python tests, and compute-sanitizer memcheck,
#              racecheck and synccheck on build/tests/gpu_tests --gtest_filter=$SANITIZE_FILTER
#              (default '*Sanitize*': small shapes of every rung); TESTS_ONLY=1 stops there
#   --quick    d = 128 and N in {1024, 4096} only, instead of the whole paper sweep
#
# Needs an NVIDIA GPU (the reference numbers are from an H100/H200), CMake >= 3.25,
# Ninja and CUDA 13; python3 with torch for the peers and matplotlib for the plots (each
# skipped with a message when missing).
set -euo pipefail

die() { echo "reproduce.sh: $*" >&2; exit 1; }
log() { echo "[$(date +%H:%M:%S)] $*"; }

out_dir=""
run_tests=0
quick=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --out) [[ $# -ge 2 ]] || die "--out needs a folder"; out_dir=$2; shift 2 ;;
    --tests) run_tests=1; shift ;;
    --quick) quick=1; shift ;;
    -h|--help) sed -n '2,15p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

command -v nvidia-smi >/dev/null || die "no GPU: nvidia-smi is not installed. The ladder runs on an NVIDIA GPU (H100/H200 for the reference numbers)."
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | head -n 1) || die "no GPU: nvidia-smi fails: $gpu"
[[ -n $gpu ]] || die "no GPU: nvidia-smi lists none"
gpu_dir=$(echo "$gpu" | tr '[:upper:]' '[:lower:]' | sed 's/[^a-z0-9]/_/g')  # the bench's gpu column
out_dir=${out_dir:-results/$gpu_dir}
mkdir -p "$out_dir"
log "GPU: $gpu; results in $out_dir"

sweep=(--paper-sweep)
if [[ $quick -eq 1 ]]; then
  sweep+=(--d 128 --n "1024,4096")
fi

log "build (cmake --preset default, cmake --build --preset default)"
[[ -f build/build.ninja ]] || cmake --preset default
cmake --build --preset default

if [[ $run_tests -eq 1 ]]; then
  # The GPU tests in one process (ctest would start one per test case); then the Python
  # wrapper; then the sanitizers on the small shapes of every rung.
  log "tests: cpu_tests, gpu_tests (log $out_dir/tests.log)"
  status=0
  { build/tests/cpu_tests --gtest_brief=1 && build/tests/gpu_tests --gtest_brief=1; } 2>&1 | tee "$out_dir/tests.log" || status=1
  ATTN_LADDER_LIB=build/libattn_ladder.so python3 tests/python/test_attn_ladder.py 2>&1 | tee -a "$out_dir/tests.log" || status=1
  filter=${SANITIZE_FILTER:-*Sanitize*}
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
    log "tests: compute-sanitizer --tool $tool, gpu_tests --gtest_filter=$filter (log $out_dir/sanitize_$tool.log)"
    timeout "${SANITIZE_TIMEOUT:-240}" compute-sanitizer --tool "$tool" --error-exitcode 1 build/tests/gpu_tests --gtest_brief=1 --gtest_filter="$filter" \
      > "$out_dir/sanitize_$tool.log" 2>&1 || status=1
    tail -n 4 "$out_dir/sanitize_$tool.log"
  done
  [[ $status -eq 0 ]] || log "tests: FAILURES above (logs in $out_dir)"
  [[ ${TESTS_ONLY:-0} -eq 1 ]] && exit $status
fi

for csv in ladder peers decode backward; do  # a fresh sweep: keep the previous CSVs aside rather than append to them
  if [[ -f $out_dir/$csv.csv ]]; then
    mv "$out_dir/$csv.csv" "$out_dir/$csv.csv.prev"
    log "moved the previous $csv.csv to $csv.csv.prev"
  fi
done

log "bench: attn_bench ${sweep[*]} --check --measure-bytes (log $out_dir/bench.log)"
build/bench/attn_bench "${sweep[@]}" --check --measure-bytes --csv "$out_dir/ladder.csv" 2>&1 | tee "$out_dir/bench.log" ||
  log "bench: some rows FAILED their accuracy bounds (see the table above); going on to the peers and plots"

log "fp8: the FP8 rungs next to 06d bf16 (d = 64, 128, 256, non-causal) and the FA3 Table 3 accuracy table"
build/bench/attn_bench "${sweep[@]}" --rungs 06d_fa3,06_fp8,06_fp8_e4m3,06_fp8_keys_in_order,06_fp8_vt_hbm \
  --dtype bf16,fp8,e4m3 --d 64,128,256 --causal 0 --check \
  --csv "$out_dir/fp8_speed.csv" > "$out_dir/fp8_speed.log" 2>&1 || log "fp8: some rows FAILED (see fp8_speed.log)"
build/bench/fp8_accuracy --time --csv "$out_dir/fp8_accuracy.csv" 2>&1 | tee "$out_dir/fp8_accuracy.log" ||
  log "fp8_accuracy FAILED"

log "decode: 05_fa2_decode on the decode sweep (B 1, 8, 32; Nq 1, 4; Nk 4k-128k; GQA 32/8)"
build/bench/attn_bench --decode-sweep --rungs 05_fa2_decode,05_fa2_reordered,06d_fa3 --csv "$out_dir/decode.csv" \
  > "$out_dir/decode.log" 2>&1 || log "decode: some rows FAILED (see decode.log)"
log "backward: 04, 05 and its dQ-pass and own-keys ablations on the paper sweep, d = 64, 128 (FLOPs 2.5x the forward's)"
build/bench/attn_bench --backward --paper-sweep --d 64,128 --rungs 04_fa1_tiled,05_fa2_reordered,05_fa2_dq_pass,05_fa2_bwd_warps_own_keys --check \
  --csv "$out_dir/backward.csv" > "$out_dir/backward.log" 2>&1 || log "backward: some rows FAILED (see backward.log)"

log "tile timeline: where a persistent 06d / FP8 CTA's time goes, d = 128 (log $out_dir/tile_timeline.txt)"
{
  for n in 2048 4096 16384; do build/bench/tile_timeline --n "$n" && echo; done
  for n in 4096 8192 16384; do build/bench/tile_timeline --fp8 --n "$n" && echo; done
} > "$out_dir/tile_timeline.txt" 2>&1 || log "tile_timeline FAILED"

csvs=("$out_dir/ladder.csv")
if python3 -c 'import torch' 2>/dev/null; then
  log "peers: PyTorch SDPA backends on the same sweep (log $out_dir/peers.log)"
  python3 scripts/peers.py "${sweep[@]}" --csv "$out_dir/peers.csv" 2>&1 | tee "$out_dir/peers.log"
  csvs+=("$out_dir/peers.csv")
  log "06d against cuDNN, timed in turns in one process (vs_cudnn.csv)"
  ATTN_LADDER_LIB=build/libattn_ladder.so python3 scripts/vs_cudnn.py --d 64,128,256 --n 4096,8192,16384 \
    --csv "$out_dir/vs_cudnn.csv" >> "$out_dir/peers.log" 2>&1 || log "vs_cudnn FAILED (see peers.log)"
  for f in decode_peers backward_peers; do [[ -f $out_dir/$f.csv ]] && mv "$out_dir/$f.csv" "$out_dir/$f.csv.prev"; done
  python3 scripts/peers.py --decode-sweep --backends flash,cudnn --csv "$out_dir/decode_peers.csv" >> "$out_dir/peers.log" 2>&1
  python3 scripts/peers.py --backward --paper-sweep --d 64,128 --backends flash,cudnn \
    --csv "$out_dir/backward_peers.csv" >> "$out_dir/peers.log" 2>&1
  log "training: a 2-layer LM, 200 steps, 05's attention against SDPA (train_loss.csv, train_loss.png)"
  ATTN_LADDER_LIB=build/libattn_ladder.so python3 scripts/train_compare.py --out "$out_dir" || log "training FAILED"
else
  log "peers: skipped, python3 cannot import torch"
fi

extra=()  # fp8_vs_bf16.png, decode_vs_nk.png, backward_tflops_vs_n.png: each from its own run
[[ -s $out_dir/fp8_speed.csv ]] && extra=(--fp8 "$out_dir/fp8_speed.csv")
[[ -s $out_dir/decode.csv ]] && extra+=(--decode "$out_dir/decode.csv" $(ls "$out_dir"/decode_peers.csv 2>/dev/null))
[[ -s $out_dir/backward.csv ]] && extra+=(--backward "$out_dir/backward.csv" $(ls "$out_dir"/backward_peers.csv 2>/dev/null))
if python3 -c 'import matplotlib' 2>/dev/null; then
  log "plots into $out_dir"
  python3 scripts/plot.py "${csvs[@]}" "${extra[@]}" --out "$out_dir"
else
  log "plots: skipped, python3 cannot import matplotlib"
fi
# The lessons quote one reference run (scripts/lessons.py's default folder); a run into that
# folder rewrites their tables, any other run leaves them and says how to point them at it.
reference=$(cd results && pwd)/nvidia_h100_80gb_hbm3
if [[ $(cd "$out_dir" && pwd) == "$reference" ]]; then
  log "the lessons' measured tables from $out_dir"
  python3 scripts/lessons.py --results "$out_dir"
else
  log "lessons left as they are (they quote $reference); to see them with this run: scripts/lessons.py --results $out_dir"
fi
log "done: $out_dir"
