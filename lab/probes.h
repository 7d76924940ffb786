// Probes: unit checks that run one piece of the graded rung's device code alone on the GPU
// (lab/exercises.json: an exercise's "probe" source, linked into lab_grade by
// lab/grader.cmake), so that a wrong piece is named before, or instead of, a whole kernel
// that would hang on it.
#pragma once

#include <string>

namespace attn::lab {

struct ProbeResult {
  bool known = false;   // the probe has a check of this kind
  bool passed = false;
  bool hung = false;    // a kernel did not finish: the process must exit without waiting for it
  std::string detail;
};

// The probe's check `kind`; known = false if it has none of that kind.
ProbeResult run_probe(const std::string& kind);

}  // namespace attn::lab
