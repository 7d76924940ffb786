// Compile-only check of the FP8 steps before the final kernel (fp8.md): fp8a_no_cta_pairs.cuh
// ... fp8g_permute_p.cuh are the literal intermediates between 06d_fa3.cuh and fp8h_fa3.cuh,
// registered as no stage. Each is instantiated here for d = 128 (fp8a and fp8b on bf16; fp8g
// on the path it adds, Fp8VPath::in_kernel_keys_in_order), so that a step file that stops
// compiling, or spills (the sm_90a build fails on spills), fails the build. Nothing calls
// these launches.
#include "06_fa3_hopper/fp8a_no_cta_pairs.cuh"
#include "06_fa3_hopper/fp8b_eager_rescale.cuh"
#include "06_fa3_hopper/fp8c_e4m3_gemms.cuh"
#include "06_fa3_hopper/fp8d_block_scales.cuh"
#include "06_fa3_hopper/fp8e_softmax_placement.cuh"
#include "06_fa3_hopper/fp8f_transpose_v.cuh"
#include "06_fa3_hopper/fp8g_permute_p.cuh"

namespace attn::fa3 {
template void fp8a::launch<128, __nv_bfloat16>(const AttnProblem&, const AttnTensors&, Schedule, cudaStream_t, float);
template void fp8b::launch<128, __nv_bfloat16>(const AttnProblem&, const AttnTensors&, Schedule, cudaStream_t);
template void fp8c::launch<128>(const AttnProblem&, const AttnTensors&, Schedule, cudaStream_t);
template void fp8d::launch_on_workspace<128>(const AttnProblem&, const AttnTensors&, Schedule, cudaStream_t);
template void fp8e::launch_on_workspace<128>(const AttnProblem&, const AttnTensors&, Schedule, cudaStream_t);
template void fp8f::launch_on_workspace<128>(const AttnProblem&, const AttnTensors&, Schedule, cudaStream_t);
template void fp8g::launch<128, Fp8VPath::in_kernel_keys_in_order>(const AttnProblem&, const AttnTensors&,
                                                                  const fp8g::Inputs&, size_t, Schedule, cudaStream_t);
}  // namespace attn::fa3
