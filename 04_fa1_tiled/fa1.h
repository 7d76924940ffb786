#pragma once
#include <vector>
#include "common/stage.h"

namespace attn {
std::vector<Stage> fa1_stages();
}
