// exp2_linear_on_gpu (fa3_fp8.h): the FP8 softmax's integer-ALU 2^x, called on the GPU as
// online_softmax calls it (fa3_kernel.cuh), so that a test can bound its error.
#include "06_fa3_hopper/fa3_fp8.h"
#include "common/check.h"
#include "common/device_buffer.h"
#include "common/device_math.cuh"

namespace attn::fa3 {
namespace {

__global__ void exp2_linear_kernel(const float* x, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = exp2_linear(fmaf(x[i], 1.f, exp2_linear_offset(0.f)));  // as fmaf(s, s_log2, shift_linear)
}

}  // namespace

std::vector<float> exp2_linear_on_gpu(const std::vector<float>& x) {
  const int n = int(x.size());
  std::vector<float> y(x.size());
  if (n == 0) return y;
  DeviceBuffer dx(x.size() * sizeof(float)), dy(x.size() * sizeof(float));
  CUDA_CHECK(cudaMemcpy(dx.get(), x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
  exp2_linear_kernel<<<(n + 255) / 256, 256>>>(dx.as<float>(), dy.as<float>(), n);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaMemcpy(y.data(), dy.get(), x.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return y;
}

}  // namespace attn::fa3
