// RAII device memory, poison and seeded random fills, and an L2 flusher.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "common/attention.h"

namespace attn {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Random input distributions.
enum class Fill {
  normal,    // N(mean, stddev^2)
  outliers,  // N(0,1) + N(0,100)·Bernoulli(0.001): the FA3 paper's Table 3 inputs
};

// n elements of dtype t (bf16 or fp16), deterministic in (seed, index).
void fill_random(void* dst, int64_t n, DType t, uint64_t seed, Fill dist, float mean, float stddev,
                 cudaStream_t stream);
// Every byte 0xFF: NaN in fp32, bf16 and fp16, so an element a rung never wrote shows up.
void fill_poison(void* dst, size_t bytes, cudaStream_t stream);
// Number of NaN/Inf elements among n of dtype t (synchronizes).
int64_t count_nonfinite(const void* src, int64_t n, DType t, cudaStream_t stream);
// ||a - b|| / ||b|| over n elements of dtype t, in fp64 on the device (synchronizes).
double rel_frobenius_device(const void* a, const void* b, int64_t n, DType t, cudaStream_t stream);

// Evicts L2 by writing and then reading a buffer twice the L2 size, so the next launch
// starts with cold caches and no dirty lines left to write back.
class L2Flusher {
 public:
  L2Flusher();
  void flush(cudaStream_t stream);

 private:
  DeviceBuffer scratch_;
  DeviceBuffer sink_;
};

// True when a CUDA device is present and usable; `why` says why not.
bool cuda_device_available(std::string* why = nullptr);

}  // namespace attn
