// Error macros: every CUDA / cuBLAS call is checked and a failure throws with the call
// text, the error string and file:line.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <sstream>
#include <stdexcept>
#include <string>

namespace attn {

struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void throw_cuda(const char* call, const std::string& what, const char* file, int line) {
  std::ostringstream os;
  os << file << ":" << line << ": " << call << " failed: " << what;
  throw CudaError(os.str());
}

const char* cublas_status_name(cublasStatus_t s);

}  // namespace attn

#define CUDA_CHECK(call)                                                                  \
  do {                                                                                    \
    cudaError_t err_ = (call);                                                            \
    if (err_ != cudaSuccess)                                                              \
      ::attn::throw_cuda(#call, std::string(cudaGetErrorName(err_)) + " (" +              \
                                    cudaGetErrorString(err_) + ")",                       \
                         __FILE__, __LINE__);                                             \
  } while (0)

// After a <<<...>>> launch: configuration errors show up here.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

#define CUBLAS_CHECK(call)                                                                \
  do {                                                                                    \
    cublasStatus_t st_ = (call);                                                          \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                     \
      ::attn::throw_cuda(#call, ::attn::cublas_status_name(st_), __FILE__, __LINE__);     \
  } while (0)
