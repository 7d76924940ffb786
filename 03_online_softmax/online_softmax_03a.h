// 03a: the online-normalizer softmax (Milakov & Gimelshein 2018) as a drop-in for 02's.
#pragma once
#include "common/stage.h"

namespace attn {
Stage online_softmax_03a_stage();
}
