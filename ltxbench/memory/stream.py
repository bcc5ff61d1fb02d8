"""Transformer blocks streamed to the GPU from pinned host memory through a few static slots (--memory-budget;
docs/memory.md).

BlockStreamer(blocks, streamed, slots, device): the blocks not streamed stay on the device (moved there where they are
not). Each streamed block's parameters and buffers are copied into ONE host slab (pinned where the device is CUDA),
laid out by storage: tensors that share a storage (the fused q/k/v views of one concatenation, inject/fuse.py) keep
sharing one region of it, so a fusion stands. `slots` device buffers, each the size of the largest slab; the j-th
streamed block lives in slot j mod slots, so its tensors are re-pointed into that slot once, at install, and a load
is one copy of its slab into the slot.

Loads run on a side stream, ordered by events: a block's compute waits for the copy of its weights (copied[slot]), a
copy into a slot waits for the compute of the block the slot held before (computed[slot]). Once block j has run
(forward hook), its slot takes the next block that lives there, cyclically (the last blocks of a call load the first
ones of the next), so the copy overlaps the blocks in between. A block found not loaded when it runs (the first call,
a call that stopped early or ran blocks out of order) is loaded then: the order of loads is an optimisation, the
occupant check makes every call exact. No host synchronisation, no record_stream: the slots and slabs live as long as
the streamer. On a CPU device the same steps run synchronously.

Tensors whose name ends in one of `keep` (the modulation tables: tiny, and LTX-Video's step set-up reads every block's
before the blocks run) stay on the device. Several blocks share a slot's addresses, so a cache keyed on a weight's
address must key on the module too (inject/ltx2/text_kv.py does; LTX-Video's cross-attention cache, which reads every
block's weights before they run, stands aside while blocks stream: cross_kv.py). A streamed weight edited in place is
overwritten at its next load: revert() first.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch

from ltxbench.inject import PLACES_WEIGHTS, STREAMER_ATTR, fuse

ALIGN = 512  # bytes: each region starts where the caching allocator starts a tensor (kernels see the same alignment)
KEEP = ("scale_shift_table",)
_PORTABLE = 1  # cudaHostRegisterPortable, as torch registers host memory


@dataclass(eq=False)
class _Span:
    """The bytes of one storage that a block's tensors view: tensors[i] starts offsets[i] bytes into the span."""

    tensors: list = field(default_factory=list)
    offsets: list = field(default_factory=list)
    nbytes: int = 0
    device: torch.device | None = None  # where it was at install: revert() puts it back there
    at: int = 0                         # its offset in the block's slab and slot


def _extent(t) -> int:
    """Bytes from t's first element to just past its last."""
    return (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))) * t.element_size()


def _spans(tensors) -> list[_Span]:
    """`tensors` (non-empty) grouped by the storage they view; each group's span: the bytes they cover."""
    groups: dict = {}
    for t in tensors:
        storage = t.untyped_storage()
        start = t.storage_offset() * t.element_size()
        groups.setdefault((storage.device, storage.data_ptr()), []).append((t, start, start + _extent(t)))
    spans = []
    for members in groups.values():
        low = min(start for _, start, _ in members)
        spans.append(_Span([t for t, _, _ in members], [start - low for _, start, _ in members],
                           max(end for _, _, end in members) - low, members[0][0].device))
    return spans


def _bytes(span: _Span):
    """The span's bytes where its tensors are now (a uint8 view)."""
    first = span.tensors[0]
    start = first.storage_offset() * first.element_size() - span.offsets[0]
    whole = torch.empty(0, dtype=torch.uint8, device=first.device).set_(first.untyped_storage())
    return whole[start:start + span.nbytes]


def _point(span: _Span, region) -> None:
    """Re-point the span's tensors (the same objects) into `region` (uint8, span.nbytes), layout kept. Not through
    `.data =`, which would end a fused set (FusedView) or be refused (FP8 placeholders, which are empty and skipped)."""
    for t, offset in zip(span.tensors, span.offsets, strict=True):
        flat = region[offset:offset + _extent(t)].view(t.dtype)
        torch.Tensor.data.__set__(t, flat.as_strided(t.shape, t.stride(), flat.storage_offset()))


def _relocate(span: _Span, device) -> None:
    fresh = torch.empty(span.nbytes, dtype=torch.uint8, device=device)
    fresh.copy_(_bytes(span))
    _point(span, fresh)


def _block_spans(block, keep) -> tuple[list[_Span], list[_Span], list]:
    """(spans to stream, spans kept on the device, the fused sets among its tensors) of one block."""
    named = [*block.named_parameters(), *block.named_buffers()]
    tensors = {id(t): t for _, t in named if t.numel()}  # FP8 placeholders are empty: nothing to move
    fused_sets = {id(s): s for t in tensors.values() if (s := fuse.fused_set(t)) is not None}
    for fused in fused_sets.values():  # the concatenation the fused GEMM reads shares the views' storage
        tensors.update({id(t): t for t in (fused.weight, fused.bias) if t is not None})
    kept_ids = {id(t) for name, t in named if name.endswith(keep)}
    spans = _spans(tensors.values())
    kept = [s for s in spans if all(id(t) in kept_ids for t in s.tensors)]
    return [s for s in spans if s not in kept], kept, list(fused_sets.values())


def _host_slab(nbytes: int, pin: bool):
    """A host buffer; pinned (registered with CUDA: no rounding up to a power of two, as torch's pinned allocator
    does) where copies go to a GPU."""
    slab = torch.empty(nbytes, dtype=torch.uint8)
    if pin and nbytes:
        code = int(torch.cuda.cudart().cudaHostRegister(slab.data_ptr(), nbytes, _PORTABLE))
        if code:
            from ltxbench.errors import EnvironmentProblem

            raise EnvironmentProblem(f"could not pin {nbytes / 2**30:.2f} GiB of host memory (cudaHostRegister error "
                                     f"{code})", hint="free host memory (other processes), raise the locked-memory "
                                     "limit (ulimit -l), or choose a larger --memory-budget (less to stream)")
    return slab


def _unpin(slabs) -> None:
    """Unregister the pinned `slabs` (a list, or a dict of them: those still in it when this runs)."""
    for slab in slabs.values() if isinstance(slabs, dict) else slabs:
        if slab.numel():
            torch.cuda.cudart().cudaHostUnregister(slab.data_ptr())


class BlockStreamer:
    """blocks[i] for i in `streamed` streamed through `slots` device buffers; the others resident (module
    docstring). enter(i) / leave(i) run around block i (its forward hooks; code that uses a block's weights without
    calling it calls them itself); revert() gives every tensor back its own storage where it was."""

    def __init__(self, blocks, streamed, slots: int, device, keep: tuple[str, ...] = KEEP):
        device, streamed = torch.device(device), sorted(set(streamed))
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if slots < 2:
            raise ValueError(f"slots {slots}: streaming needs at least 2 (one in use, one loading)")
        if streamed and not 0 <= streamed[0] <= streamed[-1] < len(blocks):
            raise ValueError(f"streamed block indices {streamed} outside 0..{len(blocks) - 1}")
        self.blocks, self.streamed, self.slots, self.device = blocks, tuple(streamed), slots, device
        self.cuda = device.type == "cuda"
        self.loads = 0  # slab copies issued (tests count them)
        self._slot = {index: j % slots for j, index in enumerate(streamed)}
        self._next = {index: next(i for i in streamed[j + 1:] + streamed[:j + 1] if self._slot[i] == self._slot[index])
                      for j, index in enumerate(streamed)}
        self._occupant: list = [None] * slots
        self._moved: list[_Span] = []
        self._spans: dict[int, list[_Span]] = {}
        self._slabs: dict = {}
        self._buffers: list = []
        self._fused: list = []
        self._layout(keep)
        self._hooks = []
        if not streamed:
            return
        if self.cuda:
            self._copy_stream = torch.cuda.Stream(device)
            self._copied = [torch.cuda.Event() for _ in range(slots)]
            self._computed = [torch.cuda.Event() for _ in range(slots)]
        self._install()

    def _layout(self, keep) -> None:
        """Resident tensors on the device; each streamed block's spans placed in its slab (ALIGN-ed regions)."""
        owner: dict = {}
        for index, block in enumerate(self.blocks):
            stream, kept, fused = _block_spans(block, keep)
            self._fused += fused
            for span in stream + kept:
                if span.device.type == "meta":
                    raise ValueError(f"block {index} has weights on the meta device (offloaded): nothing to stream")
                key = (span.device, span.tensors[0].untyped_storage().data_ptr())
                if owner.setdefault(key, index) != index:
                    raise ValueError(f"blocks {owner[key]} and {index} share a storage: they cannot stream apart")
            resident = kept + (stream if index not in self._slot else [])
            for span in resident:
                if span.device != self.device:
                    _relocate(span, self.device)
                    self._moved.append(span)
            if index in self._slot:
                at = 0
                for span in stream:
                    span.at, at = at, -(-(at + span.nbytes) // ALIGN) * ALIGN
                self._spans[index] = stream
        fuse.relocated(self._fused)

    def _install(self) -> None:
        """Slabs filled, tensors re-pointed into their slots (their old storage freed), hooks on, first loads."""
        sizes = {index: max((s.at + s.nbytes for s in spans), default=0) for index, spans in self._spans.items()}
        self._slot_bytes = max(sizes.values())
        if self.cuda:  # unpinned when the streamer goes (the slabs still held then: revert unpins each as it goes;
            self._finalizer = weakref.finalize(self, _unpin, self._slabs)  # a failed pin: those pinned before it)
        for index, spans in self._spans.items():  # one block at a time: the host holds one extra block at most
            slab = self._slabs[index] = _host_slab(sizes[index], self.cuda)
            for span in spans:
                slab[span.at:span.at + span.nbytes].copy_(_bytes(span))
                _point(span, slab[span.at:span.at + span.nbytes])
        self._buffers = []
        for index in self.streamed:
            block = self.blocks[index]
            self._hooks += [block.register_forward_pre_hook(_hook(self.enter, index)),
                            block.register_forward_hook(_hook(self.leave, index), always_call=True)]
        vars(self.blocks)[STREAMER_ATTR] = self
        self.acquire()

    def acquire(self) -> None:
        """The slots made (at install, and after release()), the streamed blocks' tensors pointed into them, the
        first block of each slot loading."""
        if self._buffers or not self._spans:
            return
        self._buffers = [torch.empty(self._slot_bytes, dtype=torch.uint8, device=self.device)
                         for _ in range(self.slots)]
        for index, spans in self._spans.items():
            slot = self._buffers[self._slot[index]]
            for span in spans:
                _point(span, slot[span.at:span.at + span.nbytes])
        fuse.relocated(self._fused)
        self._occupant = [None] * self.slots
        if self.cuda:  # the new slots may reuse memory that work queued on this stream still reads (a phase's weights
            self._copy_stream.wait_stream(torch.cuda.current_stream(self.device))  # just dropped): copy after it
        for first in dict.fromkeys(self._slot[i] for i in self.streamed):
            self._load(next(i for i in self.streamed if self._slot[i] == first))

    def release(self) -> None:
        """The slots freed until acquire() (a phase without this stack): the streamed blocks' tensors pointed at their
        host slabs, after the loads under way."""
        if not self._buffers:
            return
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_stream(self._copy_stream)
        for index, spans in self._spans.items():
            for span in spans:
                _point(span, self._slabs[index][span.at:span.at + span.nbytes])
        fuse.relocated(self._fused)
        self._buffers, self._occupant = [], [None] * self.slots

    def _load(self, index: int) -> None:
        """Copy block `index`'s slab into its slot, after the slot's last compute (nothing where it is there)."""
        slot = self._slot[index]
        if self._occupant[slot] == index:
            return
        slab = self._slabs[index]
        target = self._buffers[slot][:slab.numel()]
        if self.cuda:
            with torch.cuda.stream(self._copy_stream):
                self._copy_stream.wait_event(self._computed[slot])
                target.copy_(slab, non_blocking=True)
                self._copied[slot].record(self._copy_stream)
        else:
            target.copy_(slab)
        self._occupant[slot] = index
        self.loads += 1

    @torch.compiler.disable
    def enter(self, index: int) -> None:
        """Before block `index` runs: its weights loaded, and the current stream waiting for them."""
        if index not in self._slot:
            return
        if self.cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("streamed blocks cannot run inside a CUDA graph capture (their loads are not replayed)")
        self._load(index)
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_event(self._copied[self._slot[index]])

    @torch.compiler.disable
    def leave(self, index: int) -> None:
        """After block `index`'s work is queued: its slot loads the next block that lives there, once that work is
        done."""
        if index not in self._slot:
            return
        if self.cuda:
            self._computed[self._slot[index]].record(torch.cuda.current_stream(self.device))
        self._load(self._next[index])

    def revert(self) -> None:
        """Every tensor back in storage of its own where it was before (the same objects, the same values); a fused
        set stays fused. Synchronises the device."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        vars(self.blocks).pop(STREAMER_ATTR, None)
        if self.cuda and self._spans:
            torch.cuda.synchronize(self.device)
        for index, spans in self._spans.items():  # a block at a time, its slab freed after it: the host holds one
            slab = self._slabs.pop(index)          # block more at most, as when the slabs were filled
            for span in spans:
                fresh = torch.empty(span.nbytes, dtype=torch.uint8, device=span.device)
                fresh.copy_(slab[span.at:span.at + span.nbytes])
                _point(span, fresh)
            if self.cuda:
                _unpin([slab])
            del slab
        for span in self._moved:
            _relocate(span, span.device)
        fuse.relocated(self._fused)
        self._spans, self._moved, self._buffers, self._occupant = {}, [], [], [None] * self.slots
        if getattr(self, "_finalizer", None) is not None:
            self._finalizer()
        self._slabs = {}

    @property
    def loaded(self) -> tuple:
        """The block each slot holds or is loading (None: none yet)."""
        return tuple(self._occupant)

    def as_dict(self) -> dict:
        return {"streamed_blocks": list(self.streamed), "resident_blocks": len(self.blocks) - len(self.streamed),
                "slots": self.slots, "slot_bytes": getattr(self, "_slot_bytes", 0),
                "host_bytes": sum(int(s.numel()) for s in self._slabs.values())}


def _hook(step, index: int):
    """A forward (pre-)hook running step(index), outside any compiled graph (regional compile traces the hooks)."""

    @torch.compiler.disable
    def hook(_module, *_args):
        step(index)

    setattr(hook, PLACES_WEIGHTS, True)
    return hook
