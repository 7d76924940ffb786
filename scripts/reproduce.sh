#!/usr/bin/env bash
# Run the ladder: build, optionally test, bench every rung on the paper sweep, time the
# PyTorch peers on the same problems, plot, and (for the reference GPU) rewrite the lessons' tables.
#
#   scripts/reproduce.sh [--out DIR] [--tests] [--quick] [--dry-run]
#
#   --out DIR  where the CSVs, logs and PNGs go (default results/<gpu>, the GPU's name
#              lowercased, other characters '_', e.g. results/nvidia_h100_80gb_hbm3)
#   --tests    first run the CPU, GPU and Python tests, compute-sanitizer memcheck, racecheck
#              and synccheck on build/tests/gpu_tests --gtest_filter=$SANITIZE_FILTER (default
#              '*Sanitize*': small shapes of every rung; each tool cut at $SANITIZE_TIMEOUT s,
#              default 240, the log naming the backward rung and shape it stood at), and the
#              GPU tests of a second build,
#              build-sm80, whose rungs 01-05 are compute_80 PTX only (what an A100 build
#              carries), JIT-compiled on this GPU; TESTS_ONLY=1 stops there
#   --quick    every plot and lesson table from fewer rows: d = 128, N in {1024, 4096}, fewer
#              timed runs, the decode sweep at one query row, no fp64 check of the backward,
#              50 training steps, no whole-step timing of the two 4-layer models
#              (about 3 minutes on an H100/H200 after the build)
#   --dry-run  print the steps and their estimated times, run nothing (needs no GPU)
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
dry_run=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --out) [[ $# -ge 2 ]] || die "--out needs a folder"; out_dir=$2; shift 2 ;;
    --tests) run_tests=1; shift ;;
    --quick) quick=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) sed -n '2,21p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

# What each step runs, full and --quick. A row is one (rung or peer, problem) timing.
sweep=(--paper-sweep)        # attn_bench and peers.py: B*N = 16384, N 512..16384, d 64/128/256, both masks
timing=()                    # attn_bench: 20 timed runs after a 0.3 s warm-up per row
peer_timing=()               # peers.py: 20 timed runs
fp8_shape=(--d 64,128,256)   # the FP8 rungs, non-causal
fp8_accuracy=(--time)        # the RMSE table and the FP8 kernels' times
decode_nq=()                 # the decode sweep: Nq 1 and 4
bwd_shape=(--d 64,128)
bwd_check=(--check)
timeline_n=(2048 4096 16384)
timeline_fp8_n=(4096 8192 16384)
timeline_bwd_n=(2048 16384)  # the backward's CTAs (06k, 06l), d = 128 and 64
vs_cudnn=(--d 64,128,256 --n 4096,8192,16384)
vs_cudnn_bwd=(--d 64,128 --n 2048,4096,8192,16384)  # 06d's and 05's backward, cuDNN's in turns
train_steps=200
# Rows per step: problems x rungs (or backends). 21 forward rungs at d = 64/128, fewer at 256
# (taken as 21), 5 FP8 rungs, 3 decode rungs, 4 backward rungs, 4 SDPA backends (2 for decode
# and backward); vs_cudnn: problems x rounds.
rows_bench=$((6 * 3 * 2 * 21)) rows_fp8=$((6 * 3 * 5)) rows_decode=$((3 * 2 * 4 * 3)) rows_bwd=$((6 * 2 * 2 * 6))
rows_peers=$((6 * 3 * 2 * 4)) rows_vs=$((3 * 3 * 2 * 4 + 4 * 2 * 2 * 4 * 3 / 2)) rows_decode_peers=$((3 * 2 * 4 * 2)) rows_bwd_peers=$((6 * 2 * 2 * 2))
if [[ $quick -eq 1 ]]; then
  sweep+=(--d 128 --n 1024,4096)
  timing=(--repeats 10 --warm-seconds 0.1)
  peer_timing=(--repeats 10)
  fp8_shape=(--d 128 --n 4096)
  fp8_accuracy=()
  decode_nq=(--n 1)
  bwd_shape=(--d 128 --n 1024,4096)
  bwd_check=()
  timeline_n=(4096)
  timeline_fp8_n=(4096)
  timeline_bwd_n=(2048)
  vs_cudnn=(--d 128 --n 4096 --causal 0 --rounds 2 --repeats 10)
  vs_cudnn_bwd=(--d 128 --n 4096 --causal 0 --rounds 2 --repeats 10)
  train_steps=50
  rows_bench=$((2 * 2 * 21)) rows_fp8=5 rows_decode=$((3 * 4 * 3)) rows_bwd=$((2 * 2 * 6))
  rows_peers=$((2 * 2 * 2)) rows_vs=5 rows_decode_peers=$((3 * 4 * 2)) rows_bwd_peers=$((2 * 2 * 2))
fi
peer_backends=(--backends flash,cudnn,efficient,math)
[[ $quick -eq 1 ]] && peer_backends=(--backends flash,cudnn)  # the two that the README and the lessons show

# Estimated seconds per step, from its rows and a rough cost per row on an H100/H200: a bench
# row 1 s full (0.3 s warm-up, 20 timed runs with an L2 flush each, the fp64 check of 64
# sampled rows per head, one CUPTI pass) and 0.5 s quick; a backward row 2 s (three passes,
# the fp64 check) and 1 s without the check; a decode row 0.5 s; each Python step 10 s more
# for importing torch. Long rows (N = 16384 on 01-04) dominate the full sweep: take these as
# the order of magnitude, not a promise.
row=2  # a bench or peer row, in half-seconds
[[ $quick -eq 1 ]] && row=1
steps=() est=()
plan() { steps+=("$1"); est+=("$2"); }
[[ $run_tests -eq 1 ]] && plan "tests: CPU, GPU and Python; sanitizers; the compute_80 build's GPU tests" 1200
plan "bench: every rung on the sweep" $((rows_bench * row / 2 + 10))
plan "fp8: the FP8 rungs and the accuracy table" $((rows_fp8 * row / 2 + ${#fp8_accuracy[@]} * 40 + 10))
plan "decode: flash-decoding on the decode sweep; bandwidth vs bytes in flight" $((rows_decode / 2 + 10))
plan "backward: 04, 05 and its ablations, 06e-06q" $((rows_bwd * (${#bwd_check[@]} + 1) + 5))
plan "tile timeline: where a persistent CTA's time goes" $(((${#timeline_n[@]} + ${#timeline_fp8_n[@]} + ${#timeline_bwd_n[@]}) * 3))
plan "peers: PyTorch SDPA on the same sweep, decode and backward" \
  $((rows_peers * row / 2 + rows_decode_peers / 2 + rows_bwd_peers * 2 + 90))
plan "vs_cudnn: 06d (and 05's backward) and cuDNN in turns, forward and backward" $((rows_vs + 10))
train_step_s=0  # full run only: whole training steps of two larger models, 06d and 05 against SDPA
[[ $quick -eq 0 ]] && train_step_s=40
plan "training: a 2-layer LM, 05 against SDPA$([[ $quick -eq 0 ]] && echo '; whole steps of two 4-layer models')" \
  $((train_steps / 5 + 15 + train_step_s))
plan "plots and the lessons' tables" 25

total=0
for e in "${est[@]}"; do total=$((total + e)); done
minutes() { if [[ $1 -lt 90 ]]; then echo "$1 s"; else echo "$(((${1} + 30) / 60)) min"; fi; }
mode="full"; [[ $quick -eq 1 ]] && mode="--quick"
echo "reproduce.sh ($mode): ${#steps[@]} steps after the build, about $(minutes $total) in all (estimates: rows x a cost per row, see the script)"
for i in "${!steps[@]}"; do
  printf '  [step %d/%d] %s: ~%s\n' $((i + 1)) ${#steps[@]} "${steps[$i]}" "$(minutes "${est[$i]}")"
done
[[ $dry_run -eq 1 ]] && exit 0

step_index=0
step() {  # the next planned step's progress line, with its estimate
  log "[step $((step_index + 1))/${#steps[@]}] ${steps[$step_index]}: ~$(minutes "${est[$step_index]}") ($*)"
  step_index=$((step_index + 1))
}

command -v nvidia-smi >/dev/null || die "no GPU: nvidia-smi is not installed. The ladder runs on an NVIDIA GPU (H100/H200 for the reference numbers)."
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | head -n 1) || die "no GPU: nvidia-smi fails: $gpu"
[[ -n $gpu ]] || die "no GPU: nvidia-smi lists none"
gpu_dir=$(echo "$gpu" | tr '[:upper:]' '[:lower:]' | sed 's/[^a-z0-9]/_/g')  # the bench's gpu column
out_dir=${out_dir:-results/$gpu_dir}
mkdir -p "$out_dir"
log "GPU: $gpu; results in $out_dir"

log "build (cmake --preset default, cmake --build --preset default)"
[[ -f build/build.ninja ]] || cmake --preset default
cmake --build --preset default

if [[ $run_tests -eq 1 ]]; then
  # The GPU tests in one process (ctest would start one per suite); then the Python
  # wrapper; then the sanitizers on the small shapes of every rung.
  step "log $out_dir/tests.log"
  status=0
  { build/tests/cpu_tests --gtest_brief=1 && build/tests/gpu_tests --gtest_brief=1; } 2>&1 | tee "$out_dir/tests.log" || status=1
  ATTN_LADDER_LIB=build/libattn_ladder.so python3 tests/python/test_attn_ladder.py 2>&1 | tee -a "$out_dir/tests.log" || status=1
  filter=${SANITIZE_FILTER:-*Sanitize*}
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
    log "tests: compute-sanitizer --tool $tool, gpu_tests --gtest_filter=$filter (log $out_dir/sanitize_$tool.log)"
    # ATTN_TEST_PROGRESS: the backward tests name each rung and shape before its run
    ATTN_TEST_PROGRESS=1 timeout "${SANITIZE_TIMEOUT:-240}" compute-sanitizer --tool "$tool" --error-exitcode 1 \
      build/tests/gpu_tests --gtest_brief=1 --gtest_filter="$filter" > "$out_dir/sanitize_$tool.log" 2>&1 && rc=0 || rc=$?
    [[ $rc -eq 0 ]] || status=1
    [[ $rc -eq 124 ]] && log "tests: $tool cut at ${SANITIZE_TIMEOUT:-240} s, at: $(grep -a '^\[progress\]' "$out_dir/sanitize_$tool.log" | tail -n 1)"
    { grep -av '^\[progress\]' "$out_dir/sanitize_$tool.log" || true; } | tail -n 4
  done
  # Other GPUs: rungs 01-05 as compute_80 PTX alone (06 is always sm_90a), so this GPU's
  # driver JIT-compiles them as it would on an A100; their launches check shared memory
  # against this GPU's limit (common/smem_limit.h).
  log "tests: build-sm80 (CMAKE_CUDA_ARCHITECTURES=80-virtual), its gpu_tests (appended to $out_dir/tests.log)"
  { cmake -S . -B build-sm80 -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=80-virtual >/dev/null &&
    cmake --build build-sm80 --target gpu_tests >/dev/null &&
    echo "# build-sm80: rungs 01-05 as compute_80 PTX, JIT-compiled on $gpu" &&
    build-sm80/tests/gpu_tests --gtest_brief=1; } 2>&1 | tee -a "$out_dir/tests.log" || status=1
  [[ $status -eq 0 ]] || log "tests: FAILURES above (logs in $out_dir)"
  [[ ${TESTS_ONLY:-0} -eq 1 ]] && exit $status
fi

for csv in ladder peers decode backward; do  # a fresh sweep: keep the previous CSVs aside rather than append to them
  if [[ -f $out_dir/$csv.csv ]]; then
    mv "$out_dir/$csv.csv" "$out_dir/$csv.csv.prev"
    log "moved the previous $csv.csv to $csv.csv.prev"
  fi
done

step "attn_bench ${sweep[*]} ${timing[*]} --check --measure-bytes, log $out_dir/bench.log"
build/bench/attn_bench "${sweep[@]}" "${timing[@]}" --check --measure-bytes --csv "$out_dir/ladder.csv" 2>&1 | tee "$out_dir/bench.log" ||
  log "bench: some rows FAILED their accuracy bounds (see the table above); going on to the peers and plots"

step "06d bf16 next to the FP8 rungs, ${fp8_shape[*]}, non-causal; FA3 Table 3's accuracy"
build/bench/attn_bench --paper-sweep "${fp8_shape[@]}" "${timing[@]}" --rungs 06d_fa3,06_fp8,06_fp8_e4m3,06_fp8_keys_in_order,06_fp8_vt_hbm \
  --dtype bf16,fp8,e4m3 --causal 0 --check \
  --csv "$out_dir/fp8_speed.csv" > "$out_dir/fp8_speed.log" 2>&1 || log "fp8: some rows FAILED (see fp8_speed.log)"
build/bench/fp8_accuracy "${fp8_accuracy[@]}" --csv "$out_dir/fp8_accuracy.csv" 2>&1 | tee "$out_dir/fp8_accuracy.log" ||
  log "fp8_accuracy FAILED"

step "05_fa2_decode, 05, 06d: B 1, 8, 32; Nq ${decode_nq[1]:-1, 4}; Nk 4k-128k; GQA 32/8"
build/bench/attn_bench --decode-sweep "${decode_nq[@]}" "${timing[@]}" --rungs 05_fa2_decode,05_fa2_reordered,06d_fa3 --csv "$out_dir/decode.csv" \
  > "$out_dir/decode.log" 2>&1 || log "decode: some rows FAILED (see decode.log)"
build/bench/inflight_bw --csv "$out_dir/inflight.csv" >> "$out_dir/decode.log" 2>&1 || log "inflight_bw FAILED (see decode.log)"
step "the paper sweep ${bwd_shape[*]}, FLOPs 2.5x the forward's"
build/bench/attn_bench --backward --paper-sweep "${bwd_shape[@]}" "${timing[@]}" "${bwd_check[@]}" \
  --rungs 04_fa1_tiled,05_fa2_reordered,05_fa2_dq_pass,05_fa2_bwd_warps_own_keys,06d_fa3,06e_bwd_wgmma,06f_bwd_dq_reduce,06g_bwd_one_dq_add,06h_bwd_dq_columns,06i_bwd_shared_space,06j_bwd_issue_order,06k_bwd_tall_steps,06l_bwd_tma_store,06m_bwd_heavy_first,06n_bwd_k_in_registers,06o_bwd_tail_pieces,06p_bwd_dq_writer,06q_bwd_persistent \
  --csv "$out_dir/backward.csv" > "$out_dir/backward.log" 2>&1 || log "backward: some rows FAILED (see backward.log)"

step "06d and FP8, d = 128; the backward's CTAs (06k, 06l); log $out_dir/tile_timeline.txt"
{
  for n in "${timeline_n[@]}"; do build/bench/tile_timeline --n "$n" && echo; done
  for n in "${timeline_fp8_n[@]}"; do build/bench/tile_timeline --fp8 --n "$n" && echo; done
  for n in "${timeline_bwd_n[@]}"; do build/bench/tile_timeline --backward --n "$n" && echo; done
} > "$out_dir/tile_timeline.txt" 2>&1 || log "tile_timeline FAILED"

csvs=("$out_dir/ladder.csv")
if python3 -c 'import torch' 2>/dev/null; then
  step "${peer_backends[*]}, log $out_dir/peers.log"
  python3 scripts/peers.py "${sweep[@]}" "${peer_backends[@]}" "${peer_timing[@]}" --csv "$out_dir/peers.csv" 2>&1 | tee "$out_dir/peers.log"
  csvs+=("$out_dir/peers.csv")
  for f in decode_peers backward_peers; do [[ -f $out_dir/$f.csv ]] && mv "$out_dir/$f.csv" "$out_dir/$f.csv.prev"; done
  python3 scripts/peers.py --decode-sweep "${decode_nq[@]}" "${peer_timing[@]}" --backends flash,cudnn \
    --csv "$out_dir/decode_peers.csv" >> "$out_dir/peers.log" 2>&1
  # 05_fa2_decode contiguous and paged (pages of 64 and 256) against cuDNN and flash, in CUDA graphs
  [[ -f $out_dir/decode_paged.csv ]] && mv "$out_dir/decode_paged.csv" "$out_dir/decode_paged.csv.prev"
  ATTN_LADDER_LIB=build/libattn_ladder.so python3 scripts/decode_bench.py "${decode_nq[@]/--n/--nq}" \
    --csv "$out_dir/decode_paged.csv" >> "$out_dir/peers.log" 2>&1 || log "decode_bench FAILED (see peers.log)"
  python3 scripts/peers.py --backward --paper-sweep "${bwd_shape[@]}" "${peer_timing[@]}" --backends flash,cudnn \
    --csv "$out_dir/backward_peers.csv" >> "$out_dir/peers.log" 2>&1
  step "${vs_cudnn[*]}, vs_cudnn.csv"
  ATTN_LADDER_LIB=build/libattn_ladder.so python3 scripts/vs_cudnn.py "${vs_cudnn[@]}" \
    --csv "$out_dir/vs_cudnn.csv" >> "$out_dir/peers.log" 2>&1 || log "vs_cudnn FAILED (see peers.log)"
  ATTN_LADDER_LIB=build/libattn_ladder.so python3 scripts/vs_cudnn.py --backward --rung 06d_fa3,05_fa2_reordered \
    "${vs_cudnn_bwd[@]}" --csv "$out_dir/vs_cudnn.csv" --append >> "$out_dir/peers.log" 2>&1 ||
    log "vs_cudnn --backward FAILED (see peers.log)"
  step "$train_steps steps, train_loss.csv, train_loss.png"
  ATTN_LADDER_LIB=build/libattn_ladder.so python3 scripts/train_compare.py --steps "$train_steps" --out "$out_dir" ||
    log "training FAILED"
  if [[ $quick -eq 0 ]]; then
    [[ -f $out_dir/train_step.csv ]] && mv "$out_dir/train_step.csv" "$out_dir/train_step.csv.prev"
    ATTN_LADDER_LIB=build/libattn_ladder.so python3 scripts/train_step_bench.py --csv "$out_dir/train_step.csv" ||
      log "train_step_bench FAILED"
  fi
else
  step_index=$((step_index + 3))
  log "peers, vs_cudnn, training: skipped, python3 cannot import torch"
fi

step "into $out_dir"
extra=()  # fp8_vs_bf16.png, decode_vs_nk.png, backward_tflops_vs_n.png: each from its own run
[[ -s $out_dir/fp8_speed.csv ]] && extra=(--fp8 "$out_dir/fp8_speed.csv")
[[ -s $out_dir/decode.csv ]] && extra+=(--decode "$out_dir/decode.csv" $(ls "$out_dir"/decode_peers.csv 2>/dev/null))
[[ -s $out_dir/backward.csv ]] && extra+=(--backward "$out_dir/backward.csv" $(ls "$out_dir"/backward_peers.csv 2>/dev/null))
[[ -s $out_dir/decode_paged.csv ]] && extra+=(--decode-paged "$out_dir/decode_paged.csv")
[[ -s $out_dir/inflight.csv ]] && extra+=(--inflight "$out_dir/inflight.csv")
[[ -s $out_dir/train_step.csv ]] && extra+=(--train-step "$out_dir/train_step.csv")
if python3 -c 'import matplotlib' 2>/dev/null; then
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
