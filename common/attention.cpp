#include "common/attention.h"

#include <sstream>

#include "common/stage.h"

namespace attn {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::bf16: return "bf16";
    case DType::fp16: return "fp16";
    case DType::fp8_e4m3: return "fp8";
    case DType::e4m3: return "e4m3";
  }
  return "?";
}

DType parse_dtype(const std::string& s) {
  if (s == "bf16") return DType::bf16;
  if (s == "fp16") return DType::fp16;
  if (s == "fp8" || s == "fp8_e4m3") return DType::fp8_e4m3;
  if (s == "e4m3") return DType::e4m3;
  throw AttnError("unknown dtype '" + s + "' (expected bf16, fp16, fp8 or e4m3)");
}

size_t dtype_bytes(DType t) { return t == DType::fp8_e4m3 || t == DType::e4m3 ? 1 : 2; }

std::string AttnProblem::describe() const {
  std::ostringstream os;
  os << "B=" << B << " H=" << H << " Hkv=" << Hkv << " Nq=" << Nq << " Nk=" << Nk << " d=" << d
     << (causal ? " causal " : " ") << dtype_name(dtype);
  return os.str();
}

}  // namespace attn
