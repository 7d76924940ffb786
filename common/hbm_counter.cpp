// Measured DRAM bytes of one range of GPU work, with the CUPTI range profiler of CUDA 13.
// The steps are the CUPTI range profiler's, in the order below; each CUPTI call sits in one
// small function and a failure throws CuptiError naming the call. The constructor
// turns any failure into available() = false with the message as reason(), so a machine
// without a GPU or without profiling permission still runs the bench (columns left empty).
//
//   constructor:  initialize -> chip name -> counter availability -> host object
//                 -> config image (metrics, 1 pass) -> enable on the primary context
//                 -> flush L2 + empty range = baseline
//   measure():    counter data image -> set config -> [flush L2, start, push, work,
//                 sync, pop, stop] until all passes are in -> decode -> evaluate
//
// What the numbers mean: DRAM traffic while the range was open, as ncu reports it for a
// kernel. Reads are exact (the flush leaves nothing of the inputs in L2). Writes miss
// the dirty lines still in L2 when the range closes: they reach DRAM later, so outputs of
// a few MB show almost no writes.
#include "common/hbm_counter.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <cupti_profiler_host.h>
#include <cupti_profiler_target.h>
#include <cupti_range_profiler.h>
#include <cupti_result.h>
#include <cupti_target.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/device_buffer.h"

namespace attn {
namespace {

// The two counters we read, with their rollup (a name without ".sum" is rejected).
const char* const kMetricNames[] = {"dram__bytes_read.sum", "dram__bytes_write.sum"};
constexpr size_t kNumMetrics = sizeof(kMetricNames) / sizeof(kMetricNames[0]);
constexpr const char* kRangeName = "attn_range";
// One user range per counter data image: re-initialized for every measurement.
constexpr size_t kRangesPerImage = 1;
constexpr uint16_t kNestingLevel = 1;
// An empty range after a flush should move (almost) nothing. More than this means the
// flush does not leave L2 clean, and no measurement would be trustworthy.
constexpr double kMaxBaselineBytes = 1 << 20;

// Every CUPTI params struct starts zeroed, with structSize set to its version's size.
template <typename Params>
Params cupti_params(size_t struct_size) {
  Params p{};
  p.structSize = struct_size;
  return p;
}
#define CUPTI_PARAMS(Params) cupti_params<Params>(Params##_STRUCT_SIZE)

struct CuptiError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check_cupti(CUptiResult result, const char* call) {
  if (result == CUPTI_SUCCESS) return;
  const char* what = nullptr;
  cuptiGetResultString(result, &what);
  std::string msg = std::string(call) + " failed: " + (what ? what : "unknown CUPTI error");
  if (result == CUPTI_ERROR_INSUFFICIENT_PRIVILEGES)
    msg += " (hardware counters need root, or the nvidia driver option NVreg_RestrictProfilingToAdminUsers=0)";
  throw CuptiError(msg);
}

// CUDA runtime failures during setup also only disable the counter.
void check_cuda(cudaError_t err, const char* call) {
  if (err == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so the caller's next check does not see it
  throw CuptiError(std::string(call) + " failed: " + cudaGetErrorString(err));
}

bool env_disables_cupti() {
  const char* v = std::getenv("ATTN_NO_CUPTI");
  return v && *v && std::strcmp(v, "0") != 0;
}

// The runtime's primary context of the current device. cuCtxGetCurrent is fetched
// through the runtime, so the library needs no link against the driver library.
CUcontext primary_context() {
  check_cuda(cudaFree(nullptr), "cudaFree(0) (create the primary context)");
  using CtxGetCurrent = CUresult (*)(CUcontext*);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  check_cuda(cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, CUDA_VERSION, cudaEnableDefault, &found),
             "cudaGetDriverEntryPointByVersion(cuCtxGetCurrent)");
  if (found != cudaDriverEntryPointSuccess || !fn) throw CuptiError("cuCtxGetCurrent not found in the driver");
  CUcontext ctx = nullptr;
  if (reinterpret_cast<CtxGetCurrent>(fn)(&ctx) != CUDA_SUCCESS || !ctx)
    throw CuptiError("cuCtxGetCurrent returned no context");
  return ctx;
}

// ---- one function per CUPTI step ------------------------------------------------------

void profiler_initialize() {
  auto p = CUPTI_PARAMS(CUpti_Profiler_Initialize_Params);
  check_cupti(cuptiProfilerInitialize(&p), "cuptiProfilerInitialize");
}

std::string chip_name(int device) {
  auto p = CUPTI_PARAMS(CUpti_Device_GetChipName_Params);
  p.deviceIndex = size_t(device);
  check_cupti(cuptiDeviceGetChipName(&p), "cuptiDeviceGetChipName");
  return p.pChipName;
}

// Queried twice: the size first, then the image. Must precede cuptiRangeProfilerEnable.
std::vector<uint8_t> counter_availability(CUcontext ctx) {
  auto p = CUPTI_PARAMS(CUpti_Profiler_GetCounterAvailability_Params);
  p.ctx = ctx;
  check_cupti(cuptiProfilerGetCounterAvailability(&p), "cuptiProfilerGetCounterAvailability (size)");
  std::vector<uint8_t> image(p.counterAvailabilityImageSize);
  p.pCounterAvailabilityImage = image.data();
  check_cupti(cuptiProfilerGetCounterAvailability(&p), "cuptiProfilerGetCounterAvailability (image)");
  return image;
}

CUpti_Profiler_Host_Object* host_initialize(const std::string& chip, const std::vector<uint8_t>& availability) {
  auto p = CUPTI_PARAMS(CUpti_Profiler_Host_Initialize_Params);
  p.profilerType = CUPTI_PROFILER_TYPE_RANGE_PROFILER;
  p.pChipName = chip.c_str();
  p.pCounterAvailabilityImage = availability.data();
  check_cupti(cuptiProfilerHostInitialize(&p), "cuptiProfilerHostInitialize");
  return p.pHostObject;
}

// The config image schedules the metrics' counters; we need them all in one pass.
std::vector<uint8_t> config_image(CUpti_Profiler_Host_Object* host) {
  auto add = CUPTI_PARAMS(CUpti_Profiler_Host_ConfigAddMetrics_Params);
  add.pHostObject = host;
  add.ppMetricNames = const_cast<const char**>(kMetricNames);
  add.numMetrics = kNumMetrics;
  check_cupti(cuptiProfilerHostConfigAddMetrics(&add), "cuptiProfilerHostConfigAddMetrics");

  auto size = CUPTI_PARAMS(CUpti_Profiler_Host_GetConfigImageSize_Params);
  size.pHostObject = host;
  check_cupti(cuptiProfilerHostGetConfigImageSize(&size), "cuptiProfilerHostGetConfigImageSize");

  std::vector<uint8_t> image(size.configImageSize);
  auto get = CUPTI_PARAMS(CUpti_Profiler_Host_GetConfigImage_Params);
  get.pHostObject = host;
  get.configImageSize = image.size();
  get.pConfigImage = image.data();
  check_cupti(cuptiProfilerHostGetConfigImage(&get), "cuptiProfilerHostGetConfigImage");

  auto passes = CUPTI_PARAMS(CUpti_Profiler_Host_GetNumOfPasses_Params);
  passes.configImageSize = image.size();
  passes.pConfigImage = image.data();
  check_cupti(cuptiProfilerHostGetNumOfPasses(&passes), "cuptiProfilerHostGetNumOfPasses");
  if (passes.numOfPasses != 1)
    throw CuptiError("the DRAM byte metrics need " + std::to_string(passes.numOfPasses) +
                     " passes on this chip; this counter measures in one");
  return image;
}

CUpti_RangeProfiler_Object* range_profiler_enable(CUcontext ctx) {
  auto p = CUPTI_PARAMS(CUpti_RangeProfiler_Enable_Params);
  p.ctx = ctx;
  check_cupti(cuptiRangeProfilerEnable(&p), "cuptiRangeProfilerEnable");
  return p.pRangeProfilerObject;
}

// A fresh image holding one range; re-initialized before every measurement.
void counter_data_image(CUpti_RangeProfiler_Object* range, std::vector<uint8_t>& image) {
  auto size = CUPTI_PARAMS(CUpti_RangeProfiler_GetCounterDataSize_Params);
  size.pRangeProfilerObject = range;
  size.pMetricNames = const_cast<const char**>(kMetricNames);
  size.numMetrics = kNumMetrics;
  size.maxNumOfRanges = kRangesPerImage;
  size.maxNumRangeTreeNodes = kRangesPerImage;
  check_cupti(cuptiRangeProfilerGetCounterDataSize(&size), "cuptiRangeProfilerGetCounterDataSize");

  image.assign(size.counterDataSize, 0);
  auto init = CUPTI_PARAMS(CUpti_RangeProfiler_CounterDataImage_Initialize_Params);
  init.pRangeProfilerObject = range;
  init.counterDataSize = image.size();
  init.pCounterData = image.data();
  check_cupti(cuptiRangeProfilerCounterDataImageInitialize(&init), "cuptiRangeProfilerCounterDataImageInitialize");
}

// User ranges (we push and pop them), user replay (we would rerun the work per pass).
void set_config(CUpti_RangeProfiler_Object* range, const std::vector<uint8_t>& config,
                std::vector<uint8_t>& counter_data) {
  auto p = CUPTI_PARAMS(CUpti_RangeProfiler_SetConfig_Params);
  p.pRangeProfilerObject = range;
  p.configSize = config.size();
  p.pConfig = config.data();
  p.counterDataImageSize = counter_data.size();
  p.pCounterDataImage = counter_data.data();
  p.range = CUPTI_UserRange;
  p.replayMode = CUPTI_UserReplay;
  p.maxRangesPerPass = kRangesPerImage;
  p.numNestingLevels = kNestingLevel;
  p.minNestingLevel = kNestingLevel;
  p.passIndex = 0;
  p.targetNestingLevel = kNestingLevel;
  check_cupti(cuptiRangeProfilerSetConfig(&p), "cuptiRangeProfilerSetConfig");
}

void start(CUpti_RangeProfiler_Object* range) {
  auto p = CUPTI_PARAMS(CUpti_RangeProfiler_Start_Params);
  p.pRangeProfilerObject = range;
  check_cupti(cuptiRangeProfilerStart(&p), "cuptiRangeProfilerStart");
}

void push_range(CUpti_RangeProfiler_Object* range) {
  auto p = CUPTI_PARAMS(CUpti_RangeProfiler_PushRange_Params);
  p.pRangeProfilerObject = range;
  p.pRangeName = kRangeName;
  check_cupti(cuptiRangeProfilerPushRange(&p), "cuptiRangeProfilerPushRange");
}

void pop_range(CUpti_RangeProfiler_Object* range) {
  auto p = CUPTI_PARAMS(CUpti_RangeProfiler_PopRange_Params);
  p.pRangeProfilerObject = range;
  check_cupti(cuptiRangeProfilerPopRange(&p), "cuptiRangeProfilerPopRange");
}

// Returns true once every pass the config needs has been submitted.
bool stop(CUpti_RangeProfiler_Object* range) {
  auto p = CUPTI_PARAMS(CUpti_RangeProfiler_Stop_Params);
  p.pRangeProfilerObject = range;
  check_cupti(cuptiRangeProfilerStop(&p), "cuptiRangeProfilerStop");
  return p.isAllPassSubmitted != 0;
}

void decode(CUpti_RangeProfiler_Object* range) {
  auto p = CUPTI_PARAMS(CUpti_RangeProfiler_DecodeData_Params);
  p.pRangeProfilerObject = range;
  check_cupti(cuptiRangeProfilerDecodeData(&p), "cuptiRangeProfilerDecodeData");
  if (p.numOfRangeDropped != 0)
    throw CuptiError("cuptiRangeProfilerDecodeData dropped " + std::to_string(p.numOfRangeDropped) + " range(s)");
}

// The image must hold exactly our one range, under our name.
void check_single_range(const std::vector<uint8_t>& counter_data) {
  auto info = CUPTI_PARAMS(CUpti_RangeProfiler_GetCounterDataInfo_Params);
  info.pCounterDataImage = counter_data.data();
  info.counterDataImageSize = counter_data.size();
  check_cupti(cuptiRangeProfilerGetCounterDataInfo(&info), "cuptiRangeProfilerGetCounterDataInfo");
  if (info.numTotalRanges != kRangesPerImage)
    throw CuptiError("counter data holds " + std::to_string(info.numTotalRanges) + " ranges, expected 1");

  auto range = CUPTI_PARAMS(CUpti_RangeProfiler_CounterData_GetRangeInfo_Params);
  range.pCounterDataImage = counter_data.data();
  range.counterDataImageSize = counter_data.size();
  range.rangeIndex = 0;
  range.rangeDelimiter = "/";
  check_cupti(cuptiRangeProfilerCounterDataGetRangeInfo(&range), "cuptiRangeProfilerCounterDataGetRangeInfo");
  if (!range.rangeName || std::string(range.rangeName) != kRangeName)
    throw CuptiError(std::string("counter data range is '") + (range.rangeName ? range.rangeName : "") +
                     "', expected '" + kRangeName + "'");
}

DramBytes evaluate(CUpti_Profiler_Host_Object* host, const std::vector<uint8_t>& counter_data) {
  double values[kNumMetrics] = {};
  auto p = CUPTI_PARAMS(CUpti_Profiler_Host_EvaluateToGpuValues_Params);
  p.pHostObject = host;
  p.pCounterDataImage = counter_data.data();
  p.counterDataImageSize = counter_data.size();
  p.rangeIndex = 0;
  p.ppMetricNames = const_cast<const char**>(kMetricNames);
  p.numMetrics = kNumMetrics;
  p.pMetricValues = values;
  check_cupti(cuptiProfilerHostEvaluateToGpuValues(&p), "cuptiProfilerHostEvaluateToGpuValues");
  return {values[0], values[1]};
}

// Cleanup calls: errors are ignored (they run while another error propagates, from the
// destructor, or after a failed setup).
void abandon_range(CUpti_RangeProfiler_Object* range) {
  auto pop_params = CUPTI_PARAMS(CUpti_RangeProfiler_PopRange_Params);
  pop_params.pRangeProfilerObject = range;
  cuptiRangeProfilerPopRange(&pop_params);
  auto stop_params = CUPTI_PARAMS(CUpti_RangeProfiler_Stop_Params);
  stop_params.pRangeProfilerObject = range;
  cuptiRangeProfilerStop(&stop_params);
}

void range_profiler_disable(CUpti_RangeProfiler_Object* range) {
  auto p = CUPTI_PARAMS(CUpti_RangeProfiler_Disable_Params);
  p.pRangeProfilerObject = range;
  cuptiRangeProfilerDisable(&p);
}

void host_deinitialize(CUpti_Profiler_Host_Object* host) {
  auto p = CUPTI_PARAMS(CUpti_Profiler_Host_Deinitialize_Params);
  p.pHostObject = host;
  cuptiProfilerHostDeinitialize(&p);
}

void profiler_deinitialize() {
  auto p = CUPTI_PARAMS(CUpti_Profiler_DeInitialize_Params);
  cuptiProfilerDeInitialize(&p);
}

}  // namespace

struct HbmCounter::Impl {
  std::string reason;
  bool available = false;
  bool profiler_initialized = false;
  CUpti_Profiler_Host_Object* host = nullptr;
  CUpti_RangeProfiler_Object* range = nullptr;
  std::vector<uint8_t> config;
  std::vector<uint8_t> counter_data;
  // Writes and then reads a buffer of twice the L2 size: no line of earlier work, and no
  // dirty line that could be written back inside the range, stays in L2.
  std::unique_ptr<L2Flusher> flusher;
  // What an empty range reads and writes after a flush; subtracted from every measurement.
  DramBytes baseline{0, 0};

  void set_up();
  void flush_l2(cudaStream_t stream);
  DramBytes measure_range(const std::function<void()>& work, cudaStream_t stream, bool& work_ran);
  void calibrate();
  void tear_down();
};

void HbmCounter::Impl::set_up() {
  if (env_disables_cupti())
    throw CuptiError("ATTN_NO_CUPTI is set (under ncu the in-process counter stays off)");
  int devices = 0;
  check_cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  if (devices == 0) throw CuptiError("no CUDA device");
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  CUcontext ctx = primary_context();

  profiler_initialize();
  profiler_initialized = true;
  const std::string chip = chip_name(device);
  const std::vector<uint8_t> availability = counter_availability(ctx);
  host = host_initialize(chip, availability);
  config = config_image(host);
  range = range_profiler_enable(ctx);

  flusher = std::make_unique<L2Flusher>();
  calibrate();
  available = true;
}

void HbmCounter::Impl::flush_l2(cudaStream_t stream) {
  flusher->flush(stream);
  CUDA_CHECK(cudaDeviceSynchronize());  // the flush must be over before the range opens
}

DramBytes HbmCounter::Impl::measure_range(const std::function<void()>& work, cudaStream_t stream, bool& work_ran) {
  counter_data_image(range, counter_data);
  set_config(range, config, counter_data);
  bool all_passes = false;
  while (!all_passes) {  // one pass for these metrics (checked in config_image)
    flush_l2(stream);
    start(range);
    push_range(range);
    try {
      work_ran = true;
      work();
      CUDA_CHECK(cudaDeviceSynchronize());  // the range ends when the GPU is done
    } catch (...) {
      abandon_range(range);  // leave the profiler ready for the next measurement
      throw;
    }
    pop_range(range);
    all_passes = stop(range);
  }
  decode(range);
  check_single_range(counter_data);
  return evaluate(host, counter_data);
}

void HbmCounter::Impl::calibrate() {
  bool work_ran = false;
  const DramBytes empty = measure_range([] {}, nullptr, work_ran);
  if (empty.read > kMaxBaselineBytes || empty.write > kMaxBaselineBytes)
    throw CuptiError("an empty range after the L2 flush read " + std::to_string(empty.read) + " and wrote " +
                     std::to_string(empty.write) + " bytes; measurements would not be trustworthy");
  baseline = empty;
}

void HbmCounter::Impl::tear_down() {
  available = false;
  if (range) range_profiler_disable(range);
  if (host) host_deinitialize(host);
  if (profiler_initialized) profiler_deinitialize();
  flusher.reset();
  range = nullptr;
  host = nullptr;
  profiler_initialized = false;
}

HbmCounter::HbmCounter() : impl_(std::make_unique<Impl>()) {
  try {
    impl_->set_up();
  } catch (const std::exception& e) {
    impl_->reason = e.what();
    impl_->tear_down();
  }
}

HbmCounter::~HbmCounter() { impl_->tear_down(); }

bool HbmCounter::available() const { return impl_->available; }
const std::string& HbmCounter::reason() const { return impl_->reason; }

// A CUPTI failure here turns the counter off (reason() says why) and returns unmeasured
// bytes; the work still runs exactly once. Errors of the work itself propagate.
DramBytes HbmCounter::measure(const std::function<void()>& work, cudaStream_t stream) {
  bool work_ran = false;
  if (impl_->available) {
    try {
      const DramBytes raw = impl_->measure_range(work, stream, work_ran);
      return {std::max(0.0, raw.read - impl_->baseline.read), std::max(0.0, raw.write - impl_->baseline.write)};
    } catch (const CuptiError& e) {
      impl_->reason = e.what();
      impl_->tear_down();
    }
  }
  if (!work_ran) {
    work();
    CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  return {};
}

}  // namespace attn
