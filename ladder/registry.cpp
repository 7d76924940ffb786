#include "ladder/registry.h"

#include <sstream>

#include "01_naive/naive.h"
#include "02_safe_softmax/safe_softmax.h"
#include "03_online_softmax/online_softmax.h"
#include "04_fa1_tiled/fa1.h"
#include "05_fa2_reordered/fa2.h"
#include "06_fa3_hopper/fa3.h"

namespace attn {

// The ladder, in order. This is the only list of rungs; a new rung adds its stages here.
const std::vector<Stage>& registry() {
  static const std::vector<Stage> stages = [] {
    std::vector<Stage> all;
    for (auto&& rung : {naive_stages(), safe_softmax_stages(), online_softmax_stages(), fa1_stages(),
                        fa2_stages(), fa3_stages()})
      all.insert(all.end(), rung.begin(), rung.end());
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
