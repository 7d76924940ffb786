#pragma once
#include <vector>
#include "common/stage.h"

namespace attn {
std::vector<Stage> fa2_stages();
}
