// GPU tests of the paged decode (attn_decode_paged_async, fa2_decode.cuh's paged path): K and V
// in pages [num_pages, page_size, Hkv, d] handed out in a random order, a block table with
// out-of-range garbage past each sequence's pages, ragged lengths in one batch, against fp64 per
// sequence; bad tables and lengths refused through the fault records; a CUDA graph replayed with
// new lengths; small shapes for compute-sanitizer. Without a GPU every test skips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>

#include "bench/harness.h"
#include "common/check.h"
#include "common/tolerance.h"
#include "ladder/c_api.h"
#include "ladder/registry.h"
#include "tests/gpu_test_util.h"

using namespace attn;
using namespace attn::testing;

namespace {

constexpr int kGarbagePage = 0x7fffffff;  // block-table entries past a sequence's pages

// One batch of sequences in a paged cache, with each sequence's own contiguous inputs (for the
// fp64 reference) kept beside it.
struct PagedBatch {
  attn_paged_problem_t c{};
  std::vector<int> lens;
  std::vector<ProblemInputs> seqs;  // [1, H, Nq, d] and [1, Hkv, max(len, 1), d] each
  DeviceBuffer q, k_cache, v_cache, block_table, seq_lens, o, lse, workspace;
  std::vector<int> table;  // host copy of block_table

  AttnProblem seq_problem(int len) const {
    AttnProblem p;
    p.B = 1;
    p.H = c.H;
    p.Hkv = c.Hkv;
    p.Nq = c.Nq;
    p.Nk = std::max(len, 1);
    p.d = c.d;
    p.causal = c.causal != 0;
    p.dtype = c.dtype == 0 ? DType::bf16 : DType::fp16;
    return p;
  }
};

// Builds the batch: pages shuffled (seed), `spare` unused pages, one spare block-table column
// of garbage, O, lse and the workspace poisoned.
PagedBatch make_batch(int H, int Hkv, int Nq, int d, int page_size, std::vector<int> lens, bool causal, DType dtype,
                      uint64_t seed, cudaStream_t stream, int spare = 3) {
  PagedBatch b;
  b.lens = lens;
  const int B = int(lens.size());
  int max_pages = 1, used = 0;
  for (int len : lens) {
    const int pages = (len + page_size - 1) / page_size;
    max_pages = std::max(max_pages, pages);
    used += pages;
  }
  max_pages += 1;  // a column of garbage the kernel must never follow
  b.c = attn_paged_problem_t{B, H, Hkv, Nq, d, used + spare, page_size, max_pages, causal ? 1 : 0,
                             dtype == DType::bf16 ? 0 : 1, 0.f};
  const size_t e = 2, row = size_t(Hkv) * d;  // a token: Hkv * d elements
  std::vector<int> order(b.c.num_pages);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
  b.table.assign(size_t(B) * max_pages, kGarbagePage);
  std::vector<uint16_t> kc(size_t(b.c.num_pages) * page_size * row, 0), vc(kc.size(), 0);
  const size_t q_seq = size_t(H) * Nq * d;
  b.q = DeviceBuffer(q_seq * B * e);
  int next = 0;
  for (int s = 0; s < B; ++s) {
    b.seqs.emplace_back(b.seq_problem(lens[s]), seed + 101 * s, Fill::normal, 0.f, 1.f, stream, true);
    const ProblemInputs& in = b.seqs.back();
    CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(b.q.get()) + s * q_seq * e, in.q.get(), q_seq * e,
                               cudaMemcpyDeviceToDevice, stream));
    const int n = std::max(lens[s], 1);
    std::vector<uint16_t> k(size_t(Hkv) * n * d), v(k.size());
    CUDA_CHECK(cudaMemcpy(k.data(), in.k.get(), k.size() * e, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(v.data(), in.v.get(), v.size() * e, cudaMemcpyDeviceToHost));
    for (int t = 0; t < lens[s]; ++t) {
      if (t % page_size == 0) b.table[size_t(s) * max_pages + t / page_size] = order[next++];
      const int page = b.table[size_t(s) * max_pages + t / page_size];
      for (int h = 0; h < Hkv; ++h) {
        const size_t dst = ((size_t(page) * page_size + t % page_size) * Hkv + h) * d;
        const size_t src = (size_t(h) * n + t) * d;
        std::memcpy(&kc[dst], &k[src], d * e);
        std::memcpy(&vc[dst], &v[src], d * e);
      }
    }
  }
  b.k_cache = DeviceBuffer(kc.size() * e);
  b.v_cache = DeviceBuffer(vc.size() * e);
  b.block_table = DeviceBuffer(b.table.size() * sizeof(int));
  b.seq_lens = DeviceBuffer(lens.size() * sizeof(int));
  CUDA_CHECK(cudaMemcpy(b.k_cache.get(), kc.data(), b.k_cache.bytes(), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(b.v_cache.get(), vc.data(), b.v_cache.bytes(), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(b.block_table.get(), b.table.data(), b.block_table.bytes(), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(b.seq_lens.get(), lens.data(), b.seq_lens.bytes(), cudaMemcpyHostToDevice));
  b.o = DeviceBuffer(q_seq * B * e);
  b.lse = DeviceBuffer(size_t(B) * H * Nq * sizeof(float));
  char err[1024] = "";
  size_t need = 0;
  EXPECT_EQ(attn_decode_paged_workspace_bytes(&b.c, &need, err, sizeof err), ATTN_OK) << err;
  b.workspace = DeviceBuffer(need);
  fill_poison(b.o.get(), b.o.bytes(), stream);
  fill_poison(b.lse.get(), b.lse.bytes(), stream);
  fill_poison(b.workspace.get(), b.workspace.bytes(), stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return b;
}

int run(PagedBatch& b, cudaStream_t stream, std::string* message = nullptr) {
  char err[1024] = "";
  int rc = attn_decode_paged_async(&b.c, b.q.get(), b.k_cache.get(), b.v_cache.get(), b.block_table.as<int>(),
                                   b.seq_lens.as<int>(), b.o.get(), b.lse.as<float>(), b.workspace.get(),
                                   b.workspace.bytes(), stream, err, sizeof err);
  int checked = 0;
  if (rc == ATTN_OK) rc = attn_decode_paged_check(&b.c, b.workspace.get(), stream, &checked, err, sizeof err);
  if (rc == ATTN_OK) EXPECT_EQ(checked, 1);
  if (message) *message = err;
  return rc;
}

// Sequence s's O and lse as a RungOutput of its own problem (for expect_matches_reference).
RungOutput slice(const PagedBatch& b, int s) {
  const size_t rows = size_t(b.c.H) * b.c.Nq, e = 2;
  RungOutput out;
  out.o = DeviceBuffer(rows * b.c.d * e);
  out.lse = DeviceBuffer(rows * sizeof(float));
  CUDA_CHECK(cudaMemcpy(out.o.get(), static_cast<const char*>(b.o.get()) + s * rows * b.c.d * e, out.o.bytes(),
                        cudaMemcpyDeviceToDevice));
  CUDA_CHECK(cudaMemcpy(out.lse.get(), b.lse.as<float>() + s * rows, out.lse.bytes(), cudaMemcpyDeviceToDevice));
  return out;
}

// Every sequence against fp64 (all rows, or sampled rows of long sequences).
void expect_batch_matches_fp64(const PagedBatch& b, cudaStream_t stream) {
  const Stage& decode = find_stage("05_fa2_decode");
  for (size_t s = 0; s < b.lens.size(); ++s) {
    SCOPED_TRACE("sequence " + std::to_string(s) + " of length " + std::to_string(b.lens[s]));
    const ProblemInputs& in = b.seqs[s];
    if (b.lens[s] == 0) {  // no key: O = 0, lse = -inf
      RungOutput out = slice(b, int(s));
      std::vector<double> o = download_as_double(out.o.get(), in.p.o_elems(), in.p.dtype);
      EXPECT_TRUE(std::all_of(o.begin(), o.end(), [](double x) { return x == 0; }));
      continue;
    }
    const double macs = double(in.p.H) * in.p.Nq * double(in.p.Nk) * in.p.d;
    std::vector<RowIndex> rows = macs <= 2e8 ? all_rows(in.p) : sampled_rows(in.p, 6);
    expect_matches_reference(decode, slice(b, int(s)), in, rows, reference_rows(in.p, in.host, rows), stream);
  }
}

struct PagedShape {
  int page_size, Nq;
  bool causal;
  int d;
  DType dtype;
};
std::string name_of(const PagedShape& s) {
  std::ostringstream os;
  os << dtype_name(s.dtype) << "_d" << s.d << "_page" << s.page_size << "_Nq" << s.Nq << (s.causal ? "_causal" : "");
  return os.str();
}
void PrintTo(const PagedShape& s, std::ostream* os) { *os << name_of(s); }

class PagedDecode : public Gpu, public ::testing::WithParamInterface<PagedShape> {};

// Lengths 1, 17, 4097 and 100003 in one batch, H = 8 over Hkv = 2 (GQA 4), pages shuffled.
TEST_P(PagedDecode, RaggedBatchMatchesFp64) {
  const PagedShape s = GetParam();
  PagedBatch b = make_batch(8, 2, s.Nq, s.d, s.page_size, {1, 17, 4097, 100003}, s.causal, s.dtype,
                            7 + s.page_size + s.Nq, stream_);
  if (!runs_here(find_stage("05_fa2_decode"), b.seq_problem(1))) GTEST_SKIP() << "no decode kernel for this shape here";
  std::string msg;
  ASSERT_EQ(run(b, stream_, &msg), ATTN_OK) << msg;
  expect_batch_matches_fp64(b, stream_);
}

std::vector<PagedShape> paged_shapes() {
  std::vector<PagedShape> shapes;
  for (int page : {16, 64, 256})
    for (int Nq : {1, 4, 64}) shapes.push_back({page, Nq, true, 128, DType::bf16});
  shapes.push_back({64, 4, false, 128, DType::bf16});
  shapes.push_back({16, 4, true, 64, DType::fp16});
  shapes.push_back({48, 1, false, 64, DType::bf16});  // a page size no power of two
  // load_paged_tiles' paths: a block in one page (64, 256, 128), a lookup per row by shift
  // (16, 1) or by division (48, 96: one block spans two pages)
  shapes.push_back({128, 1, false, 128, DType::fp16});
  shapes.push_back({96, 4, true, 128, DType::bf16});
  shapes.push_back({1, 1, true, 64, DType::bf16});
  return shapes;
}

INSTANTIATE_TEST_SUITE_P(Shapes, PagedDecode, ::testing::ValuesIn(paged_shapes()),
                         [](const auto& info) { return name_of(info.param); });

// A page index out of range, a negative one, a negative length and a length beyond the pages:
// each refused with its message, the sequence's O NaN; the next good call is clean.
TEST_F(Gpu, PagedDecodeRefusesBadTables) {
  struct Bad {
    const char* what;
    int seq, column, page;  // table edit (column < 0: none)
    int len;                // length edit (-2: none)
    const char* message;
  };
  const Bad cases[] = {
      {"page past the cache", 1, 1, 1000000, -2, "block_table[1][1] = 1000000 is not a page index"},
      {"negative page", 2, 0, -3, -2, "block_table[2][0] = -3 is not a page index"},
      {"negative length", 0, -1, 0, -5, "seq_lens[0] = -5 is negative"},
      {"length beyond the pages", 1, -1, 0, 100000, "is beyond the"},
  };
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.what);
    PagedBatch b = make_batch(4, 2, 4, 64, 16, {20, 40, 70}, true, DType::bf16, 5, stream_);
    std::vector<int> lens = b.lens;
    const std::vector<int> good = b.table;
    if (c.column >= 0) {
      b.table[size_t(c.seq) * b.c.max_pages + c.column] = c.page;
      CUDA_CHECK(cudaMemcpy(b.block_table.get(), b.table.data(), b.block_table.bytes(), cudaMemcpyHostToDevice));
    }
    if (c.len != -2) {
      lens[c.seq] = c.len;
      CUDA_CHECK(cudaMemcpy(b.seq_lens.get(), lens.data(), b.seq_lens.bytes(), cudaMemcpyHostToDevice));
    }
    std::string msg;
    EXPECT_EQ(run(b, stream_, &msg), ATTN_INVALID_INPUT);
    EXPECT_NE(msg.find(c.message), std::string::npos) << msg;
    RungOutput out = slice(b, c.seq);
    std::vector<double> o = download_as_double(out.o.get(), int64_t(b.c.H) * b.c.Nq * b.c.d, DType::bf16);
    EXPECT_TRUE(std::all_of(o.begin(), o.end(), [](double x) { return std::isnan(x); })) << "bad sequence's O not NaN";
    // Repaired, the same workspace reports nothing (every record is rewritten: no fault carries over).
    b.table = good;
    CUDA_CHECK(cudaMemcpy(b.block_table.get(), b.table.data(), b.block_table.bytes(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(b.seq_lens.get(), b.lens.data(), b.seq_lens.bytes(), cudaMemcpyHostToDevice));
    EXPECT_EQ(run(b, stream_, &msg), ATTN_OK) << msg;
  }
  // Two bad sequences: the first one's fault is the one reported, whatever order the CTAs ran in.
  {
    PagedBatch b = make_batch(4, 2, 4, 64, 16, {20, 40, 70}, true, DType::bf16, 5, stream_);
    b.table[size_t(2) * b.c.max_pages + 3] = -7;
    b.table[size_t(1) * b.c.max_pages + 2] = b.c.num_pages;
    CUDA_CHECK(cudaMemcpy(b.block_table.get(), b.table.data(), b.block_table.bytes(), cudaMemcpyHostToDevice));
    std::string msg;
    EXPECT_EQ(run(b, stream_, &msg), ATTN_INVALID_INPUT);
    EXPECT_NE(msg.find("block_table[1][2] = " + std::to_string(b.c.num_pages) + " is not a page index"),
              std::string::npos) << msg;
  }
  // What the host sees is refused before any launch.
  PagedBatch b = make_batch(4, 2, 1, 64, 16, {20}, false, DType::bf16, 5, stream_);
  char err[1024] = "";
  attn_paged_problem_t c = b.c;
  c.page_size = 0;
  size_t need = 0;
  EXPECT_EQ(attn_decode_paged_workspace_bytes(&c, &need, err, sizeof err), ATTN_INVALID_INPUT);
  c = b.c;
  EXPECT_EQ(attn_decode_paged_async(&c, b.q.get(), b.k_cache.get(), b.v_cache.get(), nullptr, b.seq_lens.as<int>(),
                                    b.o.get(), nullptr, b.workspace.get(), b.workspace.bytes(), stream_, err,
                                    sizeof err),
            ATTN_INVALID_INPUT);
  EXPECT_NE(std::string(err).find("block_table is a null pointer"), std::string::npos) << err;
  EXPECT_EQ(attn_decode_paged_async(&c, b.q.get(), b.k_cache.get(), b.v_cache.get(), b.block_table.as<int>(),
                                    b.seq_lens.as<int>(), b.o.get(), nullptr, b.workspace.get(), 16, stream_, err,
                                    sizeof err),
            ATTN_INVALID_INPUT);
  EXPECT_NE(std::string(err).find("workspace of 16 bytes"), std::string::npos) << err;
}

// Captured once, replayed with new lengths: the same bits as eager calls with those lengths.
TEST_F(Gpu, PagedDecodeReplaysInAGraphWithNewLengths) {
  PagedBatch b = make_batch(8, 2, 4, 128, 64, {300, 5000, 64}, true, DType::bf16, 11, stream_);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  char err[1024] = "";
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  const int rc = attn_decode_paged_async(&b.c, b.q.get(), b.k_cache.get(), b.v_cache.get(), b.block_table.as<int>(),
                                         b.seq_lens.as<int>(), b.o.get(), b.lse.as<float>(), b.workspace.get(),
                                         b.workspace.bytes(), stream_, err, sizeof err);
  int checked = 1;
  EXPECT_EQ(attn_decode_paged_check(&b.c, b.workspace.get(), stream_, &checked, err, sizeof err), ATTN_OK) << err;
  EXPECT_EQ(checked, 0) << "no synchronization while capturing";
  CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  ASSERT_EQ(rc, ATTN_OK) << err;
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (std::vector<int> lens : {std::vector<int>{300, 5000, 64}, std::vector<int>{1, 17, 0}}) {
    CUDA_CHECK(cudaMemcpy(b.seq_lens.get(), lens.data(), b.seq_lens.bytes(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    EXPECT_EQ(attn_decode_paged_check(&b.c, b.workspace.get(), stream_, &checked, err, sizeof err), ATTN_OK) << err;
    EXPECT_EQ(checked, 1);
    std::vector<unsigned char> replayed(b.o.bytes()), eager(b.o.bytes());
    CUDA_CHECK(cudaMemcpy(replayed.data(), b.o.get(), b.o.bytes(), cudaMemcpyDeviceToHost));
    fill_poison(b.o.get(), b.o.bytes(), stream_);
    std::string msg;
    ASSERT_EQ(run(b, stream_, &msg), ATTN_OK) << msg;
    CUDA_CHECK(cudaMemcpy(eager.data(), b.o.get(), b.o.bytes(), cudaMemcpyDeviceToHost));
    EXPECT_TRUE(replayed == eager) << "replay with lengths " << lens[0] << ", " << lens[1] << ", " << lens[2];
  }
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
}

// Small paged shapes for compute-sanitizer (scripts/reproduce.sh runs '*Sanitize*'): an empty
// sequence, one shorter than Nq, ragged pages, several splits, a bad page (refused without
// an out-of-bounds read: the cache holds exactly num_pages pages).
TEST_F(Gpu, SanitizePagedDecode) {
  for (int page : {16, 64}) {
    PagedBatch b = make_batch(4, 2, 4, 64, page, {0, 3, 130, 1500}, true, DType::bf16, 3, stream_, 0);
    std::string msg;
    ASSERT_EQ(run(b, stream_, &msg), ATTN_OK) << msg;
    expect_batch_matches_fp64(b, stream_);
    b.table[size_t(3) * b.c.max_pages + 2] = b.c.num_pages;  // one past the last page
    CUDA_CHECK(cudaMemcpy(b.block_table.get(), b.table.data(), b.block_table.bytes(), cudaMemcpyHostToDevice));
    EXPECT_EQ(run(b, stream_, &msg), ATTN_INVALID_INPUT);
    EXPECT_NE(msg.find("block_table[3][2]"), std::string::npos) << msg;
  }
}

}  // namespace
