"""`--attention-backend auto`: each attention module of a video model on the backend measured fastest at the shape it
runs, among those whose output matches an fp32 reference (docs/attention.md).

1. Capture (one untimed, eager run of the pipeline, stopped once every denoiser has made a call): each attention
   module's calls (every module on diffusers' `native` backend meanwhile, read from the arguments diffusers hands
   it); the module keeps its largest call (LTX-2's guidance pair over its single-sample passes).
2. Measure each distinct shape (batch, heads, query and key tokens, head dim, the mask's shape) with the candidates of
   `bench micro attention` (ltxbench.bench.micro_attention: the same inputs, fp32 reference, tolerance and timer):
   torch's SDPA forced to cuDNN, flash or efficient, and FlashAttention-3 where a package of it imports. A candidate
   that refuses the shape (FlashAttention takes no additive mask) or misses the tolerance is out.
3. Set the fastest on each module through diffusers (`_native_cudnn`, `_native_flash`, `_native_efficient`, `_flash_3`);
   a module whose every candidate is out keeps torch's own pick (`native`). The measurements go into the record.

The choice is made before any configuration and is the same for all of them, as any --attention-backend is. It is
measured in bf16, the dtype it accepts, on one GPU. Only the standard library at top level.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ltxbench.bench import micro_attention
from ltxbench.bench.micro_attention import AttentionShape
from ltxbench.inject.attention_backend import AUTO

# a candidate of micro_attention -> the diffusers backend that runs it inside the model
DIFFUSERS_BACKENDS = {"cudnn": "_native_cudnn", "flash": "_native_flash", "efficient": "_native_efficient",
                      "flash_attn_3": "_flash_3"}
TORCH_DEFAULT = "native"  # torch's SDPA picks (diffusers' default), kept where no candidate passes
CAPTURE_STEPS = 2  # the flow-match schedulers fail at one step (diffusers 0.42)
BF16_STEP = 2.0**-8  # the floor of a candidate's relative-error bound


class _Captured(Exception):
    """Raised from a denoiser's forward hook once every denoiser has made a call: the capture run stops there."""


def attention_modules(denoisers) -> list:
    """(name, module) of every attention module diffusers sets a backend on (ModelMixin.set_attention_backend's)."""
    from diffusers.models.attention import AttentionModuleMixin
    from diffusers.models.attention_processor import Attention, MochiAttention

    kinds = (Attention, MochiAttention, AttentionModuleMixin)
    return [(f"{index}.{name}", module) for index, denoiser in enumerate(denoisers)
            for name, module in denoiser.named_modules() if isinstance(module, kinds)]


def dispatched_call(query, key, attn_mask=None) -> tuple[AttentionShape, tuple | None]:
    """(the call's shape, (its mask's shape, whether boolean) or None) of a diffusers backend call on (B, S, H, D)
    tensors; a (B, keys) mask as diffusers' native backend hands it to SDPA, (B, 1, 1, keys)."""
    import torch

    batch, queries, heads, head_dim = query.shape
    shape = AttentionShape(batch, heads, queries, key.shape[1], head_dim, masked=attn_mask is not None)
    if attn_mask is None:
        return shape, None
    mask_shape = tuple(attn_mask.shape)
    if len(mask_shape) == 2 and mask_shape == (batch, key.shape[1]):
        mask_shape = (batch, 1, 1, mask_shape[1])
    return shape, (mask_shape, attn_mask.dtype == torch.bool)


def capture(denoisers, run: Callable[[], object]) -> dict:
    """{module name: (module, shape, mask)} of the largest attention call each attention module made during run()
    (mask: dispatched_call's), every module on diffusers' `native` backend meanwhile, its function wrapped to read
    the calls (backends and function restored after). run() is stopped once each of `denoisers` has returned from a
    call."""
    import functools

    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    modules = attention_modules(denoisers)
    calls: dict = {}
    active: list = []
    pending = {id(d) for d in denoisers}
    native = AttentionBackendName(TORCH_DEFAULT)
    original = _AttentionBackendRegistry._backends[native]

    @functools.wraps(original)  # the same signature: dispatch passes the arguments it names
    def recording(query, key, value, attn_mask=None, **kwargs):
        if active:
            name, module = active[-1]
            shape, mask = dispatched_call(query, key, attn_mask)
            if name not in calls or shape.flops > calls[name][1].flops:
                calls[name] = (module, shape, mask)
        return original(query, key, value, attn_mask=attn_mask, **kwargs)

    def finished(denoiser, _args, _output):
        pending.discard(id(denoiser))
        if not pending:
            raise _Captured

    handles = [d.register_forward_hook(finished) for d in denoisers]
    def leave(_module, _args, _output) -> None:  # None: the module's output stays its own
        active.pop()

    for name, module in modules:
        handles.append(module.register_forward_pre_hook(lambda _m, _a, entry=(name, module): active.append(entry)))
        handles.append(module.register_forward_hook(leave))
    previous = [(m.processor, getattr(m.processor, "_attention_backend", None)) for _, m in modules]
    _AttentionBackendRegistry._backends[native] = recording
    try:
        for _, module in modules:
            module.set_attention_backend(TORCH_DEFAULT)
        run()
    except _Captured:
        pass
    finally:
        _AttentionBackendRegistry._backends[native] = original
        for handle in handles:
            handle.remove()
        for processor, backend in previous:
            processor._attention_backend = backend
        active.clear()
    return calls


def relative_error(out, ref) -> float:
    """||out - ref|| / ||ref|| over the whole output, in fp32."""
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def inputs(shape: AttentionShape, mask: tuple | None, device: str, seed: int = 0) -> dict:
    """micro_attention's bf16 q, k, v of `shape`; a masked shape's mask as the model passed it (its shape, additive or
    boolean), its last quarter of keys masked."""
    import torch

    x = micro_attention.inputs(shape, device, seed)
    if mask is not None:
        mask_shape, boolean = mask
        keep = torch.ones(mask_shape, device=device, dtype=torch.bool)
        keep[..., int(micro_attention.UNMASKED_KEYS * shape.keys):] = False
        x["mask"] = keep if boolean else torch.zeros(mask_shape, device=device, dtype=torch.bfloat16).masked_fill(
            ~keep, torch.finfo(torch.bfloat16).min)
    return x


def measure(shape: AttentionShape, mask: tuple | None, candidates: list[str], time_fn, device: str,
            seed: int = 0) -> dict:
    """{candidate: {"ms", "tflops", "max_abs_err", "relative_error", "passed"} or {"not_applicable": why}}, and under
    "torch" the error of torch's own SDPA pick in bf16: a candidate passes within micro_attention's absolute
    tolerance and at most twice torch's relative error (or one bf16 step, 2^-8, where that is smaller), so that a
    kernel off by 1% is out at every shape."""
    import torch

    x = inputs(shape, mask, device, seed)
    # every head's mask is the same (inputs): the reference, which masks a head at a time, takes the first head's
    ref = micro_attention.reference({**x, "mask": None if mask is None else x["mask"][:, :1]})
    default = torch.nn.functional.scaled_dot_product_attention(x["q"], x["k"], x["v"], attn_mask=x["mask"])
    bound = max(2 * relative_error(default, ref), BF16_STEP)
    out: dict = {"torch": {"relative_error": relative_error(default, ref), "bound": bound}}
    del default
    for candidate in candidates:
        try:
            fn = micro_attention.call(candidate, x)
            try:
                got = fn()
            except RuntimeError as exc:  # torch's SDPA refuses a shape with a RuntimeError (no kernel)
                raise micro_attention.NotApplicable(str(exc).splitlines()[0][:200]) from None
        except micro_attention.NotApplicable as why:
            out[candidate] = {"not_applicable": str(why)}
            continue
        error, relative = (got.float() - ref).abs().max().item(), relative_error(got, ref)
        del got
        median = time_fn(fn)["median"]
        out[candidate] = {"ms": median, "tflops": shape.flops / (median * 1e-3) / 1e12, "max_abs_err": error,
                          "relative_error": relative,
                          "passed": error <= micro_attention.ATOL and relative <= bound}
    del x, ref
    return out


def fastest(measured: dict) -> str | None:
    """The candidate with the lowest median among those that ran and passed, or None."""
    passed = {name: m["ms"] for name, m in measured.items() if name != "torch" and m.get("passed")}
    return min(passed, key=passed.get) if passed else None


def candidates() -> list[str]:
    """torch's three SDPA kernels, and FlashAttention-3 where a package of it imports."""
    from ltxbench.inject.attention_backend import find_flash_attention_3

    return list(micro_attention.SDPA_BACKENDS) + (["flash_attn_3"] if find_flash_attention_3()[0] else [])


def choose(denoisers, run: Callable[[], object], log=print, time_fn=None, device: str = "cuda", names=None):
    """capture(), measure() each distinct shape, set the fastest on each module: an AttentionChoice (revertible)
    whose info lists every shape with its modules, candidates and choice. `names`: the candidates (default
    candidates()); `time_fn`: stats of a no-argument call (default: do_bench, L2 flushed, as bench micro)."""
    from ltxbench.inject.attention_backend import AttentionChoice, find_flash_attention_3, hand_to_diffusers

    if time_fn is None:
        from ltxbench.bench.timing import time_cuda

        time_fn = time_cuda
    names = list(names) if names is not None else candidates()
    start = time.perf_counter()
    log(f"attention auto: capturing each attention's shape (untimed, up to {CAPTURE_STEPS} steps)")
    calls = capture(denoisers, run)
    groups: dict = {}
    for name, (module, shape, mask) in calls.items():
        groups.setdefault((shape, mask), []).append((name, module))
    shapes, chosen = [], []
    for (shape, mask), members in groups.items():
        log(f"attention auto: measuring {'x'.join(map(str, shape.as_list()))}{' masked' if mask else ''} "
            f"({len(members)} modules) with {', '.join(names)}")
        measured = measure(shape, mask, names, time_fn, device)
        best = fastest(measured)
        backend = DIFFUSERS_BACKENDS[best] if best else TORCH_DEFAULT
        shapes.append({"shape": shape.as_list(), "mask": None if mask is None else
                       {"shape": list(mask[0]), "boolean": mask[1]}, "modules": len(members),
                       "first_module": members[0][0], "candidates": measured, "chosen": best or TORCH_DEFAULT,
                       "backend": backend})
        chosen += [(module, backend) for _, module in members]
    if any(backend == DIFFUSERS_BACKENDS["flash_attn_3"] for _, backend in chosen):
        hand_to_diffusers(find_flash_attention_3()[0])
    previous = [(m.processor, getattr(m.processor, "_attention_backend", None)) for m, _ in chosen]
    choice = AttentionChoice({"name": AUTO, "measured_in": "bf16", "search_s": round(time.perf_counter() - start, 2),
                              "shapes": shapes, "uncaptured_modules": len(attention_modules(denoisers)) - len(chosen)},
                             previous)
    try:
        for module, backend in chosen:
            module.set_attention_backend(backend)
    except BaseException:
        choice.revert()
        raise
    return choice
