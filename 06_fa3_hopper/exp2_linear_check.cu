// exp2_e4m3_linear_on_gpu, e4m3_linear_grid_on_gpu (fa3_fp8.h): the FP8 softmax's
// integer-ALU 2^x, called on the GPU as online_softmax calls it (fp8h_fa3.cuh), so that a
// test can check its bytes and compare them with the host's arithmetic.
#include "06_fa3_hopper/fa3_fp8.h"
#include "common/check.h"
#include "common/device_buffer.h"
#include "common/device_math.cuh"
#include "common/stage.h"

namespace attn::fa3 {
namespace {

__global__ void exp2_e4m3_linear_kernel(const float* s, const float* c, uint8_t* b, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;  // as online_softmax, with s_log2 = 1
  if (i < n) b[i] = uint8_t(__float_as_uint(exp2_e4m3_linear(fmaf(s[i], kE4m3LinearStep, e4m3_linear_offset(c[i])))));
}

__global__ void e4m3_linear_grid_kernel(const float* m, float* g, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) g[i] = e4m3_linear_grid(m[i]);
}

template <typename T>
std::vector<T> from_device(const DeviceBuffer& d, size_t n) {
  std::vector<T> h(n);
  CUDA_CHECK(cudaMemcpy(h.data(), d.get(), n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

DeviceBuffer to_device(const std::vector<float>& h) {
  DeviceBuffer d(h.size() * sizeof(float));
  CUDA_CHECK(cudaMemcpy(d.get(), h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
  return d;
}

}  // namespace

std::vector<uint8_t> exp2_e4m3_linear_on_gpu(const std::vector<float>& s, const std::vector<float>& c) {
  const int n = int(s.size());
  if (c.size() != s.size()) throw AttnError("exp2_e4m3_linear_on_gpu: s and c differ in size");
  if (n == 0) return {};
  const DeviceBuffer ds = to_device(s), dc = to_device(c);
  DeviceBuffer db(s.size());
  exp2_e4m3_linear_kernel<<<(n + 255) / 256, 256>>>(ds.as<float>(), dc.as<float>(), db.as<uint8_t>(), n);
  CUDA_CHECK_LAUNCH();
  return from_device<uint8_t>(db, s.size());
}

std::vector<float> e4m3_linear_grid_on_gpu(const std::vector<float>& m) {
  const int n = int(m.size());
  if (n == 0) return {};
  const DeviceBuffer dm = to_device(m);
  DeviceBuffer dg(m.size() * sizeof(float));
  e4m3_linear_grid_kernel<<<(n + 255) / 256, 256>>>(dm.as<float>(), dg.as<float>(), n);
  CUDA_CHECK_LAUNCH();
  return from_device<float>(dg, m.size());
}

}  // namespace attn::fa3
