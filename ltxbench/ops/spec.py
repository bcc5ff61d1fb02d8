"""The KernelSpec type: what one op's spec holds (registry.py, registry_fp8.py list one per op), and the byte count
`bench micro` reads its bandwidth from."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ltxbench.ops.accuracy import TOLERANCES
from ltxbench.ops.shapes import TEST_SHAPES

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def io_bytes(inputs: dict, written: int) -> int:
    """Minimum traffic: every tensor input read once (at its real, un-broadcast size) + `written` bytes."""
    return sum(v.numel() * v.element_size() for v in inputs.values() if isinstance(v, torch.Tensor)) + written


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def projection_bytes(inputs: dict) -> int:
    """A projection's output: x (..., K) @ weight (N, K)ᵀ, (..., N) in x's dtype."""
    return math.prod(inputs["x"].shape[:-1]) * inputs["weight"].shape[0] * inputs["x"].element_size()


@dataclass(frozen=True)
class KernelSpec:
    name: str
    summary: str                       # the formula, as documented to users
    make_inputs: Callable              # (shape, dtype, device, generator, variant) -> kwargs of the op
    variants: tuple[str, ...]
    n_outputs: int
    baselines: dict[str, Callable]     # provider name -> the host library's formula (same kwargs subset)
    kind: str = "reduction"            # tolerance class
    aliases: tuple[str, ...] = ()
    test_shapes: tuple = TEST_SHAPES
    bench_shapes: dict = field(default_factory=dict)
    inject_targets: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ("fp32", "fp16", "bf16")
    # bytes the outputs occupy; default: n_outputs tensors the size of the first input
    written: Callable | None = None
    # variant -> the widest 16-bit row the kernel takes for it (wider ones are refused with an error; float32 rows
    # take the op's general path)
    max_width: dict[str, int] = field(default_factory=dict)
    # the module holding the op's function and, as its `reference` namespace, its twin (default: ltxbench.ops and
    # ltxbench.ops.reference)
    home: str = ""
    # inputs the op writes in place without reading them (a static KV cache, the step's rows of it): not counted as
    # read, left contiguous by the tests' layouts, and compared after the call as further outputs (`outputs`)
    writes: tuple[str, ...] = ()

    def outputs(self, fn: Callable, inputs: dict) -> tuple:
        """fn's outputs on `inputs`, then the inputs it writes in place, on copies of those: no call sees another's
        writes."""
        if self.writes:
            inputs = {**inputs, **{name: inputs[name].clone() for name in self.writes}}
        out = fn(**inputs)
        return (*(out if isinstance(out, tuple) else (out,)), *(inputs[name] for name in self.writes))

    def takes(self, variant: str, shape: tuple, dtype: torch.dtype) -> bool:
        return dtype == torch.float32 or not shape or shape[-1] <= self.max_width.get(variant, shape[-1])

    @property
    def fn(self) -> Callable:
        import ltxbench.ops as ops

        return getattr(importlib.import_module(self.home) if self.home else ops, self.name)

    @property
    def reference(self) -> Callable:
        from ltxbench.ops import reference

        return getattr(importlib.import_module(self.home).reference if self.home else reference, self.name)

    def tolerance(self, dtype: torch.dtype) -> tuple[float, float]:
        return TOLERANCES[self.kind][dtype]

    def bytes_moved(self, inputs: dict) -> int:
        read = {name: value for name, value in inputs.items() if name not in self.writes}
        if self.written is not None:
            return io_bytes(read, self.written(inputs))
        first = next(v for v in inputs.values() if isinstance(v, torch.Tensor))
        return io_bytes(read, self.n_outputs * nbytes(first))
