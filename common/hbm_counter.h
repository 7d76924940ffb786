// Measured DRAM traffic of one launch: the CUPTI range profiler reads
// dram__bytes_read.sum and dram__bytes_write.sum around the work, after an L2 flush
// (../notes: cupti_range_profiler.md). Without profiling permission, under ncu
// (ATTN_NO_CUPTI=1), or without a GPU, available() is false and reason() says why;
// the harness then leaves the measured columns empty and the run goes on.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <string>

namespace attn {

struct DramBytes {
  double read = -1;   // bytes; -1 = not measured
  double write = -1;
  bool measured() const { return read >= 0 && write >= 0; }
};

class HbmCounter {
 public:
  HbmCounter();  // never throws: failure to set up makes available() false
  ~HbmCounter();
  HbmCounter(const HbmCounter&) = delete;
  HbmCounter& operator=(const HbmCounter&) = delete;

  bool available() const;
  const std::string& reason() const;  // why not available ("" when available)

  // Flushes L2 (outside the range), then measures the DRAM bytes of what `work` enqueues
  // on `stream`; synchronizes. Returns unmeasured DramBytes when not available.
  DramBytes measure(const std::function<void()>& work, cudaStream_t stream);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace attn
