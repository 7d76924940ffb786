// common/smem_limit.h's decision at the opt-in limits of the GPUs below Hopper, and what it
// means for 05's tiles: the README's "minimum GPU" column.
#include <gtest/gtest.h>

#include <string>

#include "05_fa2_reordered/fa2_backward.h"
#include "05_fa2_reordered/fa2_tiles.h"
#include "common/smem_limit.h"

namespace {

using namespace attn;

constexpr size_t kSm86Limit = 101376;  // 99 KiB: sm_86 and sm_89 (RTX 30 and 40 series, A10, L4)
constexpr size_t kSm80Limit = 166912;  // 163 KiB: sm_80 (A100)
constexpr size_t kSm90Limit = 232448;  // 227 KiB: sm_90 (H100, H200)

bool mentions(const std::string& text, size_t number) { return text.find(std::to_string(number)) != std::string::npos; }

TEST(SmemLimit, FitsUpToTheLimitAndRefusesPastItNamingBothNumbers) {
  for (size_t limit : {kSm86Limit, kSm80Limit}) {
    EXPECT_EQ(smem_refusal("a kernel", limit, limit), "") << limit;
    EXPECT_EQ(smem_refusal("a kernel", 0, limit), "") << limit;
    const std::string refusal = smem_refusal("05_fa2_reordered backward", limit + 1, limit);
    ASSERT_FALSE(refusal.empty()) << limit;
    EXPECT_EQ(refusal.rfind("05_fa2_reordered backward", 0), 0u) << refusal;
    EXPECT_TRUE(mentions(refusal, limit + 1)) << refusal;
    EXPECT_TRUE(mentions(refusal, limit)) << refusal;
  }
}

TEST(SmemLimit, Fa2ForwardFitsSm86AndItsD128BackwardNeedsSm80) {
  for (size_t bytes : {size_t(fa2::TileFor<64>::kSmemBytes), size_t(fa2::TileFor<128>::kSmemBytes),
                       size_t(fa2::TileFor<256>::kSmemBytes), size_t(fa2::BwdTileFor<64>::kSmemBytes)})
    EXPECT_EQ(smem_refusal("05", bytes, kSm86Limit), "") << bytes;
  const size_t bwd128 = fa2::BwdTileFor<128>::kSmemBytes;
  EXPECT_NE(smem_refusal("05 backward d = 128", bwd128, kSm86Limit), "") << bwd128;
  EXPECT_EQ(smem_refusal("05 backward d = 128", bwd128, kSm80Limit), "") << bwd128;
  EXPECT_EQ(smem_refusal("05 backward d = 128", bwd128, kSm90Limit), "") << bwd128;
}

}  // namespace
