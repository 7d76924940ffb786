// The ladder: the one list of rungs, above every rung. The bench, the tests and the C API
// iterate registry(); nothing else lists the rungs.
#pragma once

#include <string>
#include <vector>

#include "common/stage.h"

namespace attn {

// All rungs, in ladder order.
const std::vector<Stage>& registry();
// Throws AttnError listing the registered names when `name` is unknown.
const Stage& find_stage(const std::string& name);

}  // namespace attn
