#pragma once
#include <vector>
#include "common/stage.h"

namespace attn {
std::vector<Stage> online_softmax_stages();
}
