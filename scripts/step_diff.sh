#!/usr/bin/env bash
# The diff between two steps of a rung built up in steps (05, 06), each a kernel file:
#   scripts/step_diff.sh 05a 05b     diff -u of 05a_q_outer.cuh and 05b_ldmatrix.cuh
#   scripts/step_diff.sh             changed lines (added + removed, git diff --numstat) of
#                                    each consecutive pair of 05 and of 06, and this usage
#   scripts/step_diff.sh --check     exits 1 if a consecutive pair changes more than $budget
#                                    lines and is not listed in `exceptions` with its reason
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
budget=300

# ---- rung 05: its steps, in order, and their files (05_fa2_reordered/)
steps05=(05a 05b 05c 05d)
declare -A file05=(
  [05a]=05a_q_outer.cuh
  [05b]=05b_ldmatrix.cuh
  [05c]=05c_cp_async.cuh
  [05d]=05d_fa2_reordered.cuh
)

# ---- rung 06: its steps, in order, and their files (06_fa3_hopper/). FP8 (fp8.md) climbs from
# 06d_fa3.cuh in eight steps; fp8h_fa3.cuh is the final kernel (stages 06_fp8, 06_fp8_e4m3).
steps06=(06a 06b 06c 06d1 06d2 06d fp8a fp8b fp8c fp8d fp8e fp8f fp8g fp8h)
declare -A file06=(
  [06a]=06a_tma_wgmma.cuh
  [06b]=06b_warp_specialized.cuh
  [06c]=06c_pingpong.cuh
  [06d1]=06d_1_overlap.cuh
  [06d2]=06d_2_lazy_softmax.cuh
  [06d]=06d_fa3.cuh
  [fp8a]=fp8a_no_cta_pairs.cuh
  [fp8b]=fp8b_eager_rescale.cuh
  [fp8c]=fp8c_e4m3_gemms.cuh
  [fp8d]=fp8d_block_scales.cuh
  [fp8e]=fp8e_softmax_placement.cuh
  [fp8f]=fp8f_transpose_v.cuh
  [fp8g]=fp8g_permute_p.cuh
  [fp8h]=fp8h_fa3.cuh
  [06e]=06e_bwd_wgmma.cuh
  [06f]=06f_bwd_dq_reduce.cuh
  [06g]=06g_bwd_one_dq_add.cuh
  [06h]=06h_bwd_dq_columns.cuh
  [06i]=06i_bwd_shared_space.cuh
  [06j]=06j_bwd_issue_order.cuh
  [06k]=06k_bwd_tall_steps.cuh
  [06l]=06l_bwd_tma_store.cuh
  [06m]=06m_bwd_heavy_first.cuh
  [06n]=06n_bwd_k_in_registers.cuh
  [06o]=06o_bwd_tail_pieces.cuh
  [06p]=06p_bwd_dq_writer.cuh
  [06q]=06q_bwd_persistent.cuh
)
# The backward of 06d (06e_bwd.md) climbs in its own chain: 06e, then 06f's dQ reduction,
# then 06g's one reduction per CTA, then 06h's dQ split by columns, then 06i's shared
# address space, then 06j's issue order, 06k's taller steps, 06l's TMA epilogue, 06m's
# grid order, 06n's K_j in registers, 06o's pieces of the last wave, 06p's dQ writer and
# 06q's persistent CTAs.
steps06bwd=(06e 06f 06g 06h 06i 06j 06k 06l 06m 06n 06o 06p 06q)

# ---- pairs allowed past the budget, "from->to" -> reason (none at present)
declare -A exceptions=()

usage="usage: scripts/step_diff.sh [STEP STEP | --check]   (steps: ${steps05[*]} ${steps06[*]} ${steps06bwd[*]})"

# path of a step's file, relative to the repository root
path_of() {
  if [[ -n "${file05[$1]:-}" ]]; then echo "05_fa2_reordered/${file05[$1]}"
  elif [[ -n "${file06[$1]:-}" ]]; then echo "06_fa3_hopper/${file06[$1]}"
  else echo "step_diff.sh: unknown step '$1'" >&2; echo "$usage" >&2; exit 2
  fi
}

# added + removed lines between two files
changed() {
  git -C "$root" diff --no-index --numstat "$1" "$2" | awk '{ n += $1 + $2 } END { print n + 0 }' || true
}

# one line per consecutive pair of the steps given; sets `over` to the pairs past the budget
over=()
table() {
  local -a steps=("$@")
  for ((i = 0; i + 1 < ${#steps[@]}; ++i)); do
    local from=${steps[i]} to=${steps[i + 1]}
    local a b n note=""
    a=$(path_of "$from") b=$(path_of "$to")
    n=$(changed "$a" "$b")
    if ((n > budget)); then
      if [[ -n "${exceptions[$from->$to]:-}" ]]; then note="  over $budget, listed: ${exceptions[$from->$to]}"
      else note="  OVER $budget"; over+=("$from->$to"); fi
    fi
    printf '%-4s -> %-4s %-40s %5s lines changed%s\n' "$from" "$to" "$(basename "$a") -> $(basename "$b")" "$n" "$note"
  done
}

if [[ $# -eq 0 || "${1:-}" == "--check" ]]; then
  table "${steps05[@]}"
  table "${steps06[@]}"
  table "${steps06bwd[@]}"
  if [[ "${1:-}" == "--check" ]]; then
    if ((${#over[@]})); then
      echo "step_diff.sh --check: over the budget of $budget changed lines: ${over[*]}" >&2
      echo "(split the step, or list the pair in 'exceptions' with its reason)" >&2
      exit 1
    fi
    echo "step_diff.sh --check: every consecutive pair within $budget lines or listed"
  else
    echo "$usage"
  fi
  exit 0
fi
[[ $# -eq 2 ]] || { echo "$usage" >&2; exit 2; }
a=$(path_of "$1")
b=$(path_of "$2")
cd "$root"
diff -u "$a" "$b" || [[ $? -eq 1 ]]  # diff exits 1 when the files differ
