"""`--attention-backend` of the video families: which kernel their attentions run, the same for every configuration
of a run (set on the transformer before any of them; our processors keep the backend of the ones they replace), so
that `bench e2e` keeps the kernels' gain apart from the attention's (docs/attention.md).

- `fa3`: FlashAttention-3 (Hopper) on each denoiser's self-attentions through diffusers' `_flash_3` backend, the
  cross-attentions (masked for LTX) on torch's SDPA as before. Two packages hold its kernels, tried in this order:
  a source build of flash-attention's hopper/ tree (`flash_attn_interface`), and pip's `fa3-fwd`
  (`fa3_fwd_interface`: those kernels built for torch's CUDA 13 wheels, forward only, bf16 and FP8, no fp16). Both
  expose `flash_attn_func(q, k, v, ...)` on (B, S, heads, head_dim). diffusers binds `_flash_3` to the source build
  only; with fa3-fwd it is handed that package's `flash_attn_func` (same signature and outputs). Neither package is
  a dependency: a user opts in by installing one. `--precision fp8-attention` uses its FP8 forward
  (ltxbench.inject.fp8_attention).
- `auto`: per attention module, the backend measured fastest at the shape it runs (ltxbench.inject.attention_auto).
- any other name: that diffusers backend on every attention module, as `ModelMixin.set_attention_backend` sets it.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

from ltxbench.errors import EnvironmentProblem, UsageError

FA3 = "fa3"  # --attention-backend's name for FlashAttention-3 on the self-attentions
AUTO = "auto"  # --attention-backend's name for the measured choice per module (ltxbench.inject.attention_auto)
FA3_MODULES = ("flash_attn_interface", "fa3_fwd_interface")  # the source build, then pip's fa3-fwd
NO_FP16 = ("fa3_fwd_interface",)  # built without the fp16 kernels
DIFFUSERS_FA3 = "_flash_3"
# sha256 (first 16 hex digits) of diffusers 0.42.1's `_flash_3` backend function and of the op it calls
# (attention_dispatch._flash_attention_3, _wrapped_flash_attn_3): the call fa3-fwd's flash_attn_func was checked against
DIFFUSERS_FA3_SOURCES = ("a11c16979edfe843", "432b14b27e9c6978")
SELF_ATTENTION_NAMES = ("attn1", "audio_attn1")  # diffusers' self-attentions in LTX-Video, LTX-2 and Wan blocks
FA3_INSTALL_HINT = ("pip install fa3-fwd (FlashAttention-3's forward kernels for torch with CUDA 13, Hopper), or "
                    "build flash-attention's hopper/ tree")


@dataclass(frozen=True)
class FlashAttention3:
    module: str                 # the package it came from (FA3_MODULES)
    flash_attn_func: Callable   # (q, k, v, softmax_scale=None, causal=False, ..., q/k/v_descale=None) on (B, S, H, D)

    @property
    def dtypes(self) -> tuple[str, ...]:
        return ("bf16",) if self.module in NO_FP16 else ("bf16", "fp16")

    def require_dtype(self, dtype: str) -> None:
        """UsageError where this package has no kernels for `dtype` (fa3-fwd: fp16)."""
        if dtype not in self.dtypes:
            raise UsageError(f"{FA3} through {self.module} takes {' or '.join(self.dtypes)}, not --dtype {dtype}")


def find_flash_attention_3() -> tuple[FlashAttention3 | None, list[str]]:
    """The first of FA3_MODULES that imports (None if neither) and why each one tried before it did not: a package
    built for another torch fails to load its extension (an ImportError or an OSError)."""
    reasons = []
    for name in FA3_MODULES:
        try:
            module = importlib.import_module(name)
        except (ImportError, OSError) as exc:
            first_line = str(exc).splitlines()[0][:160] if str(exc) else ""
            reasons.append(f"{name}: {exc.__class__.__name__} {first_line}".rstrip())
            continue
        return FlashAttention3(name, module.flash_attn_func), reasons
    return None, reasons


def flash_attention_3_installed() -> bool:
    """Whether a package of FA3_MODULES is there, without importing it (the results manifest's check)."""
    return any(importlib.util.find_spec(name) is not None for name in FA3_MODULES)


def require_flash_attention_3(what: str, dtype: str | None = None) -> FlashAttention3:
    """find_flash_attention_3()'s, else EnvironmentProblem (exit 4) naming what needs it and how to install it;
    UsageError where the one found has no kernels for `dtype` (fa3-fwd: fp16)."""
    found, reasons = find_flash_attention_3()
    if found is None:
        raise EnvironmentProblem(f"{what} needs FlashAttention-3 ({'; '.join(reasons)})", hint=FA3_INSTALL_HINT)
    if dtype is not None:
        found.require_dtype(dtype)
    return found


def validate(name: str | None, dtype: str, device: str, gpus: int, precision: str, configs=(),
             flag: str | None = None) -> None:
    """Refuse (UsageError naming the flag: --attention-backend's, or `flag`) what cannot run, before anything is
    built: any backend beside FP8 attention, which brings its own kernel; fa3 off a GPU, in fp32, or over several
    GPUs; auto anywhere but in bf16 on one GPU."""
    from ltxbench.configurations import Configuration

    if name is None:
        return
    flag = flag or f"--attention-backend {name}"
    if precision == "fp8-attention" or any(Configuration(c).precision == "fp8-attention" for c in configs or ()):
        raise UsageError(f"{flag} with fp8-attention: FP8 attention runs its own kernel",
                         hint=f"drop --attention-backend {name}, or run --precision fp8")
    if name not in (FA3, AUTO):
        return
    if device != "cuda":
        raise UsageError(f"{flag} runs on a GPU, not --device {device}")
    dtypes = ("bf16",) if name == AUTO else ("bf16", "fp16")  # auto measures the candidates in bf16
    if dtype not in dtypes:
        raise UsageError(f"{flag} takes {' or '.join(dtypes)}, not --dtype {dtype}")
    if gpus > 1:
        raise UsageError(f"{flag} runs on one GPU, not --gpus {gpus}", hint="drop it over several GPUs")


def self_attentions(denoiser) -> list:
    """The denoiser's self-attention modules (named as SELF_ATTENTION_NAMES in its blocks): unmasked calls, where
    nearly all of a video model's attention FLOPs are."""
    from diffusers.models.attention import AttentionModuleMixin

    return [module for name, module in denoiser.named_modules()
            if name.rpartition(".")[2] in SELF_ATTENTION_NAMES and isinstance(module, AttentionModuleMixin)]


def hand_to_diffusers(fa3: FlashAttention3) -> None:
    """diffusers' `_flash_3` backend calls `fa3` (nothing to do where diffusers found the source build itself)."""
    from diffusers.models import attention_dispatch as dispatch

    from ltxbench.inject.patching import source_digest

    if not hasattr(dispatch, "_wrapped_flash_attn_3") or not hasattr(dispatch, "flash_attn_3_func"):
        raise EnvironmentProblem("this diffusers release has no FlashAttention-3 backend to run fa3-fwd through",
                                 hint="use diffusers 0.42, or build flash-attention's hopper/ tree")
    if dispatch.flash_attn_3_func is not None:
        return
    op = dispatch._wrapped_flash_attn_3
    sources = (source_digest(getattr(dispatch, "_flash_attention_3", None)), source_digest(getattr(op, "_init_fn", op)))
    if sources != DIFFUSERS_FA3_SOURCES:
        raise EnvironmentProblem("this diffusers release's FlashAttention-3 backend is not the code fa3-fwd was "
                                 "checked against (diffusers 0.42.1)", hint="use diffusers 0.42.1, or build "
                                 "flash-attention's hopper/ tree (diffusers calls that itself)")
    dispatch.flash_attn_3_func = fa3.flash_attn_func


def use_flash_attention_3(denoisers, dtype: str, fa3: FlashAttention3 | None = None) -> dict:
    """FlashAttention-3 on every self-attention of `denoisers` (diffusers' `_flash_3` set on each module; the other
    attentions keep theirs): what was set, for the run's record."""
    return choose(denoisers, FA3, dtype, fa3).info


class AttentionChoice:
    """An attention backend set on some attention modules: `revert()` gives each module's processor its backend back
    (after reverting the report it wraps, `around`: the configuration's own patch, which copied the backend into the
    processors it installed). The report interface of bench e2e's configurations (as_dict, outcomes, revert)."""

    def __init__(self, info: dict, previous: list):
        self.info, self.previous, self.inner = info, previous, None

    def around(self, inner):
        self.inner = inner
        return self

    def revert(self) -> None:
        if self.inner is not None:
            self.inner.revert()
            self.inner = None
        for processor, backend in reversed(self.previous):
            processor._attention_backend = backend
        self.previous = []

    def as_dict(self) -> dict:
        out = self.inner.as_dict() if self.inner is not None else {"applied": False, "reason": "the unpatched model"}
        return {**out, "attention": self.info}

    def outcomes(self) -> dict:
        read = getattr(self.inner, "outcomes", None)
        return read() if read is not None else {}


def attention_modules(denoisers) -> list:
    """("<denoiser index>.<name>", module) of every attention module of `denoisers` that diffusers sets a backend on
    (ModelMixin.set_attention_backend's kinds)."""
    from diffusers.models.attention import AttentionModuleMixin
    from diffusers.models.attention_processor import Attention, MochiAttention

    kinds = (Attention, MochiAttention, AttentionModuleMixin)
    return [(f"{index}.{name}", module) for index, denoiser in enumerate(denoisers)
            for name, module in denoiser.named_modules() if isinstance(module, kinds)]


def saved_backends(modules) -> list:
    """(processor, its backend) of each module: what AttentionChoice.revert gives back."""
    return [(module.processor, getattr(module.processor, "_attention_backend", None)) for module in modules]


def choose(denoisers, name: str, dtype: str, fa3: FlashAttention3 | None = None) -> AttentionChoice:
    """Attention backend `name` (FA3: FlashAttention-3 on the self-attentions; else a diffusers backend on every
    attention) set on `denoisers`, revertible."""
    if name == FA3:
        fa3 = fa3 or require_flash_attention_3(f"--attention-backend {FA3}")
        fa3.require_dtype(dtype)
        modules = [module for denoiser in denoisers for module in self_attentions(denoiser)]
        if not modules:
            raise UsageError(f"--attention-backend {FA3}: the model has no self-attention module named "
                             f"{' or '.join(SELF_ATTENTION_NAMES)}")
        hand_to_diffusers(fa3)
        backend, info = DIFFUSERS_FA3, {"name": FA3, "package": fa3.module, "self_attentions": len(modules),
                                        "other_attentions": "unchanged (torch's SDPA)"}
        setters = modules  # each self-attention (AttentionModuleMixin.set_attention_backend)
    else:  # through ModelMixin.set_attention_backend: diffusers checks the backend's package and the parallel config
        check_name(name)
        modules = [module for _, module in attention_modules(denoisers)]
        backend, info = name.lower(), {"name": name.lower(), "attentions": "all"}
        setters = denoisers
    choice = AttentionChoice(info, saved_backends(modules))
    try:
        for setter in setters:
            setter.set_attention_backend(backend)
    except (RuntimeError, ImportError) as exc:
        choice.revert()
        raise EnvironmentProblem(f"attention backend {name!r} is not usable here: {exc}") from exc
    return choice


def check_name(name: str) -> None:
    """UsageError unless `name` is fa3, auto or one of diffusers' attention backends (imports diffusers' dispatch)."""
    if name in (FA3, AUTO):
        return
    from diffusers.models.attention_dispatch import AttentionBackendName

    names = sorted(b.value for b in AttentionBackendName)
    if name.lower() not in names:
        raise UsageError(f"--attention-backend {name!r} is neither {FA3}, {AUTO} nor a diffusers backend",
                         hint=f"one of {FA3}, {AUTO}, {', '.join(names)}")


def apply(denoisers, name: str, dtype: str) -> dict:
    """--attention-backend `name` on `denoisers` for the whole run: what was set."""
    return choose(denoisers, name, dtype).info
