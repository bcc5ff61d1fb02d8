"""The attention rule of llm/__init__.py: q/k/v as one GEMM and transformers' apply_rotary_pos_emb through
ops.rope_1d, in the attention forward of llama/mistral/qwen2/qwen3 (transformers 5.x); llm/__init__.py's docstring
says how the RoPE tables come from the model's own cos/sin."""

from __future__ import annotations

import functools
import inspect

import torch

from ltxbench.inject import forward_source
from ltxbench.inject.fuse import follow_moves, fuse_linears, fused_linear, release

RULE_ROPE = "attention: one q/k/v GEMM + rope_1d"
QKV_ATTR = "_ltxbench_qkv"  # FusedWeights: [q | k | v], q/k/v projection weights (and biases) are views of it

# Source fragments of the transformers 5.x forwards reproduced here (a tuple: one of them): a release that rewrites
# them is skipped. The KV cache argument is `past_key_values` in transformers 5.17 and `cache` in 5.24, whose update
# also takes the forward's kwargs; the patched forwards accept either name.
CACHE_UPDATE = "past_key_values.update(key_states, value_states, self.layer_idx)"
CACHE_UPDATE_KWARGS = "cache.update(key_states, value_states, self.layer_idx, kwargs=kwargs)"
ATTN_SOURCE = ("query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)",
               (CACHE_UPDATE, CACHE_UPDATE_KWARGS),
               "ALL_ATTENTION_FUNCTIONS.get_interface", "scaling=self.scaling", "self.o_proj(attn_output)")


DECODE_ROWS = 4  # rows (tokens over the batch) ops.linear computes with its GEMV kernel (cuda/gemv.cu)


def decode_rows(x) -> bool:
    """x (..., K) has at most DECODE_ROWS rows: a decode step's, which ops.linear's GEMV kernel takes."""
    return x.numel() <= DECODE_ROWS * x.shape[-1]


def projection_linear(ops, tuned_gemm: bool):
    """linear(x, weight, bias) for the rules' projections: ops.linear where x has a decode step's rows (decode_rows:
    the bandwidth-bound GEMV kernel) and, with `tuned_gemm`, for a prompt's rows too (cuBLASLt with the algorithm
    per shape chosen by timing, as the LTX rules' projections run); torch's F.linear otherwise (prefill without
    tuned_gemm: cuBLAS, as transformers runs it), and wherever a gradient is wanted, autocast is on or x is not in
    the weight's dtype (ops.linear has no backward and no autocast rule: it would compute in the inputs' dtype)."""
    import torch.nn.functional as F

    def linear(x, weight, bias=None):
        if ((tuned_gemm or decode_rows(x)) and x.dtype == weight.dtype and not torch.is_autocast_enabled(x.device.type)
                and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))):
            return ops.linear(x, weight, bias)
        return F.linear(x, weight, bias)

    return linear


def linear_forward(linear):
    """nn.Linear.forward through `linear` (projection_linear): an o_proj / down_proj / lm_head patched so that a
    decode step's rows run the GEMV kernel (called as a module still: its hooks run, a wrapper put in its place runs
    instead)."""

    def forward(self, input):
        return linear(input, self.weight, self.bias)

    return forward


# The static cache layer's update and the cache's dispatch to it (transformers 5.x) that rope_1d_cache stands for:
# rows cumulative_length + s of the preallocated keys/values written with index_copy_, the length then advanced.
STATIC_UPDATE = ("cache_position = torch.arange(kv_length, device=self.device) + self.cumulative_length",
                 "self.cumulative_length.add_(kv_length)", "self.keys.index_copy_(2, cache_position, key_states)",
                 "self.values.index_copy_(2, cache_position, value_states)", "return self.keys, self.values")
CACHE_DISPATCH = ("keys, values = self.layers[layer_idx].update(key_states, value_states, *args, **kwargs)",)


@functools.cache
def static_layer_classes():
    """(Cache, StaticLayer) of transformers where StaticLayer.update and Cache.update are the code rope_1d_cache
    stands for, else None (another release: the cache's own update runs). Read at injection, not in a traced call."""
    try:
        from transformers.cache_utils import Cache, StaticLayer
    except ImportError:
        return None
    sources = (inspect.getsource(StaticLayer.update), inspect.getsource(Cache.update))
    ok = all(f in sources[0] for f in STATIC_UPDATE) and all(f in sources[1] for f in CACHE_DISPATCH)
    return (Cache, StaticLayer) if ok else None


def static_layer(classes, cache, layer_idx: int, key_states, value_states):
    """The cache's layer `layer_idx` where a decode step may write it with rope_1d_cache: a StaticLayer (exactly:
    not a sliding one), already allocated, of the key's batch, heads, head dim and dtype, in a cache that neither
    offloads nor overrides Cache.update; else None. `classes`: static_layer_classes()."""
    if value_states.shape != key_states.shape:
        return None
    return static_layer_for(classes, cache, layer_idx, *key_states.shape[:2], key_states.shape[3], key_states.dtype)


def static_layer_for(classes, cache, layer_idx: int, batch: int, heads: int, head_dim: int, dtype):
    """static_layer for keys and values of that batch, heads, head dim and dtype."""
    layers = getattr(cache, "layers", None)
    if classes is None or layers is None or layer_idx >= len(layers) or getattr(cache, "offloading", True):
        return None
    base, cls = classes
    if type(cache).update is not base.update:
        return None
    layer = layers[layer_idx]
    if type(layer) is not cls or not layer.is_initialized:
        return None
    keys = layer.keys
    if (keys.dtype != dtype or keys.shape[0] != batch or keys.shape[1] != heads or keys.shape[3] != head_dim
            or layer.values.shape != keys.shape):
        return None
    return layer


def _tables_of(cos, sin):
    """transformers' per-token cos/sin (B|1, S, hd) as rope_1d's per-token tables (rows, hd/2): no positions."""
    half = cos.shape[-1] // 2
    rows, seq = cos.shape[0], cos.shape[1]
    table = [t[..., :half].to(torch.float32).reshape(rows * seq, half).contiguous() for t in (cos, sin)]
    return (*table, None)


MAX_TABLE_PAIRS = 4  # a forward passes one (cos, sin) pair per layer type: Gemma 3's two at most


def _rope_tables(cache: dict, cos, sin, first_layer: bool):
    """(cos (B*S, hd/2) fp32, sin, no positions) from the model's position_embeddings, once per forward
    in eager mode: built when the first layer of a forward or a layer with other cos/sin objects asks (Gemma 3
    passes one pair per layer type: each pair is kept), reused by the others, and dropped by the first layer of the
    next forward, so tables never outlive the forward whose cos/sin they came from (an in-place change of those
    between forwards could not be seen: inference tensors have no version counter). Inside a compiled graph there
    is no cache: a Python dict holding tensors made dynamo guard on its contents and recompile, and the graph output
    its tables to store them."""
    if torch.compiler.is_compiling():
        return _tables_of(cos, sin)
    if first_layer:
        cache.clear()
    pairs = cache.setdefault("pairs", [])
    for known_cos, known_sin, tables in pairs:
        if known_cos is cos and known_sin is sin:
            return tables
    if len(pairs) >= MAX_TABLE_PAIRS:  # layer 0 unpatched (wrapped, refused): no forward starts with a clear
        pairs.pop(0)
    pairs.append((cos, sin, _tables_of(cos, sin)))
    return pairs[-1][2]


def sliding_kwarg(cls):
    """How the original forward passes sliding_window to the attention interface: a getter, or None to not pass it."""
    src = forward_source(cls)
    if "sliding_window=self.sliding_window" in src:
        return lambda attn: {"sliding_window": attn.sliding_window}
    if 'sliding_window=getattr(self.config, "sliding_window", None)' in src:
        return lambda attn: {"sliding_window": getattr(attn.config, "sliding_window", None)}
    if "sliding_window" not in src:
        return lambda attn: {}
    return None


def attn_forward(ops, linear, rope_cache: dict, sliding, eager, qk_norm: bool, new_cache_api: bool):
    """XAttention.forward (llama/mistral/qwen2/qwen3, transformers 5.x) with the RoPE through ops.rope_1d.
    `qk_norm` (Qwen3's per-head q/k RMSNorm) is known per class: `hasattr(self, "q_norm")` in the forward made every
    compiled call raise and catch an AttributeError per layer to check its guard. `new_cache_api`: the class takes
    the KV cache as `cache` and passes its kwargs to the cache's update (transformers 5.24). `linear`: the q/k/v
    GEMM's (projection_linear)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from ltxbench.inject.llm import norm_fusion
    from ltxbench.inject.llm.norm_fusion import INPUT_NORM_KWARG, qkv_rope_cache, qkv_with_input_norm

    static_classes = static_layer_classes()
    fold_rope_cache = norm_fusion.rope_cache_enabled()  # read once, as the layer reads LTXBENCH_NORM_GEMV

    def project(self, hidden_states, projections, fused, input_norm):
        """(q, k, v), each (B, heads, S, head_dim), before RoPE: one GEMM where the projections are fused (with the
        input norm folded in where it is ours to apply and qkv_with_input_norm takes it), else the three layers."""
        qkv = None
        if input_norm is not None:  # the norm folded into the q/k/v GEMV, else applied here
            qkv = qkv_with_input_norm(ops, linear, hidden_states, projections, fused, input_norm)
            hidden_states = hidden_states if qkv is not None else input_norm(hidden_states)
        qkv = qkv if qkv is not None else fused_linear(hidden_states, projections, fused, linear)
        if qkv is not None:  # one GEMM; q, k, v are column slices of its output
            query_states, key_states, value_states = qkv.split(qkv_widths(self, qkv.shape[-1]), dim=-1)
        else:
            query_states, key_states, value_states = (p(hidden_states) for p in projections)
        hidden_shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        query_states, key_states = query_states.view(hidden_shape), key_states.view(hidden_shape)
        if qk_norm:  # Qwen3: per-head RMSNorm before RoPE
            query_states, key_states = self.q_norm(query_states), self.k_norm(key_states)
        value_states = value_states.view(hidden_shape)
        return query_states.transpose(1, 2), key_states.transpose(1, 2), value_states.transpose(1, 2)

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
        input_norm = kwargs.pop(INPUT_NORM_KWARG, None)  # the layer's input_layernorm, left to us (norm_fusion.py)
        written = kwargs.pop(WRITTEN_KWARG, None)  # the model's list: lengths advanced at its forward's end
        kv_cache = kwargs.pop("past_key_values", None)  # 5.17's name; 5.24 still takes it (deprecated)
        if new_cache_api:  # `cache` wins when both are given, as in transformers' renaming decorator
            by_new_name = kwargs.pop("cache", None)
            kv_cache = kv_cache if by_new_name is None else by_new_name
        input_shape = hidden_states.shape[:-1]
        projections, fused = (self.q_proj, self.k_proj, self.v_proj), vars(self).get(QKV_ATTR)
        cos_table, sin_table, positions = _rope_tables(rope_cache, *position_embeddings, self.layer_idx == 0)
        layer = query_states = None
        if (input_norm is not None and fused is not None and not qk_norm and kv_cache is not None
                and fold_rope_cache):
            kv_heads = qkv_widths(self, fused.weight.shape[0])[1] // self.head_dim
            layer = static_layer_for(static_classes, kv_cache, self.layer_idx, hidden_states.shape[0], kv_heads,
                                     self.head_dim, hidden_states.dtype)
            # a decode step's input norm, q/k/v, RoPE and static cache writes as one op (None: not taken here)
            query_states = qkv_rope_cache(ops, hidden_states, projections, fused, input_norm, layer, cos_table,
                                          sin_table)
        if query_states is None:
            query_states, key_states, value_states = project(self, hidden_states, projections, fused, input_norm)
            layer = None if kv_cache is None else static_layer(static_classes, kv_cache, self.layer_idx, key_states,
                                                                 value_states)
            if layer is not None:  # one kernel: the rotation and the static cache's writes
                query_states = ops.rope_1d_cache(query_states, key_states, value_states, cos_table, sin_table,
                                                 layer.keys, layer.values, layer.cumulative_length)
            else:
                query_states, key_states = ops.rope_1d(query_states, key_states, cos_table, sin_table, positions)
                if kv_cache is not None and new_cache_api:
                    key_states, value_states = kv_cache.update(key_states, value_states, self.layer_idx,
                                                               kwargs=kwargs)
                elif kv_cache is not None:
                    key_states, value_states = kv_cache.update(key_states, value_states, self.layer_idx)
        if layer is not None:  # a static cache layer written by either op: its length advanced, then read whole
            advance(layer, hidden_states.shape[-2], written)
            key_states, value_states = layer.keys, layer.values
        attn_output, attn_weights = decode_attention(ops, self, query_states, key_states, value_states,
                                                     attention_mask, kwargs), None
        if attn_output is None:
            attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager)
            attn_output, attn_weights = attention_interface(
                self, query_states, key_states, value_states, attention_mask,
                dropout=0.0 if not self.training else self.attention_dropout, scaling=self.scaling,
                **sliding(self), **kwargs)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output), attn_weights

    return forward



WRITTEN_KWARG = "ltxbench_written_cache_layers"  # the forward's list of static cache layers to advance at its end
RULE_LENGTHS = "static cache lengths: advanced once per forward, all layers in one op"


def advance(layer, rows: int, written: list | None) -> None:
    """Advance the static cache layer's length by `rows`: now, or at the end of the model's forward where the model
    handed its layers a list (WRITTEN_KWARG: advance_lengths_once). Nothing reads a layer's length between its own
    write and the next forward (the mask and positions are made before the layers), so the rows written are the same."""
    if written is None:
        layer.cumulative_length.add_(rows)
    else:
        written.append((layer.cumulative_length, rows))


def advance_lengths_once(report, base) -> None:
    """The decoder `base` hands its layers a list (WRITTEN_KWARG) and, once they ran, advances the static cache
    lengths they wrote with one torch._foreach_add_ instead of one add_ per layer (a kernel each in the compiled decode
    step). A layer that does not take the list (another forward, a layer refused) advances its own length as before."""
    def hand_out(module, args, kwargs):
        return args, {**kwargs, WRITTEN_KWARG: []}

    def advance_written(module, args, kwargs, output):
        written = kwargs.get(WRITTEN_KWARG) or []
        for rows in sorted({rows for _, rows in written}):
            torch._foreach_add_([length for length, r in written if r == rows], rows)

    handles = (base.register_forward_pre_hook(hand_out, with_kwargs=True),
               base.register_forward_hook(advance_written, with_kwargs=True))
    report.patched(RULE_LENGTHS, lambda: [h.remove() for h in handles])


def decode_attention(ops, attn, query, key, value, mask, kwargs: dict):
    """A decode step's attention as ops.decode_attention: the query heads packed onto their key/value head (B, H, 1,
    hd) -> (B, H_kv, groups, hd), so that the cache is read as stored, its keys split over the GPU's SMs; or None: run
    the model's attention interface. transformers' SDPA attention packs the heads so in eager decode but, under
    torch.compile (generate()'s compiled decode step), with a mask (a static cache always has one) copies every key
    and value `groups` times first (repeat_kv): the whole cache, every layer, every token; and SDPA's kernels give a
    batch-1 step one block per key/value head. The same products and softmax per head (the probabilities kept in fp32
    for the sum over values); only with the `sdpa` implementation, one query token, a mask per key shared by the
    heads, no softcap or position bias (which that interface refuses or adds)."""
    groups = getattr(attn, "num_key_value_groups", 1)
    if (attn.config._attn_implementation != "sdpa" or not isinstance(groups, int) or groups < 1 or attn.training
            or query.shape[-2] != 1 or not torch.is_tensor(mask) or mask.dim() != 4 or mask.shape[1] != 1
            or mask.shape[2] != 1 or mask.shape[-1] != key.shape[-2] or mask.shape[0] not in (1, query.shape[0])
            or any(kwargs.get(k) is not None for k in ("softcap", "position_bias")) or kwargs.get("output_attentions")):
        return None
    batch, heads, _, head_dim = query.shape
    packed = query.reshape(batch, heads // groups, groups, head_dim)
    out = ops.decode_attention(packed, key, value, mask, attn.scaling)
    return out.reshape(out.shape[0], heads, 1, value.shape[-1]).transpose(1, 2).contiguous()


def qkv_widths(attn, width: int) -> list[int]:
    """[q, k, v] widths of a fused projection `width` wide, from head_dim and num_key_value_groups, which a compiled
    graph guards on anyway (q is `groups` times as wide as k and v): reading each projection's out_features cost
    three more guards per layer, checked on every call. fuse_qkv fuses only projections of these widths."""
    groups, head_dim = attn.num_key_value_groups, attn.head_dim
    kv = width // (head_dim * (groups + 2)) * head_dim
    return [kv * groups, kv, kv]


def fuse_qkv(report, attn, index: int) -> None:
    """Give the patched attention one [q | k | v] weight (the projections become views of it); when the
    projections cannot be fused the forward keeps the three GEMMs, and the report says why."""
    widths = [p.out_features for p in (attn.q_proj, attn.k_proj, attn.v_proj)]
    if not (isinstance(getattr(attn, "num_key_value_groups", None), int) and isinstance(attn.head_dim, int)
            and qkv_widths(attn, sum(widths)) == widths):
        report.skip(RULE_ROPE, f"layers.{index}: q/k/v kept as three GEMMs: widths {widths} are not heads x head_dim "
                               "with num_key_value_groups query heads per key/value head")
        return
    fused = fuse_linears((attn.q_proj, attn.k_proj, attn.v_proj))
    if isinstance(fused, str):
        report.skip(RULE_ROPE, f"layers.{index}: q/k/v kept as three GEMMs: {fused}")
        return
    setattr(attn, QKV_ATTR, fused)
    report.on_revert(lambda: release(vars(attn).pop(QKV_ATTR)))
    follow_moves(report, attn, fused)  # concatenated again where .to() moves or casts the model, as gate/up
