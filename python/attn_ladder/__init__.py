"""The attention ladder from PyTorch.

    import torch, attn_ladder
    q = torch.randn(1, 16, 4096, 128, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    o = attn_ladder.attention(q, k, v, rung="06d_fa3", causal=True)   # the torch operator
    o, lse = attn_ladder.run("05_fa2_reordered", q, k, v, return_lse=True)  # the plain call
    print(attn_ladder.rungs())

attention() is the operator attn_ladder::attention (torch.compile and CUDA graphs take it);
run() calls the library directly. Both enqueue on the current stream and never synchronize.
"""

from ._capi import AttnLadderError, backward_head_dims, descale_blocks, library_path, rung_info, rungs, run
from .ops import attention, decode_paged, has_backward

__all__ = ["AttnLadderError", "attention", "backward_head_dims", "decode_paged", "descale_blocks", "has_backward",
           "library_path", "rung_info", "rungs", "run"]
