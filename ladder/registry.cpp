#include "ladder/registry.h"

#include <sstream>

// CMakeLists.txt defines ATTN_HAS_RUNG_<nn> for each rung it builds: all of them, or in a
// lab build (cmake/lab.cmake) only those the lab needs.
#ifdef ATTN_HAS_RUNG_01
#include "01_naive/naive.h"
#endif
#ifdef ATTN_HAS_RUNG_02
#include "02_safe_softmax/safe_softmax.h"
#endif
#ifdef ATTN_HAS_RUNG_03
#include "03_online_softmax/online_softmax.h"
#endif
#ifdef ATTN_HAS_RUNG_04
#include "04_fa1_tiled/fa1.h"
#endif
#ifdef ATTN_HAS_RUNG_05
#include "05_fa2_reordered/fa2.h"
#endif
#ifdef ATTN_HAS_RUNG_06
#include "06_fa3_hopper/fa3.h"
#endif

namespace attn {

// The ladder, in order. This is the only list of rungs; a new rung adds its stages here.
const std::vector<Stage>& registry() {
  static const std::vector<Stage> stages = [] {
    std::vector<Stage> all;
    auto add = [&all](std::vector<Stage> rung) { all.insert(all.end(), rung.begin(), rung.end()); };
#ifdef ATTN_HAS_RUNG_01
    add(naive_stages());
#endif
#ifdef ATTN_HAS_RUNG_02
    add(safe_softmax_stages());
#endif
#ifdef ATTN_HAS_RUNG_03
    add(online_softmax_stages());
#endif
#ifdef ATTN_HAS_RUNG_04
    add(fa1_stages());
#endif
#ifdef ATTN_HAS_RUNG_05
    add(fa2_stages());
#endif
#ifdef ATTN_HAS_RUNG_06
    add(fa3_stages());
#endif
    return all;
  }();
  return stages;
}

const Stage& find_stage(const std::string& name) {
  for (const Stage& s : registry())
    if (s.name == name) return s;
  std::ostringstream os;
  os << "unknown rung '" << name << "'; registered:";
  for (const Stage& s : registry()) os << " " << s.name;
  throw AttnError(os.str());
}

}  // namespace attn
