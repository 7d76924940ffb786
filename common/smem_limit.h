// Dynamic shared memory against what the GPU allows one block. Past 48 KiB a kernel must opt
// in (cudaFuncAttributeMaxDynamicSharedMemorySize), up to the device's
// cudaDevAttrMaxSharedMemoryPerBlockOptin: 227 KiB on sm_90, 163 KiB on sm_80, 99 KiB on
// sm_86 and sm_89. A launch that asks for more refuses with both numbers, before any launch,
// rather than failing with a CUDA error.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "common/check.h"
#include "common/stage.h"

namespace attn {

// Empty when `bytes` fit in `limit`; else the refusal, naming `what` asked and both numbers.
inline std::string smem_refusal(const std::string& what, size_t bytes, size_t limit) {
  if (bytes <= limit) return {};
  return what + " needs " + std::to_string(bytes) + " bytes of shared memory per block; this GPU allows " +
         std::to_string(limit) + " (cudaDevAttrMaxSharedMemoryPerBlockOptin)";
}

// The current device's opt-in limit of shared memory per block, in bytes.
inline size_t device_smem_optin() {
  int device = 0, bytes = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return size_t(bytes);
}

// Lets `kernel` launch with `bytes` of dynamic shared memory on the current device; throws
// AttnError with smem_refusal's message where the device allows less.
template <class Kernel>
void allow_dynamic_smem(Kernel kernel, size_t bytes, const std::string& what) {
  const std::string refusal = smem_refusal(what, bytes, device_smem_optin());
  if (!refusal.empty()) throw AttnError(refusal);
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

}  // namespace attn
