"""Ring attention for our processors: one all-gather of the keys and values, one attention over all of them.

diffusers' ring attention (TemplatedRingAttention) concatenates each rank's keys and values (a copy of both),
all-gathers them, then attends the rank's queries to each rank's block in turn and merges the partial results by
their log-sum-exps in fp32. Here, for a batch-1 self-attention with every rank holding an equal share of the tokens
(what the `ring` and `cfg+ring` splits give our processors), LTX-Video's q/k norm + RoPE kernel writes k and v
together per token (ops.qk_rms_norm_rope_kv): that buffer is the all-gather's input, and the gathered buffer
(rank, token, k|v, head, dim) is read in place as the keys and values of one attention over all tokens. No copy, no
merge; each query row sees the keys one GPU gives it, so the result is one GPU's up to the order of a sum.
Over 2 ranks it moves the bytes of the Ulysses exchange (the other rank's half of q, k, v and of the output) in one
collective instead of two, and the attention output needs no exchange back.
Anything else (uneven token counts, masks, a batch above 1, queries and keys of different lengths) goes through
diffusers.
"""

from __future__ import annotations


def applies(query, key, mask, parallel_config) -> bool:
    """Can `attention` stand for diffusers' ring attention on these inputs ((B, S, heads, dim) each)?"""
    if parallel_config is None or mask is not None:
        return False
    config = parallel_config.context_parallel_config
    if config is None or config.ulysses_degree != 1 or config.ring_degree < 2 or config.ring_anything:
        return False
    return query.shape == key.shape and query.shape[0] == 1


def attention(query, kv, backend, parallel_config):
    """This rank's queries (1, S_local, heads, dim) over every rank's keys and values, from this rank's k|v buffer
    (1, S_local, 2, heads, dim): returned as (1, S_local, heads, dim), like dispatch_attention_fn with the parallel
    config. Call only where `applies`."""
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    group = parallel_config.context_parallel_config._ring_mesh.get_group()
    ranks = parallel_config.context_parallel_config.ring_degree
    _, tokens, _, heads, dim = kv.shape
    key, value = gather(kv, group).view(1, ranks * tokens, 2, heads, dim).unbind(2)
    return dispatch_attention_fn(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, backend=backend,
                                 parallel_config=None)


def gather(tensor, group):
    """torch's functional all-gather over `group` along dim 0, waited for."""
    from torch.distributed import _functional_collectives as funcol

    return funcol.wait_tensor(funcol.all_gather_tensor(tensor.contiguous(), 0, group))
