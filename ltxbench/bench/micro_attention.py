"""`bench micro attention`: scaled-dot-product attention at our models' shapes, per backend (torch's SDPA backends
forced one at a time, FlashAttention 2 / 3 where the pip packages import, and cuDNN's FP8 attention, the one
`--precision fp8-attention` runs without FlashAttention-3): median µs, TFLOP/s and % of the GPU's dense peak
(bf16, or fp8 for the FP8 backend), each output checked against an fp32 reference. Attention is not one of our
ops (no kernel of ours to compare), so it is a named benchmark beside the kernels, with its own shapes. Only the
standard library at top level: the arithmetic is tested on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from ltxbench.bench.flops import attention_flops, peak_tflops


@dataclass(frozen=True)
class AttentionShape:
    """One attention call: (batch, heads, query tokens, key tokens, head dim); masked: an additive text mask."""

    batch: int
    heads: int
    queries: int
    keys: int
    head_dim: int
    masked: bool = False

    @property
    def flops(self) -> int:
        return attention_flops(self.batch, self.heads, self.queries, self.keys, self.head_dim)

    def as_list(self) -> list[int]:
        return [self.batch, self.heads, self.queries, self.keys, self.head_dim]


# At 512x768 with classifier-free guidance (batch 2): LTX-Video 2B 32 heads of 64, 2688 video tokens at 49 frames and
# 8064 at 161 (ops/shapes.LTX_SHAPES), text cross-attention over 128 T5 tokens; LTX-2 19B 32 heads of 128, 6144 video
# tokens at 121 frames, text cross-attention over 1024 Gemma tokens. The text keys carry the prompt's padding mask.
# Wan 2.1 at 81 x 480 x 832 (32760 video tokens), its guidance pair as one batch of 2: 1.3B 12 heads of 128, 14B 40;
# the text cross-attention over UMT5's 512 tokens without a mask (Wan attends the zeroed padding).
SHAPES = {
    "ltx": {"ltx2b-49f-self": AttentionShape(2, 32, 2688, 2688, 64),
            "ltx2b-161f-self": AttentionShape(2, 32, 8064, 8064, 64),
            "ltx2b-161f-text": AttentionShape(2, 32, 8064, 128, 64, masked=True)},
    "ltx2": {"ltx2-19b-video-self": AttentionShape(2, 32, 6144, 6144, 128),
             "ltx2-19b-video-text": AttentionShape(2, 32, 6144, 1024, 128, masked=True)},
    "wan": {"wan2.1-1.3b-81f-self": AttentionShape(2, 12, 32760, 32760, 128),
            "wan2.1-14b-81f-self": AttentionShape(2, 40, 32760, 32760, 128),
            "wan2.1-14b-81f-text": AttentionShape(2, 40, 32760, 512, 128)},
}
SHAPES["all"] = {**SHAPES["ltx"], **SHAPES["ltx2"], **SHAPES["wan"]}
SDPA_BACKENDS = ("flash", "cudnn", "efficient")  # torch.nn.attention.SDPBackend FLASH_ATTENTION, ...
# backend -> the module it imports; flash_attn_3: FlashAttention-3 from a hopper/ build or pip's fa3-fwd, whichever
# imports (ltxbench.inject.attention_backend), what --attention-backend fa3 runs
PACKAGES = {"flash_attn": "flash_attn", "flash_attn_3": "flash_attn_interface or fa3_fwd_interface"}
# The FP8 attentions --precision fp8-attention runs, on inputs quantized before the timed call as it quantizes them:
# cuDNN's (ops.cudnn_fp8_attention; per tensor), also with that quantization of q, k and v (two passes each, from the
# model's bf16 layout) inside it, what it pays where q and k do not come out of our q/k kernel in FP8 (LTX-2); and
# FlashAttention-3's (per batch and head)
FP8_BACKENDS = ("cudnn_fp8", "cudnn_fp8_quantizing", "flash_attn_3_fp8")
BACKENDS = SDPA_BACKENDS + tuple(PACKAGES) + FP8_BACKENDS
ATOL = 2e-2  # bf16 inputs and output (8 bits of mantissa) over softmax-weighted sums of unit-scale values
FP8_ATOL = 6e-2  # e4m3 inputs, probabilities and output (4 bits of mantissa)
UNMASKED_KEYS = 0.75  # the share of text keys the mask keeps (the rest: the prompt's padding)


def parse_shapes(group: str) -> dict:
    from ltxbench.errors import UsageError

    if group not in SHAPES:
        raise UsageError(f"--shapes {group!r}: bench micro attention takes {', '.join(SHAPES)}")
    return SHAPES[group]


def parse_backends(text: str) -> list[str]:
    from ltxbench.errors import UsageError

    names = list(BACKENDS) if text == "all" else [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in BACKENDS]
    if bad or not names:
        raise UsageError(f"--providers {text!r}: bench micro attention takes {', '.join(BACKENDS)} or all")
    return names


def derived_rates(shape: AttentionShape, median_ms: float, gpu: str | None, precision: str = "bf16") -> dict:
    """TFLOP of the call, TFLOP/s at the median and % of the dense peak of `precision` (absent off the peak table)."""
    out = {"tflop": shape.flops / 1e12, "tflops": shape.flops / (median_ms * 1e-3) / 1e12}
    peak = peak_tflops(gpu, precision)
    if peak is not None:
        out["pct_of_peak"] = 100 * out["tflops"] / peak
    return out


def inputs(shape: AttentionShape, device: str, seed: int) -> dict:
    """q, k, v (B, H, S, D) bf16, unit scale; an additive mask (B, 1, Sq, Sk) with a padded tail where masked."""
    import torch

    gen = torch.Generator(device).manual_seed(seed)

    def make(tokens):
        return torch.randn(shape.batch, shape.heads, tokens, shape.head_dim, generator=gen, device=device,
                           dtype=torch.bfloat16)

    out = {"q": make(shape.queries), "k": make(shape.keys), "v": make(shape.keys), "mask": None}
    if shape.masked:
        mask = torch.zeros(shape.batch, 1, shape.queries, shape.keys, device=device, dtype=torch.bfloat16)
        mask[..., int(UNMASKED_KEYS * shape.keys):] = torch.finfo(torch.bfloat16).min
        out["mask"] = mask
    return out


REFERENCE_SCORES = 2**28  # fp32 scores a reference chunk holds at once (1 GiB): Wan 14B's full matrix is 171 GB


def reference(x: dict):
    """The fp32 output (math backend), a batch row, a head and a block of queries at a time: each chunk's score
    matrix at most REFERENCE_SCORES values, so the reference fits beside the inputs at every shape."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    batch, heads, queries, _ = x["q"].shape
    keys = x["k"].shape[2]
    step = max(1, REFERENCE_SCORES // max(keys, 1))
    out = torch.empty(x["q"].shape, dtype=torch.float32, device=x["q"].device)
    with sdpa_kernel(SDPBackend.MATH):
        for b in range(batch):
            mask = None if x["mask"] is None else x["mask"][b:b + 1].float()
            for h in range(heads):
                k, v = (x[n][b:b + 1, h:h + 1].float() for n in "kv")
                for start in range(0, queries, step):
                    q = x["q"][b:b + 1, h:h + 1, start:start + step].float()
                    part = None if mask is None else mask[..., start:start + step, :]
                    out[b:b + 1, h:h + 1, start:start + step] = torch.nn.functional.scaled_dot_product_attention(
                        q, k, v, attn_mask=part)
    return out


def call(backend: str, x: dict):
    """A no-argument call of `backend` on the inputs; raises NotApplicable where the backend cannot run them."""
    import importlib

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if backend in SDPA_BACKENDS:
        which = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                 "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]

        def run():
            with sdpa_kernel(which):
                return torch.nn.functional.scaled_dot_product_attention(x["q"], x["k"], x["v"], attn_mask=x["mask"])
        return run
    if x["mask"] is not None:
        raise NotApplicable(f"{backend} takes no additive mask")
    if backend in FP8_BACKENDS:
        if x["q"].shape[2] != x["k"].shape[2]:  # H200: Wan 14B's text call 2.0x slower than bf16 cuDNN, 0.12 max error
            raise NotApplicable(f"{backend}: --precision fp8-attention runs self-attention only")
        if backend == "flash_attn_3_fp8":
            return _flash_attn_3_fp8(x)
        return _cudnn_fp8(x, quantizing=backend == "cudnn_fp8_quantizing")
    if backend == "flash_attn_3":
        func = _flash_attention_3()
    else:
        try:
            func = importlib.import_module(PACKAGES[backend]).flash_attn_func
        except ImportError as exc:
            raise NotApplicable(f"{PACKAGES[backend]} does not import ({exc.__class__.__name__})") from None
    q, k, v = (x[n].transpose(1, 2).contiguous() for n in "qkv")  # (B, S, H, D)

    def run_package():
        out = func(q, k, v)
        out = out[0] if isinstance(out, tuple) else out  # FlashAttention 3 returns (out, lse) in some versions
        return out.transpose(1, 2)
    return run_package


def _flash_attention_3():
    """FlashAttention-3's flash_attn_func from whichever package imports, else NotApplicable naming both."""
    from ltxbench.inject.attention_backend import find_flash_attention_3

    fa3, reasons = find_flash_attention_3()
    if fa3 is None:
        raise NotApplicable("FlashAttention-3 does not import (" + "; ".join(r.split(" ")[0] for r in reasons) + ")")
    return fa3.flash_attn_func


def _flash_attn_3_fp8(x: dict):
    """FlashAttention-3's FP8 forward as --precision fp8-attention runs it (fp8_attention's backend: per-(batch,
    head) scales, bf16 out), on q, k, v quantized outside the timed call."""
    from ltxbench.inject.fp8_attention import _flash_attention_3 as backend

    return _fp8(x, backend(_flash_attention_3()).run, per_tensor=False)


def _cudnn_fp8(x: dict, quantizing: bool = False):
    """cuDNN's FP8 attention on q, k, v quantized per tensor as --precision fp8-attention quantizes them (outside the
    timed call, or inside it where `quantizing`), its output dequantized to bf16 inside it."""
    try:
        import cudnn  # noqa: F401
    except ImportError as exc:
        raise NotApplicable(f"cudnn does not import ({exc.__class__.__name__})") from None
    from ltxbench.ops import cudnn_fp8_attention as op

    if op.supports(x["q"].shape[-1]) is not None:
        raise NotApplicable(op.supports(x["q"].shape[-1]))
    return _fp8(x, op.cudnn_fp8_attention, per_tensor=True, quantizing=quantizing)


def _fp8(x: dict, run, per_tensor: bool, quantizing: bool = False):
    """A no-argument call of the FP8 attention `run(q8, k8, v8, q_descale, k_descale, v_descale)` -> (B, S, H, D) on
    x's q, k, v taken from the model's layout (B, S, H·D) and quantized as --precision fp8-attention quantizes them
    for that backend (one scale per tensor, or per (batch, head)): before the timed call, or inside it where
    `quantizing`. Returns (B, H, S, D), as the reference."""
    from ltxbench import ops
    from ltxbench.inject.fp8_attention import quantized as quantize

    heads = x["q"].shape[1]
    rows = [x[name].transpose(1, 2).flatten(2).contiguous() for name in "qkv"]  # (B, S, H·D): the model's layout

    def quantized():
        return _ordered([part for t in rows for part in quantize(ops, per_tensor, t, heads)])

    if quantizing:
        return lambda: run(*quantized()).transpose(1, 2)
    ready = quantized()
    return lambda: run(*ready).transpose(1, 2)


def _ordered(quantized: list) -> tuple:
    """(q8, k8, v8, q_descale, k_descale, v_descale) from [q8, q_descale, k8, k_descale, v8, v_descale]."""
    return (*quantized[0::2], *quantized[1::2])


class NotApplicable(Exception):
    """A backend that does not run a shape (refused by torch's dispatcher, a missing package, a mask it lacks)."""


def measure(shapes: dict, backends: list[str], time_fn, device: str = "cuda", seed: int = 0, log=print) -> list[dict]:
    """One record per (shape, backend): timed with time_fn (stats in ms) and checked, or n/a with its reason."""
    import torch

    gpu = torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else None
    records = []
    try:
        for name, shape in shapes.items():
            x = inputs(shape, device, seed)
            ref = reference(x)
            measured = []
            for backend in backends:
                log(f"attention {name}: {backend}")
                try:
                    fn = call(backend, x)
                    try:
                        out = fn()
                    except RuntimeError as exc:  # torch's SDPA refuses a shape with a RuntimeError (no kernel)
                        raise NotApplicable(str(exc).splitlines()[0][:200]) from None
                    error = (out.float() - ref).abs().max().item()
                    stats = time_fn(fn)
                except NotApplicable as why:
                    measured.append(record(name, shape, backend, None, gpu, reason=str(why)))
                    continue
                measured.append(record(name, shape, backend, stats, gpu, error=error))
            del x, ref
            records += measured  # whole shapes only, every backend beside the others
            torch.cuda.empty_cache()
    except KeyboardInterrupt as stop:
        raise Interrupted(records) from stop
    return records


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) during measure: `records` holds the shapes measured before it, every backend of each."""

    def __init__(self, records: list[dict]):
        super().__init__()
        self.records = records


def record(name: str, shape: AttentionShape, backend: str, stats: dict | None, gpu: str | None,
           error: float | None = None, reason: str | None = None) -> dict:
    """A result record (kind micro-attention); stats None: the backend was not applicable (`reason`)."""
    from ltxbench.results.schema import STATS_KEYS, make_record

    params = {"shape_name": name, "shape": shape.as_list(), "masked": shape.masked}
    precision, atol = ("fp8", FP8_ATOL) if backend in FP8_BACKENDS else ("bf16", ATOL)
    if stats is None:
        return make_record("attention", backend, precision, params, "time", "ms", "lower",
                           {k: None for k in STATS_KEYS}, derived={"not_applicable": reason})
    return make_record("attention", backend, precision, params, "time", "ms", "lower", stats,
                       derived=derived_rates(shape, stats["median"], gpu, precision),
                       check={"max_abs_err": error, "atol": atol, "passed": error <= atol})


def render_table(records):
    from rich.table import Table

    table = Table(title="ltxbench bench micro attention (forward; bf16, cudnn_fp8* in e4m3)")
    for col in ("shape", "B×H×Sq×Sk×D", "backend", "µs", "TFLOP/s", "% of peak", "max abs err", "check"):
        table.add_column(col, justify="left" if col in ("shape", "backend", "check") else "right")
    for rec in records:
        derived, check, median = rec["derived"], rec.get("check") or {}, rec["stats"]["median"]
        dims = "×".join(map(str, rec["params"]["shape"])) + (" masked" if rec["params"]["masked"] else "")
        if median is None:
            table.add_row(rec["params"]["shape_name"], dims, rec["provider"], "n/a", "-", "-", "-",
                          derived.get("not_applicable") or "")
            continue
        pct = derived.get("pct_of_peak")
        table.add_row(rec["params"]["shape_name"], dims, rec["provider"], f"{1e3 * median:.1f}",
                      f"{derived['tflops']:.1f}", "-" if pct is None else f"{pct:.1f}",
                      f"{check['max_abs_err']:.3g}", "ok" if check["passed"] else "FAIL")
    return table


def failed(records) -> list[str]:
    return [f"{r['params']['shape_name']} {r['provider']} (max abs err {r['check']['max_abs_err']:.3g} > "
            f"{r['check']['atol']})" for r in records if r.get("check") and not r["check"]["passed"]]
