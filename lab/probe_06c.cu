// Lab 06's probe (lab/probes.h): rung 06c's K/V ring slots (Slot) and ping-pong turns
// (TurnTaking), each run alone. The grader's "ring" and "turns" checks.
#include <cuda_bf16.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "06_fa3_hopper/06c_pingpong.cuh"
#include "common/check.h"
#include "lab/probes.h"

namespace attn::lab {
namespace {

using fa3::step06c::Config;
using fa3::step06c::Slot;
using fa3::step06c::TurnTaking;

template <class Cfg>
__global__ void slot_probe(int n, int* stage, unsigned* phase) {
  for (int it = blockIdx.x * blockDim.x + threadIdx.x; it < n; it += gridDim.x * blockDim.x) {
    const Slot<Cfg> slot(it);
    stage[it] = slot.stage;
    phase[it] = slot.phase;
  }
}

// The consumer warpgroups of Cfg (no producer) take `rounds` turns each; in its turn a
// warpgroup appends its number to `log`. Every warpgroup but 0 dawdles `delay` cycles in its
// turn first: without working turns, warpgroup 0 would append twice in a row.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kConsumers * Cfg::kWgThreads)
    turn_probe(int rounds, long long delay, int* next, int* log) {
  const TurnTaking<Cfg> turn{int(threadIdx.x) / Cfg::kWgThreads};
  turn.start();
  for (int r = 0; r < rounds; ++r) {
    turn.wait_turn();
    if (turn.wg > 0) {
      const long long t0 = clock64();
      while (clock64() - t0 < delay) {
      }
    }
    if (threadIdx.x % Cfg::kWgThreads == 0) log[atomicAdd(next, 1)] = turn.wg;
    __syncwarp();
    turn.pass_turn();
  }
  turn.finish();
}

template <class T>
struct Device {
  T* p = nullptr;
  explicit Device(size_t n) { CUDA_CHECK(cudaMalloc(&p, n * sizeof(T))); CUDA_CHECK(cudaMemset(p, 0, n * sizeof(T))); }
  ~Device() { cudaFree(p); }
  std::vector<T> host(size_t n) const {
    std::vector<T> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

ProbeResult ring() {
  using Cfg = Config<128, __nv_bfloat16>;
  constexpr int kN = 4096;
  Device<int> stage(kN);
  Device<unsigned> phase(kN);
  slot_probe<Cfg><<<8, 128>>>(kN, stage.p, phase.p);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<int> s = stage.host(kN);
  const std::vector<unsigned> ph = phase.host(kN);
  // The ring played in order, so that the probe checks the ring's rules rather than restating the
  // answer: block 0 takes stage 0, each block the stage after the previous block's (stage 0
  // after the last one), and a stage's barriers test the parity of its earlier uses.
  std::vector<int> uses(Cfg::kStages, 0);
  int want_stage = 0;
  for (int it = 0; it < kN; ++it, want_stage = want_stage + 1 == Cfg::kStages ? 0 : want_stage + 1) {
    const unsigned want_phase = unsigned(uses[want_stage]++) & 1;
    if (s[it] != want_stage || ph[it] != want_phase)
      return {true, false, false,
              "Slot(" + std::to_string(it) + ") = {stage " + std::to_string(s[it]) + ", phase " +
                  std::to_string(ph[it]) + "}; a ring of " + std::to_string(Cfg::kStages) + " stages needs {stage " +
                  std::to_string(want_stage) + ", phase " + std::to_string(want_phase) + "}"};
  }
  return {true, true, false, "Slot(it) right for it = 0 .. " + std::to_string(kN - 1)};
}

// Runs turn_probe for Cfg; "" when the warpgroups alternated 0, 1, .., 0, 1, .. Sets *hung
// when the kernel has not finished after `wait` (a wait_turn no one hands the turn to).
template <class Cfg>
std::string turns_of(bool* hung) {
  constexpr int kRounds = 16, kWgs = Cfg::kConsumers, kEntries = kRounds * kWgs;
  auto* next = new Device<int>(1);  // leaked if the kernel hangs: freeing would wait for it
  auto* log = new Device<int>(kEntries);
  cudaEvent_t done;
  CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  turn_probe<Cfg><<<1, kWgs * Cfg::kWgThreads>>>(kRounds, 20000, next->p, log->p);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaEventRecord(done));
  const auto start = std::chrono::steady_clock::now();
  cudaError_t state;
  while ((state = cudaEventQuery(done)) == cudaErrorNotReady) {
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(10)) {
      *hung = true;
      return std::to_string(kWgs) + " consumer warpgroups: the kernel did not finish in 10 s; a wait_turn "
             "whose turn is never handed over, or a barrier count that never fills?";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CUDA_CHECK(state);
  CUDA_CHECK(cudaEventDestroy(done));
  const int n = next->host(1)[0];
  const std::vector<int> order = log->host(kEntries);
  delete next;
  delete log;
  const std::string who = std::to_string(kWgs) + " consumer warpgroups: ";
  if (n != kEntries) return who + std::to_string(n) + " turns taken, expected " + std::to_string(kEntries);
  for (int k = 0; k < kEntries; ++k)
    if (order[k] != k % kWgs) {
      std::string seq;
      for (int i = 0; i < std::min(kEntries, k + 4); ++i) seq += (i ? "," : "") + std::to_string(order[i]);
      return who + "turn " + std::to_string(k) + " went to warpgroup " + std::to_string(order[k]) + ", not " +
             std::to_string(k % kWgs) + " (order " + seq + ", ...)";
    }
  return "";
}

ProbeResult turns() {
  ProbeResult r{true, false, false, ""};
  // d = 128: two consumer warpgroups; d = 64: three.
  std::string why = turns_of<Config<128, __nv_bfloat16>>(&r.hung);
  if (why.empty() && !r.hung) why = turns_of<Config<64, __nv_bfloat16>>(&r.hung);
  r.passed = why.empty();
  r.detail = r.passed ? "2 and 3 consumer warpgroups take turns 0, 1, (2,) 0, 1, ... over 16 rounds" : why;
  return r;
}

}  // namespace

ProbeResult run_probe(const std::string& kind) {
  if (kind == "ring") return ring();
  if (kind == "turns") return turns();
  return {};
}

}  // namespace attn::lab
