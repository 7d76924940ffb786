#include "02_safe_softmax/safe_softmax.h"

namespace attn {
std::vector<Stage> safe_softmax_stages() { return {}; }
}
