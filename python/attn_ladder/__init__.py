"""The attention ladder from PyTorch.

    import torch, attn_ladder
    q = torch.randn(1, 16, 4096, 128, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    o = attn_ladder.attention(q, k, v, rung="06d_fa3", causal=True)   # the torch operator
    o, lse = attn_ladder.run("05_fa2_reordered", q, k, v, return_lse=True)  # the plain call
    print(attn_ladder.rungs())

attention() is the operator attn_ladder::attention (torch.compile and CUDA graphs take it);
run() calls the library directly. Both enqueue on the current stream and never synchronize.
context_parallel_attention() runs one attention over the ranks of a torch.distributed group,
the sequence sharded (ring attention with the ⊕ merge: context_parallel.py).
"""

from ._capi import AttnLadderError, backward_head_dims, descale_blocks, library_path, rung_info, rungs, run
from .ops import attention, decode_paged, has_backward
from .context_parallel import (LadderBlocks, TorchBlocks, context_parallel_attention, gather_shards, zigzag_gather,
                               zigzag_shard, zigzag_unshard)
from .ring_math import zigzag_chunks

__all__ = ["AttnLadderError", "LadderBlocks", "TorchBlocks", "attention", "backward_head_dims",
           "context_parallel_attention", "decode_paged", "descale_blocks", "gather_shards", "has_backward",
           "library_path", "rung_info", "rungs", "run", "zigzag_chunks", "zigzag_gather", "zigzag_shard",
           "zigzag_unshard"]
