// A lab build of rung 06 compiles only the kernels its exercise needs (LAB_fa3_kernels,
// 06_fa3_hopper/CMakeLists.txt), but stages.cu registers every step of the rung and takes
// the address of each launch. This file defines the launches of the kernels left out: each
// throws, so that a stage not built in this lab refuses to run instead of failing to link.
// lab/grader.cmake adds it to a lab build, with LAB_BUILT_<kernel> for each kernel compiled.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <utility>

#include "06_fa3_hopper/fa3_fp8.h"
#include "06_fa3_hopper/fa3_fp8_e4m3.h"
#include "06_fa3_hopper/fa3_launch.h"
#include "common/stage.h"

namespace attn::fa3 {
namespace {

[[noreturn]] void absent(const char* kernel) {
  throw AttnError(std::string("06_fa3_hopper/") + kernel +
                  " is not compiled in this lab build (cmake -DATTN_LAB=...); build the whole ladder to run it");
}

// Takes the address of an instance, which makes the compiler emit it.
template <class Fn>
void keep(Fn fn) {
  static volatile Fn sink;
  sink = fn;
}

}  // namespace

#ifndef LAB_BUILT_06a_tma_wgmma
namespace step06a {
template <int D, typename T>
void launch(const AttnProblem&, const AttnTensors&, cudaStream_t) { absent("06a_tma_wgmma"); }
}  // namespace step06a
template <int... Ds>
void keep_06a(std::integer_sequence<int, Ds...>) {
  ((keep(&step06a::launch<Ds, __nv_bfloat16>), keep(&step06a::launch<Ds, __half>)), ...);
}
template void keep_06a(HeadDims);
#endif

#ifndef LAB_BUILT_06b_warp_specialized
namespace step06b {
template <int D, typename T>
void launch(const AttnProblem&, const AttnTensors&, cudaStream_t) { absent("06b_warp_specialized"); }
}  // namespace step06b
template <int... Ds>
void keep_06b(std::integer_sequence<int, Ds...>) {
  ((keep(&step06b::launch<Ds, __nv_bfloat16>), keep(&step06b::launch<Ds, __half>)), ...);
}
template void keep_06b(HeadDims);
#endif

#ifndef LAB_BUILT_06c_pingpong
namespace step06c {
template <int D, typename T>
void launch(const AttnProblem&, const AttnTensors&, cudaStream_t) { absent("06c_pingpong"); }
}  // namespace step06c
template <int... Ds>
void keep_06c(std::integer_sequence<int, Ds...>) {
  ((keep(&step06c::launch<Ds, __nv_bfloat16>), keep(&step06c::launch<Ds, __half>)), ...);
}
template void keep_06c(HeadDims);
#endif

#ifndef LAB_BUILT_06d_1_overlap
namespace step06d1 {
template <int D, typename T>
void launch(const AttnProblem&, const AttnTensors&, cudaStream_t) { absent("06d_1_overlap"); }
}  // namespace step06d1
template <int... Ds>
void keep_06d1(std::integer_sequence<int, Ds...>) {
  ((keep(&step06d1::launch<Ds, __nv_bfloat16>), keep(&step06d1::launch<Ds, __half>)), ...);
}
template void keep_06d1(StepHeadDims);
#endif

#ifndef LAB_BUILT_06d_2_lazy_softmax
namespace step06d2 {
template <int D, typename T>
void launch(const AttnProblem&, const AttnTensors&, cudaStream_t) { absent("06d_2_lazy_softmax"); }
}  // namespace step06d2
template <int... Ds>
void keep_06d2(std::integer_sequence<int, Ds...>) {
  ((keep(&step06d2::launch<Ds, __nv_bfloat16>), keep(&step06d2::launch<Ds, __half>)), ...);
}
template void keep_06d2(StepHeadDims);
#endif

// 06d_fa3 and 06d_cta_pairs instantiate one template (step06d::launch): a lab builds both
// or neither.
#if !defined(LAB_BUILT_06d_fa3) && !defined(LAB_BUILT_06d_cta_pairs)
namespace step06d {
template <int D, typename T, bool kCtaPairs>
void launch(const AttnProblem&, const AttnTensors&, Schedule, cudaStream_t, float) { absent("06d_fa3"); }
}  // namespace step06d
template <int... Ds>
void keep_06d(std::integer_sequence<int, Ds...>) {
  ((keep(&step06d::launch<Ds, __nv_bfloat16, false>), keep(&step06d::launch<Ds, __half, false>),
    keep(&step06d::launch<Ds, __nv_bfloat16, true>), keep(&step06d::launch<Ds, __half, true>)),
   ...);
}
template void keep_06d(HeadDims);
#elif !defined(LAB_BUILT_06d_fa3) || !defined(LAB_BUILT_06d_cta_pairs)
#error "a lab builds 06d_fa3 and 06d_cta_pairs together or neither (lab/exercises.json: fa3_kernels)"
#endif

// 06g's backward, where a lab builds 06e and 06f (the backward head dims) but not 06g.
#ifndef LAB_BUILT_06g_bwd_one_dq_add
namespace step06g {
template <int D, typename T>
void launch_backward(const AttnProblem&, const AttnBwdTensors&, cudaStream_t) { absent("06g_bwd_one_dq_add"); }
}  // namespace step06g
template <int... Ds>
void keep_06g(std::integer_sequence<int, Ds...>) {
  ((keep(&step06g::launch_backward<Ds, __nv_bfloat16>), keep(&step06g::launch_backward<Ds, __half>)), ...);
}
template void keep_06g(BwdHeadDims);
#endif

// 06h's backward, likewise.
#ifndef LAB_BUILT_06h_bwd_dq_columns
namespace step06h {
template <int D, typename T>
void launch_backward(const AttnProblem&, const AttnBwdTensors&, cudaStream_t) { absent("06h_bwd_dq_columns"); }
}  // namespace step06h
template <int... Ds>
void keep_06h(std::integer_sequence<int, Ds...>) {
  ((keep(&step06h::launch_backward<Ds, __nv_bfloat16>), keep(&step06h::launch_backward<Ds, __half>)), ...);
}
template void keep_06h(BwdHeadDims);
#endif

// 06i's backward, likewise.
#ifndef LAB_BUILT_06i_bwd_shared_space
namespace step06i {
template <int D, typename T>
void launch_backward(const AttnProblem&, const AttnBwdTensors&, cudaStream_t) { absent("06i_bwd_shared_space"); }
}  // namespace step06i
template <int... Ds>
void keep_06i(std::integer_sequence<int, Ds...>) {
  ((keep(&step06i::launch_backward<Ds, __nv_bfloat16>), keep(&step06i::launch_backward<Ds, __half>)), ...);
}
template void keep_06i(BwdHeadDims);
#endif

// 06j's backward, likewise.
#ifndef LAB_BUILT_06j_bwd_issue_order
namespace step06j {
template <int D, typename T>
void launch_backward(const AttnProblem&, const AttnBwdTensors&, cudaStream_t) { absent("06j_bwd_issue_order"); }
}  // namespace step06j
template <int... Ds>
void keep_06j(std::integer_sequence<int, Ds...>) {
  ((keep(&step06j::launch_backward<Ds, __nv_bfloat16>), keep(&step06j::launch_backward<Ds, __half>)), ...);
}
template void keep_06j(BwdHeadDims);
#endif

// 06k's backward, likewise.
#ifndef LAB_BUILT_06k_bwd_tall_steps
namespace step06k {
template <int D, typename T>
void launch_backward(const AttnProblem&, const AttnBwdTensors&, cudaStream_t) { absent("06k_bwd_tall_steps"); }
}  // namespace step06k
template <int... Ds>
void keep_06k(std::integer_sequence<int, Ds...>) {
  ((keep(&step06k::launch_backward<Ds, __nv_bfloat16>), keep(&step06k::launch_backward<Ds, __half>)), ...);
}
template void keep_06k(BwdHeadDims);
#endif

// 06l's backward, likewise.
#ifndef LAB_BUILT_06l_bwd_tma_store
namespace step06l {
template <int D, typename T, bool kDeterministic>
void launch_backward(const AttnProblem&, const AttnBwdTensors&, cudaStream_t) { absent("06l_bwd_tma_store"); }
}  // namespace step06l
template <int... Ds>
void keep_06l(std::integer_sequence<int, Ds...>) {
  ((keep(&step06l::launch_backward<Ds, __nv_bfloat16, false>), keep(&step06l::launch_backward<Ds, __half, false>),
    keep(&step06l::launch_backward<Ds, __nv_bfloat16, true>), keep(&step06l::launch_backward<Ds, __half, true>)),
   ...);
}
template void keep_06l(BwdHeadDims);
#endif

// 06m's backward, likewise.
#ifndef LAB_BUILT_06m_bwd_heavy_first
namespace step06m {
template <int D, typename T>
void launch_backward(const AttnProblem&, const AttnBwdTensors&, cudaStream_t) { absent("06m_bwd_heavy_first"); }
}  // namespace step06m
template <int... Ds>
void keep_06m(std::integer_sequence<int, Ds...>) {
  ((keep(&step06m::launch_backward<Ds, __nv_bfloat16>), keep(&step06m::launch_backward<Ds, __half>)), ...);
}
template void keep_06m(BwdHeadDims);
#endif

// 06n's backward, likewise.
#ifndef LAB_BUILT_06n_bwd_k_in_registers
namespace step06n {
template <int D, typename T>
void launch_backward(const AttnProblem&, const AttnBwdTensors&, cudaStream_t) { absent("06n_bwd_k_in_registers"); }
}  // namespace step06n
template <int... Ds>
void keep_06n(std::integer_sequence<int, Ds...>) {
  ((keep(&step06n::launch_backward<Ds, __nv_bfloat16>), keep(&step06n::launch_backward<Ds, __half>)), ...);
}
template void keep_06n(BwdHeadDims);
#endif

// 06o's backward, likewise.
#ifndef LAB_BUILT_06o_bwd_tail_pieces
namespace step06o {
template <int D, typename T>
void launch_backward(const AttnProblem&, const AttnBwdTensors&, cudaStream_t) { absent("06o_bwd_tail_pieces"); }
}  // namespace step06o
template <int... Ds>
void keep_06o(std::integer_sequence<int, Ds...>) {
  ((keep(&step06o::launch_backward<Ds, __nv_bfloat16>), keep(&step06o::launch_backward<Ds, __half>)), ...);
}
template void keep_06o(BwdHeadDims);
#endif

// 06p's backward, likewise.
#ifndef LAB_BUILT_06p_bwd_dq_writer
namespace step06p {
template <int D, typename T>
void launch_backward(const AttnProblem&, const AttnBwdTensors&, cudaStream_t) { absent("06p_bwd_dq_writer"); }
}  // namespace step06p
template <int... Ds>
void keep_06p(std::integer_sequence<int, Ds...>) {
  ((keep(&step06p::launch_backward<Ds, __nv_bfloat16>), keep(&step06p::launch_backward<Ds, __half>)), ...);
}
template void keep_06p(BwdHeadDims);
#endif

// 06q's backward, likewise.
#ifndef LAB_BUILT_06q_bwd_persistent
namespace step06q {
template <int D, typename T>
void launch_backward(const AttnProblem&, const AttnBwdTensors&, cudaStream_t) { absent("06q_bwd_persistent"); }
}  // namespace step06q
template <int... Ds>
void keep_06q(std::integer_sequence<int, Ds...>) {
  ((keep(&step06q::launch_backward<Ds, __nv_bfloat16>), keep(&step06q::launch_backward<Ds, __half>)), ...);
}
template void keep_06q(BwdHeadDims);
#endif

#ifndef LAB_BUILT_fp8_fa3
template <int D>
void launch_fp8(const AttnProblem&, const AttnTensors&, const Fp8Options&, Schedule, cudaStream_t) {
  absent("fp8_fa3");
}
template <int D>
void launch_fp8_quantize(const AttnProblem&, const AttnTensors&, const Fp8Options&, cudaStream_t) {
  absent("fp8_fa3");
}
template <int D>
void launch_fp8_attention(const AttnProblem&, const AttnTensors&, Schedule, cudaStream_t) {
  absent("fp8_fa3");
}
template <int D>
void launch_fp8_e4m3(const AttnProblem&, const AttnTensors&, Schedule, cudaStream_t) {
  absent("fp8_fa3");
}
template <int... Ds>
void keep_fp8(std::integer_sequence<int, Ds...>) {
  ((keep(&launch_fp8<Ds>), keep(&launch_fp8_quantize<Ds>), keep(&launch_fp8_attention<Ds>),
    keep(&launch_fp8_e4m3<Ds>)),
   ...);
}
template void keep_fp8(Fp8HeadDims);
#endif

}  // namespace attn::fa3
