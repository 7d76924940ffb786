// fp64 CPU backward pass: the ground truth for the rungs' dQ, dK, dV (attention.h,
// AttnBwdTensors, for the formulas). Masking, GQA and scale as reference.h's forward.
#pragma once

#include <vector>

#include "common/attention.h"
#include "common/reference.h"

namespace attn {

// The gradients of the whole problem: dq [B,H,Nq,d], dk and dv [B,Hkv,Nk,d]; P and dP are
// recomputed in fp64 from the inputs (not taken from a rung), dS through the softmax's Jacobian.
struct ReferenceGrads {
  std::vector<double> dq, dk, dv;
};

// dout: dL/dO as float, [B,H,Nq,d]. Two passes on all hardware threads, O(N) extra memory:
// query rows (P, dP, dQ of each row), then keys (dK, dV of each key, summed over the
// query heads of its group). About 8 B H Nq Nk d floating-point operations.
ReferenceGrads reference_backward(const AttnProblem& p, const HostInputs& in, const std::vector<float>& dout);

}  // namespace attn
