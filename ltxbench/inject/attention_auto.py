"""`--attention-backend auto`: each attention module of a video model on the backend measured fastest at the shape it
runs, among those whose output matches an fp32 reference (docs/attention.md).

1. Capture (one untimed, eager run of the pipeline, stopped once every denoiser has made a call): each attention
   module's calls (every module on diffusers' `native` backend meanwhile, read from the arguments diffusers hands
   it); the module keeps its largest call (LTX-2's guidance pair over its single-sample passes).
2. Measure each distinct shape (batch, heads, query and key tokens, head dim, the mask as the module passes it) on
   bf16 inputs in the model's layout, calling each candidate as the model calls it, through diffusers' dispatch:
   `native` (torch's own pick), `_native_cudnn`, `_native_flash`, `_native_efficient`, and `_flash_3` where a
   FlashAttention-3 package imports. A candidate that refuses the shape (takes no mask, no kernel) or misses the
   fp32 reference (micro_attention's absolute tolerance, and twice the relative error of torch's pick) is out.
3. Set the fastest on the modules of that shape; `native` where nothing else passes. The measurements go into the
   record.

With --attention-backend auto the choice is made before any configuration and is the same for all of them; with
<config>@auto, as that configuration starts, on the unpatched model. It is measured in bf16, the dtype it accepts, on
one GPU. Only the standard library at top level.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ltxbench.bench import micro_attention
from ltxbench.bench.micro_attention import AttentionShape
from ltxbench.inject.attention_backend import (
    AUTO,
    DIFFUSERS_FA3,
    AttentionChoice,
    attention_modules,
    find_flash_attention_3,
    hand_to_diffusers,
    saved_backends,
)

TORCH_DEFAULT = "native"  # diffusers' default: torch's SDPA picks the kernel; kept where no other candidate passes
SDPA_FORCED = ("_native_cudnn", "_native_flash", "_native_efficient")  # diffusers' backends forcing one SDPA kernel
CAPTURE_STEPS = 2  # the flow-match schedulers fail at one step (diffusers 0.42)
BF16_STEP = 2.0**-8  # the floor of a candidate's relative-error bound


class _Captured(Exception):
    """Raised from a denoiser's forward hook once every denoiser has made a call: the capture run stops there."""


def dispatched_call(query, key, attn_mask=None) -> tuple[AttentionShape, tuple | None]:
    """(the call's shape, (its mask's shape, whether boolean) or None) of a diffusers backend call on (B, S, H, D)
    tensors."""
    import torch

    batch, queries, heads, head_dim = query.shape
    shape = AttentionShape(batch, heads, queries, key.shape[1], head_dim, masked=attn_mask is not None)
    return shape, None if attn_mask is None else (tuple(attn_mask.shape), attn_mask.dtype == torch.bool)


def capture(denoisers, run: Callable[[], object], modules: list | None = None) -> dict:
    """{module name: (module, shape, mask)} of the largest attention call each attention module made during run()
    (mask: dispatched_call's), every module on diffusers' `native` backend meanwhile, its function wrapped to read
    the calls (backends and function restored after). run() is stopped once each of `denoisers` has returned from a
    call. `modules`: attention_modules(denoisers), where the caller has listed them already."""
    import functools

    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    modules = attention_modules(denoisers) if modules is None else modules
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

    def leave(_module, _args, _output) -> None:  # None: the module's output stays its own
        active.pop()

    handles = [d.register_forward_hook(finished) for d in denoisers]
    for name, module in modules:
        handles.append(module.register_forward_pre_hook(lambda _m, _a, entry=(name, module): active.append(entry)))
        handles.append(module.register_forward_hook(leave))
    previous = AttentionChoice({}, saved_backends([m for _, m in modules]))
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
        previous.revert()
        active.clear()
    return calls


def relative_error(out, ref) -> float:
    """||out - ref|| / ||ref|| over the whole output, in fp32."""
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def inputs(shape: AttentionShape, mask: tuple | None, device: str, seed: int = 0) -> dict:
    """micro_attention's bf16 q, k, v of `shape` (B, H, S, D), and "model": the same q, k, v in the layout diffusers
    hands a backend (B, S, H, D) with the mask as the module passed it (its shape, additive or boolean); "mask": that
    mask additive as (B, 1, 1, keys) for the reference. The last quarter of the keys is masked, the same for every
    row."""
    import torch

    x = micro_attention.inputs(shape, device, seed)
    model = {name: x[name].transpose(1, 2).contiguous() for name in "qkv"}
    model["mask"] = None
    if mask is not None:
        mask_shape, boolean = mask
        kept = int(micro_attention.UNMASKED_KEYS * shape.keys)

        def made(size, as_bool):
            keep = torch.ones(size, device=device, dtype=torch.bool)
            keep[..., kept:] = False
            return keep if as_bool else torch.zeros(size, device=device, dtype=torch.bfloat16).masked_fill(
                ~keep, torch.finfo(torch.bfloat16).min)

        # the reference's additive: it adds the mask in fp32
        model["mask"], x["mask"] = made(mask_shape, boolean), made((shape.batch, 1, 1, shape.keys), False)
    x["model"] = model
    return x


def call(backend: str, x: dict):
    """`backend` as the model runs it on x's inputs (diffusers' dispatch_attention_fn; its `backend` keyword names
    it), or NotApplicable: a backend that takes no mask where the call has one (diffusers would drop the mask
    silently), FlashAttention-3 where no package of it imports or this diffusers cannot take it."""
    import functools

    from diffusers.models.attention_dispatch import (
        AttentionBackendName,
        _AttentionBackendRegistry,
        dispatch_attention_fn,
    )

    name = AttentionBackendName(backend)
    if x["model"]["mask"] is not None and "attn_mask" not in _AttentionBackendRegistry._supported_arg_names[name]:
        raise micro_attention.NotApplicable(f"{backend} takes no attention mask")
    if backend == DIFFUSERS_FA3:
        _hand_flash_attention_3()
    m = x["model"]
    return functools.partial(dispatch_attention_fn, m["q"], m["k"], m["v"], attn_mask=m["mask"], backend=name)


def _hand_flash_attention_3() -> None:
    """diffusers' `_flash_3` bound to the FlashAttention-3 package found (attention_backend.hand_to_diffusers), else
    NotApplicable saying why."""
    from ltxbench.errors import EnvironmentProblem

    fa3, reasons = find_flash_attention_3()
    if fa3 is None:
        raise micro_attention.NotApplicable("no FlashAttention-3 package imports (" + "; ".join(reasons) + ")")
    try:
        hand_to_diffusers(fa3)
    except EnvironmentProblem as why:
        raise micro_attention.NotApplicable(str(why)) from None


def measure(shape: AttentionShape, mask: tuple | None, candidates: list[str], time_fn, device: str,
            seed: int = 0) -> dict:
    """{candidate: {"ms", "tflops", "max_abs_err", "relative_error", "passed"} or {"not_applicable": why}}, and under
    "torch" the relative error of torch's SDPA in bf16 and the bound it sets: a candidate passes within
    micro_attention's absolute tolerance and at most twice that error (or one bf16 step, 2^-8, where that is larger),
    so that a kernel off by 1% is out at every shape."""
    import torch

    x = inputs(shape, mask, device, seed)
    ref = micro_attention.reference(x).transpose(1, 2)  # (B, S, H, D), as the backends return it
    default = torch.nn.functional.scaled_dot_product_attention(x["q"], x["k"], x["v"], attn_mask=x["mask"])
    torch_error = relative_error(default.transpose(1, 2), ref)
    bound = max(2 * torch_error, BF16_STEP)
    out: dict = {"torch": {"relative_error": torch_error, "bound": bound}}
    del default
    for candidate in candidates:
        try:
            fn = call(candidate, x)
            try:
                got = fn()
            except (RuntimeError, ValueError) as exc:  # no kernel for the shape, a constraint of the backend
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


def with_twins(calls: dict, modules: list) -> dict:
    """`calls`, and each module the run did not reach given the call of the module of its name in another denoiser
    (Wan 2.2 A14B's two experts share one architecture; a short run may reach only one of them)."""
    by_name = {name.partition(".")[2]: call for name, call in calls.items()}
    out = dict(calls)
    for name, module in modules:
        twin = by_name.get(name.partition(".")[2])
        if name not in out and twin is not None:
            out[name] = (module, *twin[1:])
    return out


def candidates() -> list[str]:
    """torch's own pick and the three SDPA kernels forced, and FlashAttention-3 where a package of it imports."""
    return [TORCH_DEFAULT, *SDPA_FORCED] + ([DIFFUSERS_FA3] if find_flash_attention_3()[0] is not None else [])


def choose(denoisers, run: Callable[[], object], log=print, time_fn=None, device: str = "cuda", names=None):
    """capture(), measure() each distinct shape, set the fastest on each module: an AttentionChoice (revertible)
    whose info lists every shape with its modules, candidates and choice. `names`: the candidates (default
    candidates()); `time_fn`: stats of a no-argument call (default: do_bench, L2 flushed, as bench micro)."""
    if time_fn is None:
        from ltxbench.bench.timing import time_cuda

        time_fn = time_cuda
    names = list(names) if names is not None else candidates()
    start = time.perf_counter()
    log(f"attention auto: capturing each attention's shape (untimed, up to {CAPTURE_STEPS} steps)")
    modules = attention_modules(denoisers)
    calls = with_twins(capture(denoisers, run, modules), modules)
    groups: dict = {}
    for name, (module, shape, mask) in calls.items():
        groups.setdefault((shape, mask), []).append((name, module))
    shapes, chosen = [], []
    for (shape, mask), members in groups.items():
        log(f"attention auto: measuring {'x'.join(map(str, shape.as_list()))}{' masked' if mask else ''} "
            f"({len(members)} modules) with {', '.join(names)}")
        measured = measure(shape, mask, names, time_fn, device)
        backend = fastest(measured) or TORCH_DEFAULT
        shapes.append({"shape": shape.as_list(), "mask": None if mask is None else
                       {"shape": list(mask[0]), "boolean": mask[1]}, "modules": len(members),
                       "first_module": members[0][0], "candidates": measured, "chosen": backend})
        chosen += [(module, backend) for _, module in members]
    choice = AttentionChoice({"name": AUTO, "measured_in": "bf16", "search_s": round(time.perf_counter() - start, 2),
                              "shapes": shapes, "uncaptured_modules": len(modules) - len(chosen)},
                             saved_backends([m for m, _ in chosen]))
    try:
        for module, backend in chosen:
            module.set_attention_backend(backend)
    except BaseException:
        choice.revert()
        raise
    return choice
