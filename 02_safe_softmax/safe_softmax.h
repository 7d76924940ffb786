#pragma once
#include <vector>
#include "common/stage.h"

namespace attn {
std::vector<Stage> safe_softmax_stages();
}
