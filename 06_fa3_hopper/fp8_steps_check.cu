// Compile-only check of the FP8 steps before the final kernel (fp8.md): fp8a_e4m3_gemms.cuh
// and fp8b_transpose_v.cuh are the literal intermediates between 06d_fa3.cuh and
// fp8c_fa3.cuh, registered as no stage. Each is instantiated here for d = 128 (fp8b on its
// kept path, Fp8VPath::in_kernel), so that a step file that stops compiling, or spills
// (the sm_90a build fails on spills), fails the build. Nothing calls these launches.
#include "06_fa3_hopper/fp8a_e4m3_gemms.cuh"
#include "06_fa3_hopper/fp8b_transpose_v.cuh"

namespace attn::fa3 {
template void fp8a::launch<128>(const AttnProblem&, const AttnTensors&, Schedule, cudaStream_t);
template void fp8b::launch<128, Fp8VPath::in_kernel>(const AttnProblem&, const AttnTensors&, const fp8b::Inputs&,
                                                     size_t, Schedule, cudaStream_t);
}  // namespace attn::fa3
