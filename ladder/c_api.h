/* C entry points: run any rung from C, Python (ctypes) or another language.

   Two ways to run a rung:
   - attn_run_async: the caller owns everything. It passes a workspace of at least
     attn_workspace_bytes() bytes (NULL when that is 0) and a stream; the call validates,
     enqueues and returns. It never allocates, never synchronizes and never queries free
     memory, so it can be captured in a CUDA graph and its workspace can come from any
     allocator (PyTorch's caching allocator, say). The exception: 01, 02 and 03a run their two
     GEMMs on cuBLAS, which creates its handle on the first call on a device and manages its
     own workspace; run them once before capturing them.
   - attn_run: the convenience entry. It allocates the workspace on `stream` with
     cudaMallocAsync and frees it there with cudaFreeAsync after the launch, with no
     synchronization either.
   A rung on e4m3 inputs (dtype 3, "06_fp8_e4m3") takes their descales besides: run it with
   attn_run_fp8_async, which is attn_run_async with three more pointers.

   The backward pass (dq, dk, dv from dout = dL/do), for the rungs that have one
   (attn_backward_info): attn_backward_workspace_bytes and attn_run_backward_async, the
   backward's attn_workspace_bytes and attn_run_async, with the same ownership rules. It reads
   the forward's o and lse, so run the forward with a non-null lse first. */
#ifndef ATTN_LADDER_C_API_H
#define ATTN_LADDER_C_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int B, H, Hkv, Nq, Nk, d;
  int causal;  /* 0 or 1; bottom-right aligned when Nq != Nk */
  int dtype;   /* 0 bf16, 1 fp16, 2 fp8 (bf16 tensors quantized inside), 3 e4m3 (e4m3 tensors + descales) */
  float scale; /* 0 = 1/sqrt(d) */
} attn_problem_t;

enum { ATTN_OK = 0, ATTN_INVALID_INPUT = 1, ATTN_CUDA_ERROR = 2, ATTN_UNKNOWN_RUNG = 3 };

enum { ATTN_MAX_HEAD_DIMS = 8 };

/* What a rung accepts, without a GPU. */
typedef struct {
  int dtypes;                          /* bit c set: dtype code c (attn_problem_t.dtype) accepted */
  int head_dims[ATTN_MAX_HEAD_DIMS];   /* the first num_head_dims entries are valid */
  int num_head_dims;
  int writes_lse;                      /* 1: fills lse when it is non-null */
  int gqa;                             /* 1: accepts Hkv < H */
  int min_sm;                          /* minimum compute capability, major * 10 + minor */
} attn_rung_info_t;

int attn_num_rungs(void);
/* Name of rung i in ladder order, or NULL when i is out of range. */
const char* attn_rung_name(int i);

/* Fills *info for `rung`. Returns ATTN_OK or ATTN_UNKNOWN_RUNG (message in err). */
int attn_rung_info(const char* rung, attn_rung_info_t* info, char* err, size_t err_len);

/* Validates the problem for `rung` (no GPU needed) and writes the workspace it needs, in
   bytes, to *bytes (0 for most fused rungs). 05_fa2_decode's depends on the current device's
   SM count: ask on the device it will run on. */
int attn_workspace_bytes(const char* rung, const attn_problem_t* p, size_t* bytes, char* err, size_t err_len);

/* Runs `rung` on device tensors q [B,H,Nq,d], k and v [B,Hkv,Nk,d], writing o [B,H,Nq,d]
   and, when lse is non-null and the rung writes it, lse [B,H,Nq] (fp32, natural log).
   Contiguous; q, k, v, o and the workspace 16-byte aligned (refused otherwise).
   workspace: device memory of workspace_bytes >= attn_workspace_bytes(), or NULL when that
   is 0; it must stay allocated until the work enqueued on `stream` is done. Enqueues on
   `stream` (a cudaStream_t; NULL = default stream). Returns ATTN_OK, or an error code with
   a message in err. */
int attn_run_async(const char* rung, const attn_problem_t* p, const void* q, const void* k, const void* v, void* o,
                   float* lse, void* workspace, size_t workspace_bytes, void* stream, char* err, size_t err_len);

/* As attn_run_async, with the workspace allocated and freed in stream order on `stream`. */
int attn_run(const char* rung, const attn_problem_t* p, const void* q, const void* k, const void* v, void* o,
             float* lse, void* stream, char* err, size_t err_len);

/* For a rung on e4m3 inputs (dtype 3): how many rows of Q share one q_descale, and how many
   keys of K and V one k_descale and v_descale, for problem p. Refuses (ATTN_INVALID_INPUT) a
   rung that takes no descales. */
int attn_descale_blocks(const char* rung, const attn_problem_t* p, int* q_rows, int* kv_rows, char* err,
                        size_t err_len);

/* As attn_run_async, on e4m3 q, k, v (p->dtype = 3, bytes as PyTorch's float8_e4m3fn) with
   their fp32 dequantization scales, one per block (attn_descale_blocks): q_descale
   [B, H, ceil(Nq / q_rows)], k_descale and v_descale [B, Hkv, ceil(Nk / kv_rows)], positive
   normal floats. o is bf16. Never allocates or synchronizes. */
int attn_run_fp8_async(const char* rung, const attn_problem_t* p, const void* q, const void* k, const void* v,
                       const float* q_descale, const float* k_descale, const float* v_descale, void* o, float* lse,
                       void* workspace, size_t workspace_bytes, void* stream, char* err, size_t err_len);

/* The backward pass of `rung`, without a GPU: writes to head_dims (room for
   ATTN_MAX_HEAD_DIMS) the head dims it has a backward for and their number to
   *num_head_dims; 0 for a forward-only rung (its backward calls return ATTN_INVALID_INPUT,
   "no backward pass"). Its dtypes are the forward's (attn_rung_info). */
int attn_backward_info(const char* rung, int* head_dims, int* num_head_dims, char* err, size_t err_len);

/* Validates the backward problem for `rung` (no GPU needed) and writes the workspace the
   backward needs, in bytes, to *bytes (04 and 05: fp32 dQ accumulators of about B*H*Nq*d
   floats, 05's with Nq rounded up to 8 rows, and its D, B*H*Nq more; 05_fa2_dq_pass: D
   alone). Ask: do not compute it. */
int attn_backward_workspace_bytes(const char* rung, const attn_problem_t* p, size_t* bytes, char* err,
                                  size_t err_len);

/* The backward of `rung` on device tensors, all in p->dtype (bf16 or fp16) but lse:
     q [B,H,Nq,d], k and v [B,Hkv,Nk,d]         the forward's inputs
     o [B,H,Nq,d], lse [B,H,Nq] fp32 natural log the forward's outputs (any rung's: both are
                                                 the exact attention up to rounding)
     dout [B,H,Nq,d]                             dL/do
   writes dq [B,H,Nq,d], dk and dv [B,Hkv,Nk,d] (GQA: dk, dv summed over the query heads of a
   group; every element written, no zeroing needed). Scale, causal mask and its bottom-right
   alignment as the forward. Contiguous, 16-byte aligned (05 copies 16-byte chunks), dq, dk,
   dv overlapping nothing. workspace: device memory of workspace_bytes >=
   attn_backward_workspace_bytes(), kept until the enqueued work is done. Enqueues on `stream`,
   never allocates, never synchronizes (a CUDA graph captures it). Returns ATTN_OK or an error
   code with a message in err. */
int attn_run_backward_async(const char* rung, const attn_problem_t* p, const void* q, const void* k, const void* v,
                            const void* o, const float* lse, const void* dout, void* dq, void* dk, void* dv,
                            void* workspace, size_t workspace_bytes, void* stream, char* err, size_t err_len);

/* Whether `rung`'s backward reads dout with any strides (attn_run_backward_strided_async):
   *strided = 1 (06o_bwd_tail_pieces, 06p_bwd_dq_writer, 06q_bwd_persistent, 06d_fa3) or 0
   (it takes dout contiguous). No GPU needed. */
int attn_backward_strided_dout(const char* rung, int* strided, char* err, size_t err_len);

/* attn_run_backward_async with dout's strides: dout_strides[3] = (batch, head, row) in
   elements, its d elements contiguous, each a positive multiple of 16 bytes (dL/do of a
   [B,Nq,H,d] tensor seen as [B,H,Nq,d]: (Nq*H*d, d, H*d)). NULL or the contiguous strides
   for any rung; others only where attn_backward_strided_dout says 1, else ATTN_INVALID_INPUT. */
int attn_run_backward_strided_async(const char* rung, const attn_problem_t* p, const void* q, const void* k,
                                    const void* v, const void* o, const float* lse, const void* dout,
                                    const int64_t* dout_strides, void* dq, void* dk, void* dv, void* workspace,
                                    size_t workspace_bytes, void* stream, char* err, size_t err_len);

/* Decode from a paged KV cache (the rung 05_fa2_decode's kernels; bf16 or fp16, d 64 or 128,
   Nq <= 64 query rows per head, GQA, causal bottom-right per sequence):
     q           [B, H, Nq, d]                      contiguous, 16-byte aligned
     k_cache     [num_pages, page_size, Hkv, d]     pages of page_size tokens (any page size >= 1;
     v_cache     [num_pages, page_size, Hkv, d]      16-256 is the usual range)
     block_table [B, max_pages] int32               sequence b's token n: page block_table[b][n / page_size]
     seq_lens    [B] int32                          sequence b's length, 0 <= seq_lens[b] <= max_pages * page_size
     o           [B, H, Nq, d], lse [B, H, Nq] fp32 (or NULL)
   block_table and seq_lens are read on the device only (a captured graph replays with new
   ones); the grid is sized for max_pages * page_size keys. A bad length or a page index
   outside [0, num_pages) among the pages a sequence's length uses is never dereferenced: the
   kernel sets that sequence's outputs to NaN and records the fault in the workspace's head;
   attn_decode_paged_check reports it. A query row that sees no key (seq_lens[b] = 0, or
   causal with seq_lens[b] < Nq) gets O = 0 and lse = -inf. */
typedef struct {
  int B, H, Hkv, Nq, d;
  int num_pages, page_size, max_pages;
  int causal;  /* 0 or 1; query row i of sequence b sees key j iff j <= i + seq_lens[b] - Nq */
  int dtype;   /* 0 bf16, 1 fp16 */
  float scale; /* 0 = 1/sqrt(d) */
} attn_paged_problem_t;

/* The workspace attn_decode_paged_async needs (never 0: the fault records' 256 bytes at least);
   it depends on the current device: ask on the device it will run on. */
int attn_decode_paged_workspace_bytes(const attn_paged_problem_t* p, size_t* bytes, char* err, size_t err_len);

/* Validates what the host sees (sizes, page size, pointers, alignment, workspace) and
   enqueues the split and combine kernels on `stream`. Never allocates, never
   synchronizes: a CUDA graph captures it. */
int attn_decode_paged_async(const attn_paged_problem_t* p, const void* q, const void* k_cache, const void* v_cache,
                            const int* block_table, const int* seq_lens, void* o, float* lse, void* workspace,
                            size_t workspace_bytes, void* stream, char* err, size_t err_len);

/* After attn_decode_paged_async (or a replay of a graph holding it) on `stream`: waits for the
   stream and reads the fault records in `workspace` (one per sequence and split: call it on the
   device the work ran on, as for the workspace's size). ATTN_OK, or ATTN_INVALID_INPUT with the
   first bad length or page index found ("seq_lens[3] = -5 is negative", "block_table[2][7] = 500 is
   not a page index in [0, 500)", ...); *checked = 1 (checked may be NULL). While `stream` is
   being captured it reads nothing (a synchronization would break the capture): ATTN_OK with
   *checked = 0; check after replaying the graph. */
int attn_decode_paged_check(const attn_paged_problem_t* p, const void* workspace, void* stream, int* checked,
                            char* err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif
