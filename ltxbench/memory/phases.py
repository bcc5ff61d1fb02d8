"""Components that hold GPU memory only in their phase (a phased MemoryPlan, docs/memory.md): their weights live in
one pinned host slab, copied into one device buffer when their phase begins and dropped when it ends (the slab stays
the master copy: inference does not write weights, so nothing is copied back). Tensors are re-pointed in place (the
same objects; fused sets kept), each region ALIGN-ed as the caching allocator aligns a tensor, so kernels see the
same bytes at the same alignment as in a resident run. A weight edited in place on the device is lost at to_host():
revert() first."""

from __future__ import annotations

import weakref

import torch

from ltxbench.inject import fuse
from ltxbench.memory.stream import ALIGN, _bytes, _host_slab, _point, _spans, _unpin


def tensors_of(module, skip=(), exclude: set | None = None) -> list:
    """`module`'s parameters and buffers (and the concatenations its fused sets read) but those of the modules in
    `skip` and the tensors whose id is in `exclude`; empty ones (FP8 placeholders) left out."""
    skipped = {id(m) for part in skip for m in part.modules()}
    found: dict = {}
    for sub in module.modules():
        if id(sub) in skipped:
            continue
        for t in [*sub._parameters.values(), *sub._buffers.values()]:
            if t is not None and t.numel() and id(t) not in (exclude or ()):
                found[id(t)] = t
                fused = fuse.fused_set(t)
                if fused is not None:
                    found.update({id(x): x for x in (fused.weight, fused.bias) if x is not None})
    return list(found.values())


class Mover:
    """`tensors` moved between a pinned host slab and `device` as a unit: to_device() at their phase's start,
    to_host() at its end; revert() gives each storage back where it was at construction."""

    def __init__(self, tensors, device, pin: bool):
        self.device = torch.device(device)
        self.spans = _spans(tensors) if tensors else []
        self._fused = list({id(s): s for t in tensors if (s := fuse.fused_set(t)) is not None}.values())
        at = 0
        for span in self.spans:
            span.at, at = at, -(-(at + span.nbytes) // ALIGN) * ALIGN
        self.nbytes = at
        self.slab = _host_slab(at, pin)
        self._finalizer = weakref.finalize(self, _unpin, [self.slab]) if pin else None
        for span in self.spans:  # one storage at a time: its old copy freed as the last tensor leaves it
            self.slab[span.at:span.at + span.nbytes].copy_(_bytes(span))
            _point(span, self.slab[span.at:span.at + span.nbytes])
        fuse.relocated(self._fused)
        self.buffer = None

    @property
    def on_device(self) -> bool:
        return self.buffer is not None

    def _point_all(self, region) -> None:
        for span in self.spans:
            _point(span, region[span.at:span.at + span.nbytes])
        fuse.relocated(self._fused)

    def to_device(self) -> None:
        """One copy of the slab into a fresh device buffer, on the current stream (ordered before the phase's work)."""
        if self.buffer is None and self.nbytes:
            self.buffer = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
            self.buffer.copy_(self.slab, non_blocking=True)
            self._point_all(self.buffer)

    def to_host(self) -> None:
        """The tensors back on the slab, the device buffer dropped (freed once the work queued on it is done)."""
        if self.buffer is not None:
            self._point_all(self.slab)
            self.buffer = None

    def revert(self) -> None:
        if self.buffer is not None and self.device.type == "cuda":  # its copy from the slab may still be queued
            torch.cuda.synchronize(self.device)
        for span in self.spans:
            fresh = torch.empty(span.nbytes, dtype=torch.uint8, device=span.device)
            fresh.copy_(self.slab[span.at:span.at + span.nbytes])
            _point(span, fresh)
        fuse.relocated(self._fused)
        self.spans, self.buffer = [], None
        if self._finalizer is not None:
            self._finalizer()
