"""The Ulysses exchange through torch's symmetric memory: each rank writes the other ranks' shares straight into
their buffers and signals them, instead of NCCL's all-to-all.

NCCL moves an all-to-all through its own staging buffers with kernels of its own; between GPUs that map each other's
memory (NVLink), a rank can copy its send blocks into its peers' receive buffers with the copy engine and then meet
them at a barrier of the buffer's signal pad (torch.distributed._symmetric_memory, the transport of torch's own
low-contention collectives). Measured on 4× H100 (NV18), both pairs at once, under a CUDA graph, at LTX-2B's
161-frame `cfg+ulysses` sizes: q/k/v (24.8 MB to the partner) 117.5 µs with NCCL, 86.6 µs pushed as here; the whole
4-GPU step 46.82 → 45.72 ms (docs/parallel.md#measured).

One op, `ltxbench_parallel::ulysses_attention`: the send buffer in, the attention output in the caller's layout out
(a fresh tensor, so no buffer of the exchange escapes into inductor's memory planning, which could reuse it). Inside:
push q/k/v → barrier → attention over the received buffer → push the output rows → barrier → rows to the caller's
layout. Why one buffer per shape is enough: a rank writes into a peer's input buffer only after the output barrier of
the previous attention, which the peer reaches after its attention read that buffer; it writes into a peer's output
buffer only after the next input barrier, which the peer reaches after it has used its output. Same values, same
order as the all-to-all: the attention sees the same inputs, so the result is the same bits.

Used where every rank of the Ulysses group agreed at set-up that it works (`prepare`, collective); the environment
variable LTXBENCH_ULYSSES_EXCHANGE=nccl keeps NCCL's all-to-all.
"""

from __future__ import annotations

import os

import torch

ENV = "LTXBENCH_ULYSSES_EXCHANGE"  # "symmetric" (default where it works) or "nccl"
BARRIER_TIMEOUT_MS = 600_000  # as the process group's: a dead peer ends the run instead of hanging it

_usable: dict[str, bool] = {}  # group name -> every rank of it can use symmetric memory
_why_not: dict[str, str] = {}  # group name -> why this rank could not (the error it met)
_exchanges: dict[tuple, _Exchange] = {}


def prepare(group) -> bool:
    """Collective over `group` (every rank calls it, eagerly, before any trace): whether the Ulysses exchange over it
    goes through symmetric memory. False where the variable asks for NCCL, off the GPU, or where any rank cannot map
    its peers' memory."""
    import torch.distributed as dist

    name = group.group_name
    if name not in _usable:
        ok = (os.environ.get(ENV, "symmetric") != "nccl" and torch.cuda.is_available()
              and "nccl" in str(dist.get_backend(group)))  # "nccl", or "cpu:gloo,cuda:nccl" as the launcher's
        if ok:
            try:
                import torch.distributed._symmetric_memory as symm

                probe = symm.empty(1, dtype=torch.uint8, device=torch.device("cuda", torch.cuda.current_device()))
                ok = symm.rendezvous(probe, group) is not None
            except Exception as error:  # no P2P between the GPUs, an older torch: NCCL's all-to-all instead
                ok, _why_not[name] = False, f"{type(error).__name__}: {error}"[:300]
            vote = torch.tensor([int(ok)], device="cuda")
            dist.all_reduce(vote, op=dist.ReduceOp.MIN, group=group)
            ok = bool(vote.item())
        _usable[name] = ok
    return _usable[name]


def usable(group) -> bool:
    """What `prepare` decided for `group` (False where it was not asked)."""
    return _usable.get(group.group_name, False)


def describe(group) -> str:
    """How the Ulysses exchange over `group` runs, for a result: "symmetric memory" or "all-to-all" (with the error
    that ruled symmetric memory out on this rank, if one did)."""
    if usable(group):
        return "symmetric memory"
    why = _why_not.get(group.group_name)
    return f"all-to-all (symmetric memory: {why})" if why else "all-to-all"


def release() -> None:
    """Free every symmetric buffer (before the process group goes: their handles outlive it badly). Call when no
    rank exchanges any more (after the run's last barrier)."""
    if _exchanges:
        torch.cuda.synchronize()
    _exchanges.clear()
    _usable.clear()
    _why_not.clear()


class _Exchange:
    """The symmetric buffers of one (group, shape, dtype): inputs (ranks, S, 3, heads, dim), slot r holding rank r's
    tokens of this rank's heads, and outputs (ranks, S, heads, dim), slot r holding this rank's tokens of rank r's
    heads; and every rank's view of both (its peers' mapped into this process)."""

    def __init__(self, group_name: str, shape, dtype, device):
        import torch.distributed._symmetric_memory as symm
        from torch.distributed.distributed_c10d import _resolve_process_group

        group = _resolve_process_group(group_name)
        self.ranks, tokens, _, heads, dim = shape
        self.rank = torch.distributed.get_rank(group)
        self.inputs = symm.empty(tuple(shape), dtype=dtype, device=device)
        self.outputs = symm.empty((self.ranks, tokens, heads, dim), dtype=dtype, device=device)
        self.input_handle = symm.rendezvous(self.inputs, group)
        self.output_handle = symm.rendezvous(self.outputs, group)
        self.peer_inputs = [self.input_handle.get_buffer(r, self.inputs.shape, dtype) for r in range(self.ranks)]
        self.peer_outputs = [self.output_handle.get_buffer(r, self.outputs.shape, dtype) for r in range(self.ranks)]
        self.side = torch.cuda.Stream(device)  # the pushes to the peers run beside the local copy

    def _push(self, sources, buffers, stream) -> None:
        """sources[r] → rank r's buffer, slot of this rank, for every peer r, on the side stream (copy engine)."""
        self.side.wait_stream(stream)
        with torch.cuda.stream(self.side):
            for r in range(self.ranks):
                if r != self.rank:
                    buffers[r][self.rank].copy_(sources[r])

    def attention(self, packed, backend):
        from ltxbench.parallel.ulysses import attend_received

        ranks, tokens, _, heads, dim = packed.shape
        stream = torch.cuda.current_stream()
        self._push(packed, self.peer_inputs, stream)
        self.inputs[self.rank].copy_(packed[self.rank])
        stream.wait_stream(self.side)
        self.input_handle.barrier(channel=0, timeout_ms=BARRIER_TIMEOUT_MS)
        received = self.inputs.view(1, ranks * tokens, 3, heads, dim)
        out = attend_received(received, backend or None)
        rows = out.reshape(ranks, tokens, heads, dim)  # rank r's tokens of this rank's heads
        self._push(rows, self.peer_outputs, stream)
        stream.wait_stream(self.side)
        self.output_handle.barrier(channel=0, timeout_ms=BARRIER_TIMEOUT_MS)
        parts = [rows[r] if r == self.rank else self.outputs[r] for r in range(ranks)]
        return torch.stack(parts, dim=1).view(1, tokens, ranks * heads, dim)


@torch.library.custom_op("ltxbench_parallel::ulysses_attention", mutates_args=(), device_types="cuda")
def ulysses_attention(packed: torch.Tensor, group_name: str, backend: str) -> torch.Tensor:
    """Attention of this rank's tokens over every rank's, from the send buffer (ranks, S, 3, heads / ranks, dim)
    that ulysses.exchanged_attention takes; (1, S, heads, dim). backend: diffusers' attention backend name, or ""."""
    key = (group_name, tuple(packed.shape), packed.dtype, packed.device)
    exchange = _exchanges.get(key)
    if exchange is None:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("ltxbench_parallel::ulysses_attention: the first call of a shape must run uncaptured "
                               "(its symmetric buffers are allocated collectively)")
        exchange = _exchanges[key] = _Exchange(group_name, packed.shape, packed.dtype, packed.device)
    return exchange.attention(packed.contiguous(), backend)


@ulysses_attention.register_fake
def _(packed, group_name, backend):
    ranks, tokens, _, heads, dim = packed.shape
    return packed.new_empty((1, tokens, ranks * heads, dim))
