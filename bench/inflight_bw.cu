// Read bandwidth against bytes in flight per SM, on the GPU at hand: the measured curve behind
// the decode stage's Little's-law model (05_fa2_reordered/fa2_decode.h, decode.md).
//
// A streaming kernel built like the decode kernel's K/V ring: each CTA of 128 threads copies
// 8 KiB chunks of a 1 GiB buffer with cp.async into a ring of kStages slots, keeping
// kStages - 1 chunks requested ahead of the one it consumes; ctas_per_sm CTAs per SM run at
// once (a grid of ctas_per_sm x SMs). So each SM keeps about
//   bytes_in_flight_per_sm = ctas_per_sm x (kStages - 1) x 8 KiB
// requested. Little's law says the rate reaches the HBM's when that exceeds
// bandwidth x latency / SMs. On sm_90 the same ring is also filled by the copy engine (kind
// bulk): one thread issues each chunk as one cp.async.bulk completing on the slot's mbarrier,
// where cp.async takes 512 instructions of 16 bytes per chunk. Also timed: a plain device copy (cudaMemcpyAsync) of the same
// buffer, as the bench's copy ceiling: bytes read + written per second, the rate the HBM
// sustains, which the lessons take as a read stream's roofline.
//
//   build/bench/inflight_bw --csv inflight.csv
//
// CSV: gpu, kind (stream | bulk | copy), ctas_per_sm, stages, bytes_in_flight_per_sm, read_gbps,
// model_bytes_in_flight_per_sm (the library's model on this device), peak_gbps (from the
// device's memory clock and bus width); the copy row's read_gbps is its read + write rate.
// Prints the latency the curve implies: the fewest bytes in flight per SM that reach 90 % of
// the copy's rate, times SMs, over that rate.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "05_fa2_reordered/fa2_decode.h"
#include "05_fa2_reordered/ptx.cuh"
#include "06_fa3_hopper/hopper.cuh"
#include "bench/harness.h"
#include "common/check.h"

namespace {

using namespace attn;
constexpr int kThreads = 128;
constexpr int kChunkBytes = 8192;                          // one ring slot: 128 threads x 4 x 16 bytes
constexpr int kPerThread = kChunkBytes / (16 * kThreads);  // 16-byte copies per thread per chunk
constexpr size_t kBufferBytes = size_t(1) << 30;           // far past any L2

// Streams chunks blockIdx.x, blockIdx.x + gridDim.x, ... through a kStages ring (the decode
// kernel's schedule: wait for chunk j, issue chunk j + kStages - 1, consume chunk j).
template <int kStages>
__global__ void __launch_bounds__(kThreads) stream_kernel(const uint4* src, int64_t chunks, unsigned* sink) {
  extern __shared__ uint4 ring[];  // kStages x kChunkBytes
  constexpr int kSlot = kChunkBytes / 16;
  const int64_t mine = blockIdx.x < chunks ? (chunks - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  auto issue = [&](int64_t j) {
    const uint4* g = src + (blockIdx.x + j * gridDim.x) * kSlot;
    uint4* s = ring + (j % kStages) * kSlot;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i)
      fa2::ptx::cp_async_16(fa2::ptx::smem_u32(s + i * kThreads + threadIdx.x), g + i * kThreads + threadIdx.x, true);
  };
#pragma unroll
  for (int j = 0; j < kStages - 1; ++j) {
    if (j < mine) issue(j);
    fa2::ptx::cp_async_commit();
  }
  unsigned acc = 0;
  for (int64_t j = 0; j < mine; ++j) {
    fa2::ptx::cp_async_wait<kStages - 2>();
    __syncthreads();  // chunk j landed; chunk j - 1's slot is free
    if (j + kStages - 1 < mine) issue(j + kStages - 1);
    fa2::ptx::cp_async_commit();
    const uint4* s = ring + (j % kStages) * kSlot;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) acc ^= s[i * kThreads + threadIdx.x].x;  // consume (cheaply)
  }
  fa2::ptx::cp_async_wait<0>();
  if (acc == 0x9e3779b9u) *sink = acc;  // keeps the loads; practically never taken
}

// The same schedule with the copy engine filling the ring (sm_90): thread 0 issues chunk j as
// one bulk copy completing on full[j % kStages]; every thread waits on that barrier's phase.
template <int kStages>
__global__ void __launch_bounds__(kThreads) bulk_kernel(const uint4* src, int64_t chunks, unsigned* sink) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace hw = attn::hopper;
  extern __shared__ __align__(128) uint4 ring[];  // kStages x kChunkBytes
  __shared__ __align__(8) uint64_t full[kStages];
  constexpr int kSlot = kChunkBytes / 16;
  const int64_t mine = blockIdx.x < chunks ? (chunks - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) hw::mbarrier_init(&full[s], 1);
    hw::fence_barrier_init();
  }
  __syncthreads();
  auto issue = [&](int64_t j) {  // thread 0
    uint64_t* bar = &full[j % kStages];
    hw::mbarrier_arrive_expect_tx(bar, kChunkBytes);
    hw::bulk_load(ring + (j % kStages) * kSlot, src + (blockIdx.x + j * gridDim.x) * kSlot, kChunkBytes, bar);
  };
  if (threadIdx.x == 0)
    for (int j = 0; j < kStages - 1 && j < mine; ++j) issue(j);
  unsigned acc = 0;
  for (int64_t j = 0; j < mine; ++j) {
    hw::mbarrier_wait(&full[j % kStages], uint32_t(j / kStages) & 1);
    __syncthreads();  // every thread has consumed chunk j - 1: its slot is free
    if (threadIdx.x == 0 && j + kStages - 1 < mine) issue(j + kStages - 1);
    const uint4* s = ring + (j % kStages) * kSlot;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) acc ^= s[i * kThreads + threadIdx.x].x;  // consume (cheaply)
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // keeps the loads; practically never taken
#else
  static_cast<void>(src), static_cast<void>(chunks), static_cast<void>(sink);
#endif
}

struct Point {
  bool bulk;
  int ctas_per_sm, stages;
  double in_flight, gbps;
};

template <int kStages, bool kBulk>
bool run_config(int ctas_per_sm, int sms, const void* src, unsigned* sink, cudaStream_t stream, Point* out) {
  auto kernel = kBulk ? bulk_kernel<kStages> : stream_kernel<kStages>;
  const int smem = kStages * kChunkBytes;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int fit = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, kThreads, smem));
  if (fit < ctas_per_sm) return false;  // that many do not fit an SM
  const int64_t chunks = kBufferBytes / kChunkBytes;
  const dim3 grid(unsigned(ctas_per_sm * sms));
  auto launch = [&] { kernel<<<grid, kThreads, smem, stream>>>(static_cast<const uint4*>(src), chunks, sink); };
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) launch();
  std::vector<float> ms;
  for (int i = 0; i < 10; ++i) {
    CUDA_CHECK(cudaEventRecord(a, stream));
    launch();
    CUDA_CHECK(cudaEventRecord(b, stream));
    CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  *out = Point{kBulk, ctas_per_sm, kStages, double(ctas_per_sm) * (kStages - 1) * kChunkBytes,
               kBufferBytes / (ms[ms.size() / 2] * 1e-3) / 1e9};
  return true;
}

template <bool kBulk, int... kS>
void sweep(int sms, const void* src, unsigned* sink, cudaStream_t stream, std::vector<Point>& points) {
  for (int c : {1, 2, 3, 4})
    (
        [&] {
          Point pt{};
          if (run_config<kS, kBulk>(c, sms, src, sink, stream, &pt)) points.push_back(pt);
        }(),
        ...);
}

// A device copy of the buffer: bytes read + written per second / 1e9.
double copy_gbps(void* dst, const void* src, cudaStream_t stream) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < 13; ++i) {
    CUDA_CHECK(cudaEventRecord(a, stream));
    CUDA_CHECK(cudaMemcpyAsync(dst, src, kBufferBytes, cudaMemcpyDeviceToDevice, stream));
    CUDA_CHECK(cudaEventRecord(b, stream));
    CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    if (i >= 3) ms.push_back(t);
  }
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return 2.0 * kBufferBytes / (ms[ms.size() / 2] * 1e-3) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  std::string csv_path;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--csv") && i + 1 < argc) {
      csv_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: inflight_bw [--csv FILE]\n");
      return 2;
    }
  }
  std::string why;
  if (!cuda_device_available(&why)) {
    std::fprintf(stderr, "inflight_bw: no GPU: %s\n", why.c_str());
    return 1;
  }
  const fa2::DecodeDevice dev = fa2::decode_device();
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  DeviceBuffer src(kBufferBytes), dst(kBufferBytes), sink(sizeof(unsigned));
  CUDA_CHECK(cudaMemsetAsync(src.get(), 1, kBufferBytes, stream));
  std::vector<Point> points;
  sweep<false, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24>(dev.sm_count, src.get(), sink.as<unsigned>(), stream, points);
  int major = 0, device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major >= 9) sweep<true, 2, 3, 4, 5, 6, 8, 12, 16, 24>(dev.sm_count, src.get(), sink.as<unsigned>(), stream, points);
  std::sort(points.begin(), points.end(), [](const Point& a, const Point& b) { return a.in_flight < b.in_flight; });
  const double copy = copy_gbps(dst.get(), src.get(), stream);

  const std::string gpu = current_gpu_slug();
  FILE* f = csv_path.empty() ? nullptr : std::fopen(csv_path.c_str(), "w");
  if (!csv_path.empty() && !f) {
    std::fprintf(stderr, "inflight_bw: cannot write %s\n", csv_path.c_str());
    return 1;
  }
  if (f) std::fprintf(f, "gpu,kind,ctas_per_sm,stages,bytes_in_flight_per_sm,read_gbps,model_bytes_in_flight_per_sm,peak_gbps\n");
  std::printf("%s: %d SMs, peak %.0f GB/s (memory clock x bus width), model: %.1f kB in flight per SM "
              "(latency %.0f ns)\n", gpu.c_str(), dev.sm_count, dev.bandwidth / 1e9, dev.bytes_in_flight_per_sm() / 1e3,
              dev.latency_s * 1e9);
  std::printf("  kind    CTAs/SM stages  kB in flight/SM  read GB/s\n");
  for (const Point& p : points) {
    const char* kind = p.bulk ? "bulk" : "stream";
    std::printf("  %-6s %8d %6d %16.0f %10.0f\n", kind, p.ctas_per_sm, p.stages, p.in_flight / 1e3, p.gbps);
    if (f)
      std::fprintf(f, "%s,%s,%d,%d,%.0f,%.1f,%.0f,%.0f\n", gpu.c_str(), kind, p.ctas_per_sm, p.stages, p.in_flight,
                   p.gbps, dev.bytes_in_flight_per_sm(), dev.bandwidth / 1e9);
  }
  std::printf("  device copy: %.0f GB/s (read + written)\n", copy);
  if (f) {
    std::fprintf(f, "%s,copy,,,,%.1f,%.0f,%.0f\n", gpu.c_str(), copy, dev.bytes_in_flight_per_sm(), dev.bandwidth / 1e9);
    std::fclose(f);
  }
  // The knee: the fewest bytes in flight per SM reaching 90 % of the copy's rate.
  for (const Point& p : points)
    if (!p.bulk && p.gbps >= 0.9 * copy) {
      std::printf("90 %% of the copy's rate from %.0f kB in flight per SM: implied latency %.0f ns "
                  "(ATTN_DECODE_LATENCY_NS; the model uses %.0f)\n",
                  p.in_flight / 1e3, p.in_flight * dev.sm_count / (copy * 1e9) * 1e9, dev.latency_s * 1e9);
      break;
    }
  CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}
