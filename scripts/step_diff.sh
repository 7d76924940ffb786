#!/usr/bin/env bash
# The diff between two steps of rung 06, each a kernel file of its own:
#   scripts/step_diff.sh 06a 06b     diff -u of 06a_tma_wgmma.cuh and 06b_warp_specialized.cuh
#   scripts/step_diff.sh             each consecutive pair's diff stat, and this usage
# Steps: 06a 06b 06c 06d1 06d2 06d fp8a fp8b fp8c (FP8: fp8.md; fp8c_fa3.cuh is the final kernel).
set -euo pipefail

dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/../06_fa3_hopper" && pwd)"
steps=(06a 06b 06c 06d1 06d2 06d fp8a fp8b fp8c)
usage="usage: scripts/step_diff.sh [STEP STEP]   (steps: ${steps[*]})"

file_of() {
  case "$1" in
    06a) echo 06a_tma_wgmma.cuh ;;
    06b) echo 06b_warp_specialized.cuh ;;
    06c) echo 06c_pingpong.cuh ;;
    06d1) echo 06d_1_overlap.cuh ;;
    06d2) echo 06d_2_lazy_softmax.cuh ;;
    06d) echo 06d_fa3.cuh ;;
    fp8a) echo fp8a_e4m3_gemms.cuh ;;
    fp8b) echo fp8b_transpose_v.cuh ;;
    fp8c | fp8) echo fp8c_fa3.cuh ;;
    *) echo "step_diff.sh: unknown step '$1'" >&2; echo "$usage" >&2; exit 2 ;;
  esac
}

if [[ $# -eq 0 ]]; then
  for ((i = 0; i + 1 < ${#steps[@]}; ++i)); do
    a=$(file_of "${steps[i]}") b=$(file_of "${steps[i + 1]}")
    stat=$(cd "$dir" && diff "$a" "$b" | grep -c '^[<>]' || true)
    printf '%s -> %s  %-26s %-26s %4s lines changed\n' "${steps[i]}" "${steps[i + 1]}" "$a" "$b" "$stat"
  done
  echo "$usage"
  exit 0
fi
[[ $# -eq 2 ]] || { echo "$usage" >&2; exit 2; }
a=$(file_of "$1")
b=$(file_of "$2")
cd "$dir"
diff -u "$a" "$b" || [[ $? -eq 1 ]]  # diff exits 1 when the files differ
