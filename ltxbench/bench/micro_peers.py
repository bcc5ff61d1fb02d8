"""The peer libraries' providers of `bench micro`: what a user would pick instead of our kernel, run on the case's
inputs with whatever setup the library expects done once outside the timed call (as its users do it).

- `liger`: Liger-Kernel's RMSNorm and fused add + RMSNorm.
- `fa3`: FlashAttention-3's decode over a key/value cache (`flash_attn_with_kvcache`, the split-KV path serving
  engines run on Hopper), for `decode_attention`: the cache read in its own (B, H_kv, L, hd) layout through strides,
  the query heads of a group packed as FlashAttention-3 packs grouped-query attention, the mask given as it takes one,
  a length per batch element, and its scheduler metadata computed once per case (a serving engine computes it once
  per step). A mask that is not a prefix of kept keys per batch element has no FlashAttention-3 form: n/a.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from ltxbench.ops.registry import KernelSpec


class Unavailable(Exception):
    """This provider cannot run this case (not installed, no equivalent op, unsupported variant)."""


def liger(spec: KernelSpec, inputs: dict) -> Callable[[], object]:
    try:
        from liger_kernel.transformers import functional as lf
    except ImportError as exc:
        raise Unavailable(f"liger_kernel is not importable ({exc})") from None
    # Liger's casting modes: "llama" rounds the normalized row before the weight (cast_before_weight),
    # "gemma" computes everything in fp32 and rounds once (torch.nn.RMSNorm order); offset 0.
    mode = "llama" if inputs.get("cast_before_weight") else "gemma"
    if spec.name == "rms_norm":
        x, w, eps = inputs["x"], inputs["weight"], inputs["eps"]
        if w is None:
            raise Unavailable("Liger's RMSNorm needs a weight (try --variant weight)")
        return lambda: lf.liger_rms_norm(x, w, eps, 0.0, mode, True)
    if spec.name == "fused_add_rms_norm" and hasattr(lf, "liger_fused_add_rms_norm"):
        x, r, w, eps = inputs["x"], inputs["residual"], inputs["weight"], inputs["eps"]
        return lambda: lf.liger_fused_add_rms_norm(x, r, w, eps, 0.0, mode, True)
    raise Unavailable(f"Liger has no {spec.name} equivalent")


def kept_lengths(mask, batch: int, length: int):
    """The number of keys each batch element keeps, (B,) int32, where `mask` (B|1, 1, 1, L) keeps a prefix of the
    keys (bool true, or an additive 0 where the rest is -inf or the dtype's lowest value); all L without a mask;
    Unavailable for any other mask (a bias, holes)."""
    import torch

    if mask is None:
        return torch.full((batch,), length, dtype=torch.int32, device="cpu")
    if mask.dtype == torch.bool:
        keep = mask
    else:
        dropped = (mask == -torch.inf) | (mask == torch.finfo(mask.dtype).min)
        if not bool(((mask == 0) | dropped).all()):
            raise Unavailable("FlashAttention-3's cache path takes a length per sequence, not a bias per key")
        keep = ~dropped
    keep = keep.reshape(keep.shape[0], length).expand(batch, length)
    counts = keep.sum(dim=-1)
    prefix = torch.arange(length, device=keep.device)[None, :] < counts[:, None]
    if not bool((keep == prefix).all()):
        raise Unavailable("FlashAttention-3's cache path takes a length per sequence: this mask has holes")
    return counts.to(torch.int32)


def flash_attention_3(spec: KernelSpec, inputs: dict) -> Callable[[], object]:
    if not applies("fa3", spec):
        raise Unavailable(f"FlashAttention-3 has no {spec.name} equivalent here")
    from ltxbench.errors import UsageError
    from ltxbench.inject.attention_backend import find_flash_attention_3
    from ltxbench.ops.registry import DTYPES

    found, reasons = find_flash_attention_3()
    if found is None:
        raise Unavailable(f"FlashAttention-3 is not importable ({'; '.join(reasons)})")
    q, k, v, scale = inputs["q"], inputs["k"], inputs["v"], inputs["scale"]
    try:  # the package's own dtype check (fa3-fwd: no fp16 kernels), as --attention-backend fa3 makes it
        found.require_dtype(next((name for name, dtype in DTYPES.items() if dtype == q.dtype), str(q.dtype)))
    except UsageError as exc:
        raise Unavailable(str(exc)) from None
    module = importlib.import_module(found.module)
    b, heads, groups, hd = q.shape
    length = k.shape[2]
    lengths = kept_lengths(inputs["mask"], b, length).to(q.device)
    # (B, 1, H_kv * G, hd): query head h * G + g reads key/value head h, FlashAttention-3's grouped-query mapping
    packed = q.reshape(b, 1, heads * groups, hd)
    k_cache, v_cache = k.transpose(1, 2), v.transpose(1, 2)  # (B, L, H_kv, hd) views of the cache
    metadata = None
    if hasattr(module, "get_scheduler_metadata"):
        metadata = module.get_scheduler_metadata(b, 1, length, heads * groups, heads, hd, lengths, qkv_dtype=q.dtype)

    def run():
        out = module.flash_attn_with_kvcache(packed, k_cache, v_cache, cache_seqlens=lengths, softmax_scale=scale,
                                             scheduler_metadata=metadata)
        return out.view(b, heads, groups, hd)

    return run


PEERS = {"liger": liger, "fa3": flash_attention_3}  # provider name -> its factory, in the table's column order
# the kernels a peer is asked for: FlashAttention-3 for decode_attention only; Liger for each (n/a where it has none)
COVERS = {"fa3": ("decode_attention",)}


def applies(peer: str, spec: KernelSpec) -> bool:
    return peer in PEERS and spec.name in COVERS.get(peer, (spec.name,))
