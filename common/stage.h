// The Stage record: what every rung registers, once, and the checks every entry point runs
// before a launch. The list of rungs is ladder/registry.h, one floor up: common/ includes
// no rung.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/attention.h"

namespace attn {

// Every refusal (bad problem, bad pointers, wrong GPU, too little memory) is an AttnError
// with a message a reader understands. CUDA failures are CudaError (check.h).
struct AttnError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Rows that share one descale (AttnTensors::q_descale, ...) in a rung taking e4m3 inputs.
struct DescaleBlocks {
  int q_rows = 0;   // rows of Q per q_descale
  int kv_rows = 0;  // rows (keys) of K and of V per k_descale and v_descale
};

struct Stage {
  std::string name;     // "02_safe_softmax": directory number + idea; also the CSV rung name
  std::string prev;     // the rung this one is chain-checked against ("" for the first)
  std::string summary;  // one line for tables: what this rung adds
  int min_sm = 80;      // minimum compute capability, major*10 + minor (06 needs 90)
  int max_sm = 0;       // maximum, where the code is arch-specific (06: sm_90a runs on 9.0 only); 0: none
  std::vector<DType> dtypes;
  std::vector<int> head_dims;
  bool gqa = true;           // handles Hkv < H; otherwise refuses it
  bool writes_lse = false;   // writes AttnTensors::lse when it is non-null
  bool compute_bound = true; // fused rungs: % of GEMM ceiling; memory-bound rungs: of copy BW
  // Optional limit on the problem beyond dtype/head dim (e.g. a rung with a fixed tile
  // that needs Nk <= something). Returns "" if fine, else the reason it is refused.
  std::function<std::string(const AttnProblem&)> refuse;
  // Device scratch the launch needs (S and P for 01-03a); 0 for fused rungs.
  std::function<size_t(const AttnProblem&)> workspace_bytes;
  // Enqueue the whole rung on `stream`. Called only after validate() passed.
  std::function<void(const AttnProblem&, const AttnTensors&, cudaStream_t)> launch;
  // HBM bytes this rung moves, from its README's cost model (formulas in hbm_model.h,
  // bound here to the rung's actual tile sizes).
  std::function<double(const AttnProblem&)> model_hbm_bytes;
  // Optional, for the memory-bound rungs 01-03a: enqueue only the softmax kernel, over the
  // S that a previous full launch left in the workspace, and its modelled bytes. The bench
  // times it alone against the copy-bandwidth ceiling.
  std::function<void(const AttnProblem&, const AttnTensors&, cudaStream_t)> launch_softmax_only;
  std::function<double(const AttnProblem&)> softmax_model_bytes;
  // Rungs taking e4m3 inputs (DType::e4m3): the block layout of their descales.
  std::function<DescaleBlocks(const AttnProblem&)> descale_blocks;
  // Optional: the backward pass (AttnBwdTensors), on the forward's dtypes. A rung without
  // launch_backward is forward only, and run_backward refuses it saying so. Its head dims,
  // a limit beyond the forward's refuse (as refuse: "" if fine), the device scratch it
  // needs (fp32 dQ accumulators, D), and the launch (called only after validation).
  std::vector<int> backward_head_dims;
  std::function<std::string(const AttnProblem&)> backward_refuse;
  std::function<size_t(const AttnProblem&)> backward_workspace_bytes;
  std::function<void(const AttnProblem&, const AttnBwdTensors&, cudaStream_t)> launch_backward;
  // launch_backward reads dO with any strides AttnBwdTensors::dout_strides gives (positive,
  // 16-byte multiples); without it a rung takes dO contiguous and refuses other strides.
  bool backward_strided_dout = false;
  // Optional: the backward's HBM bytes by its cost model (hbm_model.h), for the bench's row.
  std::function<double(const AttnProblem&)> model_backward_hbm_bytes;

  size_t workspace(const AttnProblem& p) const { return workspace_bytes ? workspace_bytes(p) : 0; }
  bool has_backward() const { return bool(launch_backward); }
  size_t backward_workspace(const AttnProblem& p) const {
    return backward_workspace_bytes ? backward_workspace_bytes(p) : 0;
  }
  bool supports(DType t) const;
  bool supports_head_dim(int d) const;
  bool supports_backward_head_dim(int d) const;  // has_backward() and d in backward_head_dims
};

// Checks that need no GPU: sizes >= 1, Hkv divides H, dtype and head dim supported,
// the rung's own refuse(). Throws AttnError.
void validate_problem(const Stage& s, const AttnProblem& p);
// Non-null q/k/v/o (and the descales of e4m3 inputs), workspace large enough, q/k/v/o and
// workspace 16-byte aligned. Throws AttnError.
void validate_tensors(const Stage& s, const AttnProblem& p, const AttnTensors& t);
// The current device's compute capability >= min_sm (and <= max_sm where set). Throws AttnError.
void validate_device(const Stage& s);
// Free device memory >= bytes, else AttnError naming `what` and the bytes it needs.
void require_device_memory(size_t bytes, const std::string& what);

// All three validations, then launch, then a launch-error check. The one way to run a rung.
void run_stage(const Stage& s, const AttnProblem& p, const AttnTensors& t, cudaStream_t stream);

// The rung has a backward pass ("no backward pass" otherwise), validate_problem, its
// backward head dims and backward_refuse. Throws AttnError.
void validate_backward_problem(const Stage& s, const AttnProblem& p);
// Non-null q, k, v, o, dout, lse, dq, dk, dv; workspace large enough. Throws AttnError.
void validate_backward_tensors(const Stage& s, const AttnProblem& p, const AttnBwdTensors& t);
// The backward's validations and validate_device, then launch_backward, then a launch-error
// check. The one way to run a rung's backward pass.
void run_backward(const Stage& s, const AttnProblem& p, const AttnBwdTensors& t, cudaStream_t stream);

}  // namespace attn
