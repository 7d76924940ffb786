#pragma once
#include <vector>
#include "common/stage.h"

namespace attn {
std::vector<Stage> fa3_stages();
}
