"""The one place our attention processors reach the parallel exchanges: which strategy runs an attention call.

Two tables, each tried in order; the first strategy whose `applies` accepts the call runs it:

- PLAIN (`attend`): q, k, v as attention takes them, (B, S, heads, dim). Our Ulysses exchange (ulysses.py: one
  all-to-all for q, k and v), else diffusers' dispatch_attention_fn, which runs the processor's backend and its own
  context parallelism (Ulysses or ring) where the parallel config asks for one, and one GPU's attention where not.
- FUSED (`rope_attention`): q, k, v projections (1, S, heads · dim) whose q/k RMSNorm + RoPE kernel also writes the
  exchange's send buffer: the Ulysses all-to-all's (ulysses.rope_attention), or the k|v buffer of our ring attention's
  all-gather (ring.py). None when none applies: the caller normalizes and rotates q and k itself and calls `attend`.

A strategy is a name, `applies(...)` (it reads only shapes, the mask, the parallel config and the RoPE form) and its
call. The processors choose nothing themselves and name neither ulysses.py nor ring.py: a new strategy is one entry
here, where it is to be tried (docs/architecture.md#checklist-add-a-parallel-strategy).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from ltxbench.parallel import context, ring, ulysses


class Strategy(NamedTuple):
    name: str
    applies: Callable[..., bool]
    call: Callable


# --- PLAIN: applies(query, key, mask, parallel_config); call(query, key, value, mask, backend, parallel_config) ---

def _diffusers(query, key, value, mask, backend, parallel_config):
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    return dispatch_attention_fn(query, key, value, attn_mask=mask, dropout_p=0.0, is_causal=False, backend=backend,
                                 parallel_config=parallel_config)


def _ulysses_applies(query, key, mask, parallel_config) -> bool:
    return ulysses.applies(query, key, mask, parallel_config)


def _ulysses(query, key, value, mask, backend, parallel_config):
    return ulysses.attention(query, key, value, backend, parallel_config)


PLAIN = (
    Strategy("ulysses", _ulysses_applies, _ulysses),
    Strategy("diffusers", lambda query, key, mask, parallel_config: True, _diffusers),  # last: takes every call
)


def plain_strategy(query, key, mask, parallel_config) -> Strategy:
    """The PLAIN strategy that runs this call."""
    for strategy in PLAIN:  # loops, not generators: dynamo traces these in the compiled step
        if strategy.applies(query, key, mask, parallel_config):
            return strategy
    raise AssertionError("PLAIN's last strategy takes every call")


def attend(query, key, value, mask, backend, parallel_config):
    """Attention of q, k, v (B, S, heads, dim), mask additive or None, as dispatch_attention_fn with the processor's
    `backend` and `parallel_config` computes it (over every rank's tokens under context parallelism): (B, S, heads,
    dim)."""
    strategy = plain_strategy(query, key, mask, parallel_config)
    return strategy.call(query, key, value, mask, backend, parallel_config)


# --- FUSED: applies(query, key, mask, parallel_config, split), q and k as (1, S, heads, dim) views;
#     call(ops, query, key, value, wq, wk, eps, rope, split, heads, processor), the projections (1, S, heads · dim) ---

def _ulysses_rope(ops, query, key, value, wq, wk, eps, rope, split, heads, processor):
    return ulysses.rope_attention(ops, query, key, value, wq, wk, eps, rope, split, heads,
                                  getattr(processor, "_attention_backend", None), processor._parallel_config)


def _ring_rope(ops, query, key, value, wq, wk, eps, rope, split, heads, processor):
    query, kv = ops.qk_rms_norm_rope_kv(query, key, value, wq, wk, eps, **rope)  # kv: the all-gather's send buffer
    return ring.attention(query.unflatten(2, (heads, -1)), kv.unflatten(3, (heads, -1)),
                          context.chosen_backend(processor), processor._parallel_config)


def _ulysses_rope_applies(query, key, mask, parallel_config, split: bool) -> bool:
    return ulysses.applies(query, key, mask, parallel_config)


def _ring_rope_applies(query, key, mask, parallel_config, split: bool) -> bool:
    return not split and ring.applies(query, key, mask, parallel_config)  # the k|v kernel: interleaved RoPE only


FUSED = (
    Strategy("ulysses", _ulysses_rope_applies, _ulysses_rope),
    Strategy("ring", _ring_rope_applies, _ring_rope),
)
FUSED_NAMES = tuple(s.name for s in FUSED)


def fused_strategy(query, key, mask, parallel_config, split: bool, skip=()) -> Strategy | None:
    """The FUSED strategy that runs this call (q, k (1, S, heads, dim)), None where none applies; `skip` names
    strategies the caller leaves to `attend`."""
    for name in skip:
        if name not in FUSED_NAMES:
            raise ValueError(f"skip: {name!r} is not a fused strategy (one of {', '.join(FUSED_NAMES)})")
    for strategy in FUSED:
        if strategy.name not in skip and strategy.applies(query, key, mask, parallel_config, split):
            return strategy
    return None


def rope_attention(ops, query, key, value, wq, wk, eps: float, rope: dict, split: bool, heads: int, processor,
                   mask=None, skip=()):
    """Self-attention of the projections q, k, v (1, S_local, heads · dim) with q and k normalized (RMSNorm across
    heads, weights wq, wk, one eps) and rotated (rope: the kernel's cos/sin tables or grid/freqs; split: LTX-2's split
    RoPE, else interleaved) by the kernel that writes the exchange's send buffer: (1, S_local, heads, dim), or None
    where no FUSED strategy applies (then normalize, rotate and `attend`). processor: the holder of
    `_attention_backend` and `_parallel_config`."""
    parallel_config = getattr(processor, "_parallel_config", None)
    strategy = fused_strategy(query.unflatten(2, (heads, -1)), key.unflatten(2, (heads, -1)), mask, parallel_config,
                              split, skip)
    if strategy is None:
        return None
    return strategy.call(ops, query, key, value, wq, wk, eps, rope, split, heads, processor)
