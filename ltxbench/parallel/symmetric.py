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

With our CUDA kernels a second op, `ltxbench_parallel::ulysses_rope_attention`, skips the q/k/v copy too: the q/k
norm + RoPE kernel stores each rank's heads straight into that rank's input buffer (ops.qk_rms_norm_rope_pack_into),
then the same barrier and what follows it. On 4× H200: 44.86 → 43.83 ms a step (docs/parallel.md#measured).

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
        """From a send buffer: each peer's block pushed into its buffer, this rank's copied into its own."""
        stream = torch.cuda.current_stream()
        self._push(packed, self.peer_inputs, stream)
        self.inputs[self.rank].copy_(packed[self.rank])
        stream.wait_stream(self.side)
        return self.attend(backend, stream)

    def slots(self) -> list:
        """Where each rank's block of this rank's tokens goes: rank r's input buffer, this rank's slot, viewed as the
        packing kernel's part (1, S, 3, heads · dim)."""
        _, tokens, _, heads, dim = self.inputs.shape
        return [self.peer_inputs[r][self.rank].view(1, tokens, 3, heads * dim) for r in range(self.ranks)]

    def attend(self, backend, stream):
        """Once this rank's block is in every rank's input buffer: the barrier, the attention over the buffer in
        place, the output rows exchanged the same way, and this rank's tokens in the caller's layout."""
        ranks, tokens, _, heads, dim = self.inputs.shape
        self.input_handle.barrier(channel=0, timeout_ms=BARRIER_TIMEOUT_MS)
        received = self.inputs.view(1, ranks * tokens, 3, heads, dim)
        out = attend_received(received, backend or None)
        rows = out.reshape(ranks, tokens, heads, dim)  # rank r's tokens of this rank's heads
        self._push(rows, self.peer_outputs, stream)
        stream.wait_stream(self.side)
        self.output_handle.barrier(channel=0, timeout_ms=BARRIER_TIMEOUT_MS)
        parts = [rows[r] if r == self.rank else self.outputs[r] for r in range(ranks)]
        return torch.stack(parts, dim=1).view(1, tokens, ranks * heads, dim)


def _exchange(group_name: str, shape, dtype, device) -> _Exchange:
    key = (group_name, tuple(shape), dtype, device)
    exchange = _exchanges.get(key)
    if exchange is None:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("ltxbench_parallel: the first Ulysses exchange of a shape must run uncaptured (its "
                               "symmetric buffers are allocated collectively)")
        exchange = _exchanges[key] = _Exchange(group_name, shape, dtype, device)
    return exchange


@torch.library.custom_op("ltxbench_parallel::ulysses_attention", mutates_args=(), device_types="cuda")
def ulysses_attention(packed: torch.Tensor, group_name: str, backend: str) -> torch.Tensor:
    """Attention of this rank's tokens over every rank's, from the send buffer (ranks, S, 3, heads / ranks, dim)
    that ulysses.exchanged_attention takes; (1, S, heads, dim). backend: diffusers' attention backend name, or ""."""
    exchange = _exchange(group_name, packed.shape, packed.dtype, packed.device)
    return exchange.attention(packed.contiguous(), backend)


@ulysses_attention.register_fake
def _(packed, group_name, backend):
    ranks, tokens, _, heads, dim = packed.shape
    return packed.new_empty((1, tokens, ranks * heads, dim))


@torch.library.custom_op("ltxbench_parallel::ulysses_rope_attention", mutates_args=(), device_types="cuda")
def ulysses_rope_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor,
                           eps: float, cos: torch.Tensor | None, sin: torch.Tensor | None, grid: torch.Tensor | None,
                           freqs: torch.Tensor | None, split: bool, heads: int, group_name: str,
                           backend: str) -> torch.Tensor:
    """`ulysses_attention` of a self-attention whose q/k norm + RoPE kernel packs q, k and v (LTX-Video's
    ops.qk_rms_norm_rope_pack, LTX-2's split variant with split=True): the kernel writes each rank's heads of this
    rank's tokens straight into that rank's input buffer (ops.qk_rms_norm_rope_pack_into), so its stores are the
    exchange. q, k, v (1, S, heads · dim); returns (1, S, heads, dim)."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    from ltxbench import ops

    ranks = torch.distributed.get_world_size(_resolve_process_group(group_name))
    _, tokens, width = q.shape
    exchange = _exchange(group_name, (ranks, tokens, 3, heads // ranks, width // heads), q.dtype, q.device)
    if split:
        ops.qk_rms_norm_rope_split_pack_into(q, k, v, wq, wk, eps, cos, sin, exchange.slots())
    else:
        ops.qk_rms_norm_rope_pack_into(q, k, v, wq, wk, eps, cos, sin, grid, freqs, exchange.slots())
    return exchange.attend(backend, torch.cuda.current_stream())


@ulysses_rope_attention.register_fake
def _(q, k, v, wq, wk, eps, cos, sin, grid, freqs, split, heads, group_name, backend):
    _, tokens, width = q.shape
    return q.new_empty((1, tokens, heads, width // heads))


def attend_received(received, backend):
    """Attention over the exchanged buffer (1, all tokens, 3, heads here, dim), read in place: (1, all tokens, heads
    here, dim). The same call whichever transport filled the buffer."""
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    return dispatch_attention_fn(*received.unbind(2), attn_mask=None, dropout_p=0.0, is_causal=False,
                                 backend=backend, parallel_config=None)
