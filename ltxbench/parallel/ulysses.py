"""Ulysses attention for our processors: diffusers' exchange, with fewer copies and collectives.

diffusers' Ulysses attention (TemplatedUlyssesAttention) sends q, k and v in three all-to-alls, each with a layout
copy before it (and one after it when the batch is above 1), and the output in a fourth with a copy on either side:
at batch 1, five copies of a (tokens × width) tensor and four collectives per attention. Profiled on 2 GPUs these
copies cost more GPU time than the all-to-alls themselves; on 4 H100s under CUDA graphs this exchange makes LTX-2B's
`cfg+ulysses` step 3% faster (docs/parallel.md#measured).

Here, for a batch-1 self-attention with every rank holding an equal share of the tokens (what the `ulysses`,
`cfg+ulysses` and `hybrid` splits give our processors), q, k and v go in one all-to-all, packed per token
(rank, token, q|k|v, head, dim): the received buffer, ranks in token order, is then the (token, q|k|v, head, dim)
layout of a fused q/k/v projection, which attention reads in place. LTX-Video's processor has its q/k norm + RoPE
kernel write that buffer (ops.qk_rms_norm_rope_pack), so the packing costs no pass of its own; other callers pack
here. The output needs no copy before its all-to-all (its rows are already grouped by the rank that owns them) and
one after. Same group, same mesh, same collective (torch's functional all-to-all on diffusers' Ulysses group), so
the same values reach the same attention: exact.
Between GPUs that map each other's memory the exchange skips NCCL: each rank pushes its blocks into its peers'
buffers (symmetric.py, the same values in the same order).
Anything else (ring, uneven token counts, masks, a batch above 1, queries and keys of different lengths) goes
through diffusers.
"""

from __future__ import annotations

import torch


def applies(query, key, mask, parallel_config) -> bool:
    """Can `attention` stand for diffusers' Ulysses attention on these inputs ((B, S, heads, dim) each)?"""
    if parallel_config is None or mask is not None:
        return False
    config = parallel_config.context_parallel_config
    if config is None or config.ring_degree != 1 or config.ulysses_degree < 2 or config.ulysses_anything:
        return False
    return (query.shape == key.shape and query.shape[0] == 1 and query.shape[2] % config.ulysses_degree == 0)


def degree(parallel_config) -> int:
    """Ranks of the Ulysses group (call only where `applies`)."""
    return parallel_config.context_parallel_config.ulysses_degree


def attention(query, key, value, backend, parallel_config):
    """Attention over all ranks' tokens for this rank's (1, S_local, heads, dim) q/k/v, returned as (1, S_local,
    heads, dim) like dispatch_attention_fn with the parallel config. Call only where `applies`."""
    ranks = degree(parallel_config)
    _, local_tokens, heads, dim = query.shape
    heads_here = heads // ranks
    packed = torch.empty((ranks, local_tokens, 3, heads_here, dim), dtype=query.dtype, device=query.device)
    for index, tensor in enumerate((query, key, value)):  # to each rank its heads of every local token
        packed[:, :, index] = tensor[0].unflatten(1, (ranks, heads_here)).transpose(0, 1)
    return exchanged_attention(packed, backend, parallel_config)


def rope_attention(ops, q, k, v, wq, wk, eps: float, rope: dict, split: bool, heads: int, backend, parallel_config):
    """Attention for a self-attention whose q/k norm + RoPE kernel writes q, k and v packed (ops.qk_rms_norm_rope_pack,
    or ops.qk_rms_norm_rope_split_pack with split): q, k, v (1, S_local, heads · dim), rope the kernel's table or
    coordinate arguments; returns (1, S_local, heads, dim). Through symmetric memory, with our CUDA kernels, the
    kernel writes each rank's heads straight into that rank's buffer (symmetric.py); else it writes the send buffer
    that exchanged_attention sends. Call only where `applies`."""
    from ltxbench import ops as cuda_ops
    from ltxbench.parallel import symmetric

    group = _group(parallel_config)
    if ops is cuda_ops and symmetric.usable(group):
        return torch.ops.ltxbench_parallel.ulysses_rope_attention(
            q, k, v, wq, wk, eps, rope.get("cos"), rope.get("sin"), rope.get("grid"), rope.get("freqs"), split, heads,
            group.group_name, _backend_name(backend))
    ranks = degree(parallel_config)
    pack = ops.qk_rms_norm_rope_split_pack if split else ops.qk_rms_norm_rope_pack
    packed = pack(q, k, v, wq, wk, eps, **rope, parts=ranks)
    return exchanged_attention(packed.view(ranks, q.size(1), 3, heads // ranks, -1), backend, parallel_config)


def exchanged_attention(packed, backend, parallel_config):
    """`attention` from its send buffer (ranks, S_local, 3, heads / ranks, dim): what `attention` packs, or what
    ops.qk_rms_norm_rope_pack writes in the kernel that normalizes and rotates q and k (LTX-Video's processor)."""
    from ltxbench.parallel import symmetric

    group = _group(parallel_config)
    if symmetric.usable(group):  # pushed into the peers' memory instead of NCCL's all-to-all (symmetric.py)
        return torch.ops.ltxbench_parallel.ulysses_attention(packed, group.group_name, _backend_name(backend))
    ranks, local_tokens, _, heads_here, dim = packed.shape
    received = exchange(packed, group).view(1, ranks * local_tokens, 3, heads_here, dim)
    out = symmetric.attend_received(received, backend)
    # (1, all tokens, heads_here, dim): rank r's rows are a contiguous block, sent back as they are
    back = exchange(out.reshape(ranks, local_tokens, heads_here, dim), group)
    return back.transpose(0, 1).reshape(1, local_tokens, ranks * heads_here, dim)


def _group(parallel_config):
    """The process group of the Ulysses exchange (call only where `applies`)."""
    return parallel_config.context_parallel_config._ulysses_mesh.get_group()


def _backend_name(backend) -> str:
    """diffusers' attention backend (an enum member, its name, or None) as the symmetric ops take it: a name or ""."""
    return getattr(backend, "value", backend) or ""


def exchange(tensor, group):
    """torch's functional all-to-all over `group` along dim 0 (equal chunks), waited for."""
    from torch.distributed import _functional_collectives as funcol

    shape = tensor.shape
    out = funcol.all_to_all_single(tensor.contiguous().flatten(), None, None, group)
    return funcol.wait_tensor(out).view(shape)
