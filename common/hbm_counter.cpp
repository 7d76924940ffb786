// Placeholder until the CUPTI range profiler lands: never available.
#include "common/hbm_counter.h"

namespace attn {

struct HbmCounter::Impl {
  std::string reason = "CUPTI range profiler not built yet";
};

HbmCounter::HbmCounter() : impl_(std::make_unique<Impl>()) {}
HbmCounter::~HbmCounter() = default;
bool HbmCounter::available() const { return false; }
const std::string& HbmCounter::reason() const { return impl_->reason; }
DramBytes HbmCounter::measure(const std::function<void()>& work, cudaStream_t stream) {
  work();
  cudaStreamSynchronize(stream);
  return {};
}

}  // namespace attn
