/* C entry points: run any rung from C, Python (ctypes) or another language. */
#ifndef ATTN_LADDER_C_API_H
#define ATTN_LADDER_C_API_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int B, H, Hkv, Nq, Nk, d;
  int causal;  /* 0 or 1; bottom-right aligned when Nq != Nk */
  int dtype;   /* 0 bf16, 1 fp16, 2 fp8 */
  float scale; /* 0 = 1/sqrt(d) */
} attn_problem_t;

enum { ATTN_OK = 0, ATTN_INVALID_INPUT = 1, ATTN_CUDA_ERROR = 2, ATTN_UNKNOWN_RUNG = 3 };

int attn_num_rungs(void);
/* Name of rung i in ladder order, or NULL when i is out of range. */
const char* attn_rung_name(int i);

/* Runs `rung` on device tensors q [B,H,Nq,d], k and v [B,Hkv,Nk,d], writing o [B,H,Nq,d]
   and, when lse is non-null and the rung writes it, lse [B,H,Nq] (fp32, natural log).
   Enqueues on `stream` (a cudaStream_t; NULL = default stream) and allocates and frees any
   workspace itself. Returns ATTN_OK, or an error code with a message in err. */
int attn_run(const char* rung, const attn_problem_t* p, const void* q, const void* k, const void* v, void* o,
             float* lse, void* stream, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif
