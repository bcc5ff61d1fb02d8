"""`bench micro`: every kernel against the host libraries' formulas, shape by shape (docs/measuring.md).

The pieces are separable so that the CPU tests reach all but the timing: `plan` (which kernel, shape,
dtype and providers; pure), `run_cases` (inputs once per case, providers interleaved per shape, checked
against the fp32 reference, then timed); micro_report turns the timings into records (GB/s, % of the copy
peak, speedups; pure) and renders them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ltxbench.bench.micro_peers import PEERS, Unavailable, applies
from ltxbench.errors import UsageError
from ltxbench.ops.accuracy import fp8_mismatch, fp8_pairs
from ltxbench.ops.registry import DTYPES, SPECS, KernelSpec, get_spec
from ltxbench.ops.shapes import (
    DECODE_ATTENTION_SHAPES,
    LLM_DECODE_LINEAR_SHAPES,
    LLM_MLP_SHAPES,
    LLM_SHAPES,
    LTX2_CROSS_SHAPES,
    LTX2_FFN_SHAPES,
    LTX2_SELF_SHAPES,
    LTX2_STREAM_SHAPES,
    LTX_FFN_SHAPES,
    LTX_LINEAR_SHAPES,
    LTX_SHAPES,
    SEED_SHAPES,
    WAN_SHAPES,
)
from ltxbench.results.schema import STATS_KEYS

DTYPE_NAMES = ("bf16", "fp16", "fp32")
TIMERS = ("do_bench", "cudagraph")
# Odd widths (not a multiple of any vector width) to show the scalar path; not part of `all`.
ODD_SHAPES = {"odd-2x1024x5125": (2, 1024, 5125), "odd-4x997x769": (4, 997, 769)}
SHAPE_GROUPS = {"seed": SEED_SHAPES, "ltx": {**LTX_SHAPES, **LTX_FFN_SHAPES, **LTX_LINEAR_SHAPES},
                "ltx2": {**LTX2_STREAM_SHAPES, **LTX2_SELF_SHAPES, **LTX2_CROSS_SHAPES, **LTX2_FFN_SHAPES},
                "llm": {**LLM_SHAPES, **LLM_MLP_SHAPES, **LLM_DECODE_LINEAR_SHAPES, **DECODE_ATTENTION_SHAPES},
                "wan": WAN_SHAPES,
                "odd": ODD_SHAPES, "all": None}
NA_STATS = {k: (0 if k == "n" else math.nan) for k in STATS_KEYS}


def known_providers() -> tuple[str, ...]:
    """cuda, eager, every other baseline of any spec, compile, the peer libraries: the order of the table's columns."""
    extra = sorted({b for s in SPECS.values() for b in s.baselines} - {"eager"})
    return ("cuda", "eager", *extra, "compile", *PEERS)


def parse_choices(value: str, allowed, option: str) -> list[str]:
    """`a,b` → [a, b] (order kept, duplicates dropped); `all` → every allowed value; unknown → UsageError."""
    items = [v.strip() for v in str(value).split(",") if v.strip()]
    if not items:
        raise UsageError(f"{option} is empty; choose from {', '.join(allowed)}")
    if "all" in items:
        return list(allowed)
    for item in items:
        if item not in allowed:
            raise UsageError(f"{option}: unknown value {item!r}; choose from {', '.join(allowed)} (or all)")
    return list(dict.fromkeys(items))


def resolve_kernels(names) -> list[KernelSpec]:
    """Kernel names as users type them (names or aliases); none or `all` → every kernel."""
    names = [n for n in (names or []) if n]
    if not names or "all" in names:
        return list(SPECS.values())
    specs = []
    for name in names:
        try:
            spec = get_spec(name)
        except KeyError as exc:
            raise UsageError(exc.args[0], hint="`ltxbench kernels` lists the kernels and their aliases") from None
        if spec not in specs:
            specs.append(spec)
    return specs


@dataclass(frozen=True)
class Case:
    """One (kernel, shape, dtype): inputs are made once and every provider runs on them."""

    kernel: str
    shape_name: str
    shape: tuple[int, int, int]
    dtype: str
    variant: str
    providers: tuple[str, ...]


@dataclass
class Measurement:
    """A provider's result on a case: stats (ms) when it ran, else the reason it is n/a."""

    stats: dict | None = None
    check: dict | None = None
    reason: str | None = None


def shapes_for(spec: KernelSpec, group: str) -> dict:
    if group == "odd":
        return dict(ODD_SHAPES)
    if group == "all":
        return dict(spec.bench_shapes)
    return {name: shape for name, shape in spec.bench_shapes.items() if name in SHAPE_GROUPS[group]}


def providers_for(spec: KernelSpec, requested) -> tuple[str, ...]:
    """The requested providers that apply: cuda and compile always, a peer library where it covers the kernel
    (Liger's may turn out n/a), a library baseline only where the spec has it."""
    return tuple(p for p in requested if p in ("cuda", "compile") or applies(p, spec) or p in spec.baselines)


def plan(specs, dtypes, shape_group: str, providers, variant: str | None = None) -> tuple[list[Case], list[str]]:
    """Cases ordered kernel → dtype → shape, plus notes on what was skipped and why."""
    if variant is not None and not any(variant in s.variants for s in specs):
        raise UsageError(f"--variant {variant!r} is not a variant of any selected kernel",
                         hint="`ltxbench kernels` lists each kernel's variants")
    cases, notes = [], []
    for spec in specs:
        if variant is not None and variant not in spec.variants:
            notes.append(f"{spec.name}: no variant {variant!r} (has {', '.join(spec.variants)}); skipped")
            continue
        shapes = shapes_for(spec, shape_group)
        if not shapes:
            notes.append(f"{spec.name}: no --shapes {shape_group} shapes; skipped")
            continue
        provs = providers_for(spec, providers)
        if not provs:
            notes.append(f"{spec.name}: none of the --providers {', '.join(providers)} applies; skipped")
            continue
        for dtype in dtypes:
            if dtype not in spec.dtypes:
                notes.append(f"{spec.name}: no --dtype {dtype} kernel; skipped")
                continue
            cases += [Case(spec.name, name, tuple(shape), dtype, variant or spec.variants[0], provs)
                      for name, shape in shapes.items()]
    return cases, notes


# --- providers ---------------------------------------------------------------------------------------

def make_provider(name: str, spec: KernelSpec, inputs: dict) -> Callable[[], object]:
    """A no-argument callable running provider `name` on `inputs`, or Unavailable."""
    if name == "cuda":
        fn = spec.fn
        return lambda: fn(**inputs)
    if name in spec.baselines:
        base = spec.baselines[name]
        return lambda: base(**inputs)
    if name == "compile":
        import torch

        if "eager" not in spec.baselines:
            raise Unavailable(f"{spec.name} has no eager formula to compile")
        torch._dynamo.reset()  # one fresh compilation per case: never hit the recompile limit
        compiled = torch.compile(spec.baselines["eager"], dynamic=False)
        return lambda: compiled(**inputs)
    if name in PEERS:
        return PEERS[name](spec, inputs)
    raise Unavailable(f"no {name} provider for {spec.name}")


def check_outputs(out, ref, atol: float, rtol: float, fp8_contract: bool = True) -> dict:
    """Max abs error over all outputs and pass/fail of |out - ref| <= atol + rtol*|ref| (NaN fails); an FP8 output
    and its scale are judged together by accuracy.fp8_mismatch (its error: that of the dequantized values): by the
    kernels' contract, or (fp8_contract False) within (atol, rtol) and one e4m3 step."""
    outs = tuple(out) if isinstance(out, tuple | list) else (out,)
    refs = tuple(ref) if isinstance(ref, tuple | list) else (ref,)
    if len(outs) != len(refs):
        return {"max_abs_err": None, "atol": atol, "rtol": rtol, "passed": False,
                "reason": f"{len(outs)} outputs, expected {len(refs)}"}
    worst, passed, why = 0.0, True, None
    for o, r in fp8_pairs(outs, refs):
        if isinstance(r, tuple):
            err, fp8_why = fp8_mismatch(*o, *r, None if fp8_contract else (atol, rtol))
            worst = err if math.isnan(err) or math.isnan(worst) else max(worst, err)
            passed, why = passed and fp8_why is None, why or fp8_why
            continue
        if tuple(o.shape) != tuple(r.shape):
            return {"max_abs_err": None, "atol": atol, "rtol": rtol, "passed": False,
                    "reason": f"shape {tuple(o.shape)}, expected {tuple(r.shape)}"}
        o, r = o.float(), r.float()
        diff = (o - r).abs()
        err = diff.max().item() if diff.numel() else 0.0
        worst = err if math.isnan(err) or math.isnan(worst) else max(worst, err)
        passed = passed and bool((diff <= atol + rtol * r.abs()).all().item())
    result = {"max_abs_err": worst, "atol": atol, "rtol": rtol, "passed": passed}
    return {**result, "reason": why} if why else result


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


def measure(name: str, spec: KernelSpec, inputs: dict, ref, tol, time_fn, sync) -> Measurement:
    m = Measurement()
    try:
        fn = make_provider(name, spec, inputs)
        # The FP8 ops' baselines round y to the model dtype before quantizing (the unfused path): only the kernel is
        # held to the fused contract.
        out = fn()  # also compiles/warms, untimed; then the inputs it wrote in place (as run_cases gave them)
        out = (*(out if isinstance(out, tuple) else (out,)), *(inputs[n] for n in spec.writes)) if spec.writes else out
        m.check = check_outputs(out, ref, *tol, fp8_contract=name == "cuda")
        sync()
        m.stats = time_fn(fn)
    except Unavailable as exc:
        m.reason = str(exc)
    except Exception as exc:  # noqa: BLE001 - a provider that cannot run is n/a, never the end of the run
        m.reason = _short(exc)
    return m


SAME_SIZE_COPY = "copy"  # results key: a device copy moving the case's bytes (half read, half written)


def _same_size_copy(nbytes: int, device: str, time_fn) -> Measurement:
    """The copy of the case's bytes, timed like the providers: how close to the memory limit a kernel of that
    size can get (small and mid-size copies run below the large-copy peak: ramp-up, tail, L2 write-back)."""
    from ltxbench.bench.timing import device_copy

    m = Measurement()
    try:
        m.stats = time_fn(device_copy(max(nbytes // 2, 1), device))
    except Exception as exc:  # noqa: BLE001 - a reference that cannot run is left out, never the end of the run
        m.reason = _short(exc)
    return m


def run_cases(cases, *, timer: str = "do_bench", seed: int = 0, device: str = "cuda", time_fn=None,
              log: Callable[[str], None] | None = None) -> tuple[dict, dict]:
    """Measure every case: {(case, provider): Measurement}, with (case, SAME_SIZE_COPY) for the copy of the
    case's bytes, and {case: bytes moved}."""
    import torch

    if time_fn is None:
        from ltxbench.bench.timing import time_cuda

        def time_fn(fn):
            return time_cuda(fn, timer=timer)

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    results, nbytes = {}, {}
    with torch.no_grad():
        try:
            for case in cases:
                if log:
                    log(f"{case.kernel} {case.shape_name} {case.dtype}")
                spec = get_spec(case.kernel)
                dtype = DTYPES[case.dtype]
                gen = torch.Generator(device="cpu").manual_seed(seed)  # same inputs for every provider
                inputs = spec.make_inputs(case.shape, dtype, device, gen, case.variant)
                moved = spec.bytes_moved(inputs)
                ref = spec.outputs(spec.reference, inputs)
                written = {n: inputs[n].clone() for n in spec.writes}  # a KV cache: as made, for each provider
                measured = {}
                for name in case.providers:
                    for n, made in written.items():
                        inputs[n].copy_(made)
                    measured[(case, name)] = measure(name, spec, inputs, ref, spec.tolerance(dtype), time_fn, sync)
                del inputs, ref, written
                if moved:
                    measured[(case, SAME_SIZE_COPY)] = _same_size_copy(moved, device, time_fn)
                results.update(measured)  # whole cases only: a case cut short would compare providers unevenly
                nbytes[case] = moved
        except KeyboardInterrupt as stop:
            raise Interrupted(results, nbytes) from stop
    return results, nbytes


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) during run_cases: `results` and `nbytes` hold the cases measured before it, whole."""

    def __init__(self, results: dict, nbytes: dict):
        super().__init__()
        self.results, self.nbytes = results, nbytes
