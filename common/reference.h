// fp64 CPU attention: the ground truth for tests and --check. Masking (bottom-right causal
// alignment), GQA and scale exactly as attention.h defines them.
#pragma once

#include <cstdint>
#include <vector>

#include "common/attention.h"

namespace attn {

// One query row to evaluate: batch b, query head h, row i.
struct RowIndex {
  int b, h;
  int64_t i;
};

// Inputs as float (bf16/fp16 convert exactly to float), [B,H,N,d] layouts.
struct HostInputs {
  std::vector<float> q, k, v;
};

// O rows (d values each, in `rows` order) and their logsumexp (natural log; -inf for a
// row that sees no key, whose O row is 0). Runs on all hardware threads.
struct ReferenceRows {
  std::vector<double> o;    // rows.size() * d
  std::vector<double> lse;  // rows.size()
};
ReferenceRows reference_rows(const AttnProblem& p, const HostInputs& in, const std::vector<RowIndex>& rows);

// The softmax probabilities of one row (Nk values; 0 where masked): for tests.
std::vector<double> reference_probs(const AttnProblem& p, const HostInputs& in, const RowIndex& row);

// Every row of every head, in [B,H,Nq] order.
std::vector<RowIndex> all_rows(const AttnProblem& p);
// `per_head` rows per (b, h): the first and last rows and evenly spread ones between
// (the causal edge cases sit at both ends), for problems too large to check in full.
std::vector<RowIndex> sampled_rows(const AttnProblem& p, int per_head);

// Conversions of stored 16-bit elements to float.
float bf16_to_float(uint16_t x);
float fp16_to_float(uint16_t x);
std::vector<float> to_float(const std::vector<uint16_t>& raw, DType t);

// ||a - b|| / ||b|| (relative Frobenius error); max |a - b| via *max_abs if given.
double rel_frobenius(const std::vector<double>& a, const std::vector<double>& b, double* max_abs = nullptr);

}  // namespace attn
