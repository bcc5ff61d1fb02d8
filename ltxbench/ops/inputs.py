"""Random inputs for each op, as its KernelSpec (registry.py) names them: (shape, dtype, device, generator,
variant) -> the op's keyword arguments, at the scales the models feed them (unit activations, LayerNorm-sized
modulation, nn.Linear's init), so that tests, `bench micro` and the sanitizer run every op on the same data."""

from __future__ import annotations

import torch


def _randn(shape, dtype, device, gen):
    return torch.randn(shape, generator=gen, dtype=torch.float32, device="cpu").to(device=device, dtype=dtype)


def _wan_chunks(b, s, d, device, gen, variant):
    """Wan's float32 modulation over 16-bit rows: the six (B, 1, D) chunks of `table + temb.float()` (B, 6, D), or
    per token (Wan 2.2 5B) the (B, S, D) views of a (B, S, 6, D) sum: strided, never contiguous."""
    if variant == "wan-f32-per-token":
        return [c.squeeze(2) for c in (0.1 * _randn((b, s, 6, d), torch.float32, device, gen)).chunk(6, dim=2)]
    return list((0.1 * _randn((b, 6, d), torch.float32, device, gen)).chunk(6, dim=1))


def _modulation(b, s, d, dtype, device, gen, variant):
    """scale, shift as the model produces them: per batch (B,1,D), per token (B,S,D), LTX's
    strided views from `(table + temb.reshape(B,T,6,D)).unbind(2)`, or Wan's float32 chunks."""
    if variant == "ltx-unbind":
        ada = 0.1 * _randn((b, 1, 6, d), dtype, device, gen)
        return ada[:, :, 1], ada[:, :, 0]
    if variant.startswith("wan-f32"):
        shift, scale = _wan_chunks(b, s, d, device, gen, variant)[:2]
        return scale, shift
    t = s if variant == "per-token" else 1
    return 0.1 * _randn((b, t, d), dtype, device, gen), 0.1 * _randn((b, t, d), dtype, device, gen)


def _gate(b, s, d, dtype, device, gen, variant):
    if variant.startswith("wan-f32"):  # gate_msa: the third chunk, 10 times larger, as a residual gate can be
        return 10 * _wan_chunks(b, s, d, device, gen, variant)[2]
    return _randn((b, s if variant == "per-token" else 1, d), dtype, device, gen)


def _weight(d, dtype, device, gen):
    return 1 + 0.1 * _randn((d,), dtype, device, gen)


def _gemma_weight(d, dtype, device, gen):
    """A Gemma3RMSNorm weight, the model reading 1 + weight: trained ones spread around 0 (and reach a few units)."""
    return 0.5 * _randn((d,), dtype, device, gen)


def inputs_rms_norm(shape, dtype, device, gen, variant):
    """"gemma": Gemma3RMSNorm's (1 + weight) as weight_offset 1 (its eps 1e-6)."""
    b, s, d = shape
    if variant == "gemma":
        return {"x": _randn(shape, dtype, device, gen), "weight": _gemma_weight(d, dtype, device, gen), "eps": 1e-6,
                "weight_offset": 1.0}
    w = None if variant == "no-weight" else _weight(d, dtype, device, gen)
    return {"x": _randn(shape, dtype, device, gen), "weight": w, "eps": 1e-6,
            "cast_before_weight": variant == "weight-llama-cast"}


def inputs_fused_add(shape, dtype, device, gen, variant):
    """"gemma": Gemma 3's sandwich (the attention residual, then pre_feedforward_layernorm's 1 + weight)."""
    b, s, d = shape
    x, residual = _randn(shape, dtype, device, gen), _randn(shape, dtype, device, gen)
    if variant == "gemma":
        return {"x": x, "residual": residual, "weight": _gemma_weight(d, dtype, device, gen), "eps": 1e-6,
                "weight_offset": 1.0}
    return {"x": x, "residual": residual, "weight": _weight(d, dtype, device, gen), "eps": 1e-6,
            "cast_before_weight": variant == "llama-cast"}


def inputs_rms_mod(shape, dtype, device, gen, variant):
    b, s, d = shape
    scale, shift = _modulation(b, s, d, dtype, device, gen, variant)
    weight = _weight(d, dtype, device, gen) if variant == "weight" else None  # per-batch modulation + a weight
    return {"x": _randn(shape, dtype, device, gen), "weight": weight, "scale": scale, "shift": shift, "eps": 1e-6}


def inputs_layer_mod(shape, dtype, device, gen, variant):
    b, s, d = shape
    scale, shift = _modulation(b, s, d, dtype, device, gen, variant)
    # An offset mean checks that the variance is computed around the mean, not from E[x²] - E[x]².
    x = _randn(shape, dtype, device, gen) + 3
    return {"x": x, "scale": scale, "shift": shift, "eps": 1e-6}


def inputs_gated_residual(shape, dtype, device, gen, variant):
    b, s, d = shape
    return {"h": _randn(shape, dtype, device, gen), "a": _randn(shape, dtype, device, gen),
            "gate": _gate(b, s, d, dtype, device, gen, variant)}


def inputs_add_rms_mod(shape, dtype, device, gen, variant):
    b, s, d = shape
    gate = None if variant == "no-gate" else _gate(b, s, d, dtype, device, gen, "per-batch")
    scale, shift = _modulation(b, s, d, dtype, device, gen, "per-batch")
    return {"h": _randn(shape, dtype, device, gen), "a": _randn(shape, dtype, device, gen), "gate": gate,
            "scale": scale, "shift": shift, "eps": 1e-6}


def _ltx_grid(b, s, device, gen):
    """A fractional (t, h, w) grid like the pipeline's (frame index * 8/20 ..., pixel / 2048)."""
    t = torch.randint(0, 21, (b, s, 1), generator=gen) * 0.4
    hw = torch.randint(0, 64, (b, s, 2), generator=gen) * (32 / 2048)
    return torch.cat([t, hw], dim=-1).to(device=device, dtype=torch.float32)


def _ltx_rope_source(b, s, d, device, gen, variant):
    from ltxbench.ops.reference import ltx_cos_sin, ltx_rope_freqs

    grid, freqs = _ltx_grid(b, s, device, gen), ltx_rope_freqs(d, device=device)
    if variant == "coords":
        return {"cos": None, "sin": None, "grid": grid, "freqs": freqs}
    cos, sin = ltx_cos_sin(grid, freqs, d)
    return {"cos": cos, "sin": sin, "grid": None, "freqs": None}


def inputs_rope_3d(shape, dtype, device, gen, variant):
    b, s, d = shape
    return {"q": _randn(shape, dtype, device, gen), "k": _randn(shape, dtype, device, gen),
            **_ltx_rope_source(b, s, d, device, gen, variant)}


def wan_head_dim(d: int) -> int:
    """The head width of the "wan" variant's tables at inner dim d: Wan's 128 where it divides d, else the widest
    even proper divisor of d up to 128 (d itself where there is none), so odd test widths take the pair path."""
    if d % 128 == 0:
        return 128
    return next((p for p in range(min(128, d // 2), 1, -1) if p % 2 == 0 and d % p == 0), d)


def inputs_qk_norm_rope(shape, dtype, device, gen, variant):
    """LTX's tables or coordinates, or ("wan") Wan's tables one head wide, shared by the batch."""
    from ltxbench.ops.reference import wan_cos_sin

    b, s, d = shape
    if variant == "wan":
        cos, sin = wan_cos_sin(s, wan_head_dim(d), device=device)
        angles = {"cos": cos, "sin": sin, "grid": None, "freqs": None}
    else:
        angles = _ltx_rope_source(b, s, d, device, gen, variant)
    return {"q": _randn(shape, dtype, device, gen), "k": _randn(shape, dtype, device, gen),
            "wq": _weight(d, dtype, device, gen), "wk": _weight(d, dtype, device, gen), "eps": 1e-5, **angles}



# qk_rms_norm_rope_pack: the send buffer of LTX-2B's cfg+ulysses split on 4 GPUs (2 parts, q/k/v column slices of the
# fused projection, angles from coordinates), then tables in 1 part and coordinates in 4 (1 where D does not divide).
PACK_VARIANTS = ("qkv-slices", "tables", "coords-4")


# qk_rms_norm_rope_kv: one rank's q/k/v of LTX-2B's cfg+ring split on 4 GPUs (column slices of the fused projection,
# angles from coordinates), then separate tensors with tables.
KV_VARIANTS = ("qkv-slices", "tables")


def inputs_qk_norm_rope_kv(shape, dtype, device, gen, variant):
    b, s, d = shape
    q, k, v = _projections(3, b, s, d, dtype, device, gen, variant)
    return {"q": q, "k": k, "v": v, "wq": _weight(d, dtype, device, gen), "wk": _weight(d, dtype, device, gen),
            "eps": 1e-5, **_ltx_rope_source(b, s, d, device, gen, "tables" if variant == "tables" else "coords")}


def inputs_qk_norm_rope_pack(shape, dtype, device, gen, variant):
    parts = {"qkv-slices": 2, "tables": 1}.get(variant, 4 if shape[2] % 4 == 0 else 1)
    return {**inputs_qk_norm_rope_kv(shape, dtype, device, gen, variant), "parts": parts}


# Tables from a video grid (diffusers' layout, batch B), from an audio time grid shared by the batch (batch 1), and
# the video tables with q/k as column slices of a fused q|k|v projection.
SPLIT_ROPE_VARIANTS = ("video", "audio-shared", "qkv-slices")


def split_rope_heads(d: int) -> int:
    """Heads of the split-RoPE inputs: LTX-2's 32 from D = 2048 up (head dim 64 at 2048, 128 at 4096), heads of 64
    channels below, one head where D is not a multiple of 64 (an odd half at D = 86: the kernels' scalar path)."""
    if d % 64:
        return 1
    return 32 if d >= 2048 else max(1, d // 64)


def _split_rope_tables(b, s, d, device, gen, variant):
    """cos/sin (B|1, H, S, D / 2H) built as LTX-2's split rope builds them (reference.ltx2_split_cos_sin): from a
    video grid (frame seconds / 20, pixel / 2048 midpoints; padded slots at head 0's start), or for "audio-shared"
    from a 1-D time grid, one table broadcast over the batch."""
    from ltxbench.ops.reference import ltx2_split_cos_sin

    if variant == "audio-shared":  # 40 ms latent frames, midpoints in seconds / 20
        grid = (torch.randint(0, 126, (1, s, 1), generator=gen) * 0.04 + 0.02) / 20
    else:
        frames = (torch.randint(0, 16, (b, s, 1), generator=gen) * 8 + 4) / 24 / 20
        grid = torch.cat([frames, (torch.randint(0, 32, (b, s, 2), generator=gen) * 32 + 16) / 2048], dim=-1)
    cos, sin = ltx2_split_cos_sin(grid.float(), d, split_rope_heads(d))
    return {"cos": cos.to(device), "sin": sin.to(device)}


def _projections(n, b, s, d, dtype, device, gen, variant):
    """n (B, S, D) projection outputs; "qkv-slices": column slices of one fused (B, S, 3D) q|k|v output (row
    stride 3D), as a fused projection leaves them."""
    if variant != "qkv-slices":
        return [_randn((b, s, d), dtype, device, gen) for _ in range(n)]
    fused = _randn((b, s, 3 * d), dtype, device, gen)
    return [fused[..., i * d:(i + 1) * d] for i in range(n)]


def inputs_rms_norm_rope_split(shape, dtype, device, gen, variant):
    """x (B, S, D) with LTX-2's q norm weight and split-RoPE tables; "qkv-slices" passes the q slice of a fused
    projection."""
    b, s, d = shape
    (x,) = _projections(1, b, s, d, dtype, device, gen, variant)
    return {"x": x, "weight": _weight(d, dtype, device, gen), "eps": 1e-6,
            **_split_rope_tables(b, s, d, device, gen, variant)}


def inputs_qk_rms_norm_rope_split_pack(shape, dtype, device, gen, variant):
    """qk_rms_norm_rope_split's inputs with v, in the variant's layout, and the parts of the send buffer: 2 for
    "qkv-slices" (LTX-2's video self-attention on 2 GPUs), 1 for "video", 4 for "audio-shared" (1 where the heads do
    not divide)."""
    b, s, d = shape
    q, k, v = _projections(3, b, s, d, dtype, device, gen, variant)
    parts = {"qkv-slices": 2, "video": 1}.get(variant, 4)
    parts = parts if split_rope_heads(d) % parts == 0 else 1
    return {"q": q, "k": k, "v": v, "wq": _weight(d, dtype, device, gen), "wk": _weight(d, dtype, device, gen),
            "eps": 1e-6, **_split_rope_tables(b, s, d, device, gen, variant), "parts": parts}


def inputs_qk_rms_norm_rope_split(shape, dtype, device, gen, variant):
    b, s, d = shape
    q, k = _projections(2, b, s, d, dtype, device, gen, variant)
    return {"q": q, "k": k, "wq": _weight(d, dtype, device, gen), "wk": _weight(d, dtype, device, gen), "eps": 1e-6,
            **_split_rope_tables(b, s, d, device, gen, variant)}


def inputs_rope_1d(shape, dtype, device, gen, variant):
    """(B, S, hidden) → q (B, Hq, S, hd) and GQA k (B, Hq/4, S, hd) as transposed views, like transformers;
    positions offset by 7 as in decode with a KV cache; variant partial-rot rotates half the head dim;
    variant per-token passes one table row per token and no positions (what the LLM injection runs)."""
    b, s, d = shape
    hd = 128 if d % 128 == 0 else (64 if d % 64 == 0 else d)
    hq = d // hd
    hk = max(1, hq // 4) if hq else 0
    rot = hd // 2 if variant == "partial-rot" else hd
    rot -= rot % 2
    offset = 7
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
    angles = torch.arange(s + offset, dtype=torch.float32)[:, None] * inv_freq[None, :]
    positions = (torch.arange(s) + offset).expand(b, s)
    if variant == "per-token":
        angles, positions = angles[positions].reshape(b * s, rot // 2), None
    return {"q": _randn((b, s, hq, hd), dtype, device, gen).transpose(1, 2),
            "k": _randn((b, s, hk, hd), dtype, device, gen).transpose(1, 2),
            "cos": angles.cos().to(device), "sin": angles.sin().to(device),
            "positions": None if positions is None else positions.to(device),
            "interleaved": variant == "interleaved"}


def inputs_gelu(shape, dtype, device, gen, variant):
    return {"x": 2 * _randn(shape, dtype, device, gen)}


def inputs_geglu(shape, dtype, device, gen, variant):
    b, s, d = shape
    return {"x": 2 * _randn((b, s, 2 * d), dtype, device, gen), "gate_half": 0 if variant == "gate-first" else 1,
            "approximate": variant == "tanh"}


def inputs_swiglu(shape, dtype, device, gen, variant):
    b, s, d = shape
    return {"x": 2 * _randn((b, s, 2 * d), dtype, device, gen), "gate_half": 1 if variant == "gate-second" else 0}


# (head_dim, keys, mask, scale) per variant; "ltx" is LTX-2B's attn2: 128 text tokens, 0 / -10000 per key as the
# pipeline builds it from the text mask, repeated over the heads (B, H, 1, L) as diffusers prepares it. Head dims
# other than 64 / 128 run the scalar kernel, whose per-lane register count comes from ceil(hd / 32): 33 (odd, 2
# per lane), 80 (3) and 200 (7) cover its instantiations and an explicit scale.
# Layouts the ops must accept besides contiguous: what the GPU tests and the sanitizer workload feed them.
LAYOUTS = ("row-padded", "transposed", "last-dim-strided", "misaligned")
# The least rank a tensor needs for each layout: row padding needs rows, the transposes swap two leading dims.
_MIN_DIM = {"row-padded": 2, "transposed": 3, "last-dim-strided": 1, "misaligned": 1}


def restride(t, how):
    """t's values in layout `how` (one of LAYOUTS)."""
    if how == "row-padded":  # rows of a wider buffer: row stride > D
        big = torch.empty(*t.shape[:-1], t.shape[-1] + 24, dtype=t.dtype, device=t.device)
        big[..., : t.shape[-1]] = t
        return big[..., : t.shape[-1]]
    if how == "transposed":  # (B, S, D) view of an (S, B, D) buffer; (B, H, S, hd) of (S, H, B, hd)
        dims = (0, 2) if t.dim() == 4 else (0, 1)
        return t.transpose(*dims).contiguous().transpose(*dims)
    if how == "last-dim-strided":  # last dim not contiguous: the op must copy explicitly, not misread
        big = torch.empty(*t.shape[:-1], t.shape[-1] * 2, dtype=t.dtype, device=t.device)
        big[..., ::2] = t
        return big[..., ::2]
    if how == "misaligned":  # data pointer 2 elements past a 16-byte boundary: scalar path
        flat = torch.empty(t.numel() + 2, dtype=t.dtype, device=t.device)
        view = flat[2:].view(t.shape)
        view.copy_(t)
        return view
    raise ValueError(how)


def relayout(inputs: dict, how: str, keep: tuple[str, ...] = ()) -> dict:
    """The same values with every tensor argument of enough rank (weights, tables, grids, positions, masks
    included) but those named in `keep` (a cache the op writes, which must be contiguous) in layout `how`: padded
    rows, swapped leading dims, a strided last dim, or a misaligned start."""
    return {k: restride(v, how) if isinstance(v, torch.Tensor) and v.dim() >= _MIN_DIM[how] and k not in keep else v
            for k, v in inputs.items()}
