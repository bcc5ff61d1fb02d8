"""One rank of tests/parallel/test_ulysses_exchange.py's GPU tests (started by torch.distributed.run, NCCL): the Ulysses
attention through symmetric memory (ltxbench.parallel.symmetric) against the same attention through NCCL's
all-to-all, bit for bit, over consecutive calls with new values each (a buffer left stale shows), eager and compiled
under CUDA graphs; and the same with the q/k kernel writing each rank's part into that rank's buffer. argv: output
JSON path, mutation ("", "stale-push": from the second call on nothing is pushed to the peers, or "stale-written":
from the second call on the kernel writes every part into the rank's own slot)."""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import rank_exit
import torch
import torch.distributed as dist

from ltxbench.parallel import symmetric, ulysses

CASES = ((torch.bfloat16, 83, 32, 64), (torch.float16, 769, 16, 128), (torch.bfloat16, 7, 2, 64))  # dtype, S, H, d


def main(out: str, mutation: str) -> None:
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    ranks = dist.get_world_size()
    group = dist.new_group(list(range(ranks)))
    mesh = SimpleNamespace(get_group=lambda: group)
    config = SimpleNamespace(context_parallel_config=SimpleNamespace(
        ulysses_degree=ranks, ring_degree=1, ulysses_anything=False, _ulysses_mesh=mesh))
    result = {"usable": symmetric.prepare(group), "cases": []}

    def through(pushed: bool, packed):
        symmetric._usable[group.group_name] = pushed
        return ulysses.exchanged_attention(packed, None, config)

    def two_calls(first, second):  # the second call's send buffer depends on the first's output
        out = ulysses.exchanged_attention(first, None, config)
        return out, ulysses.exchanged_attention(second + out[0, 0, 0, 0], None, config)

    compiled = torch.compile(two_calls, fullgraph=True, mode="reduce-overhead")
    for dtype, tokens, heads, dim in CASES:
        for call in range(3):
            if mutation == "stale-push" and call == 1:
                symmetric._Exchange._push = lambda self, sources, buffers, stream: self.side.wait_stream(stream)
            gen = torch.Generator("cuda").manual_seed(1000 * call + rank)
            first, second = (torch.randn(ranks, tokens, 3, heads // ranks, dim, device="cuda", generator=gen,
                                         dtype=dtype) * 3 for _ in range(2))
            nccl = through(False, first)
            nccl_chain = two_calls(first, second)
            pushed = through(True, first)
            graphed = [t.clone() for t in compiled(first, second)]
            result["cases"].append({
                "dtype": str(dtype), "tokens": tokens, "heads": heads, "call": call, "shape": list(pushed.shape),
                "eager_equal": bool(torch.equal(pushed, nccl)),
                "graphed_equal": all(torch.equal(a, b) for a, b in zip(graphed, nccl_chain, strict=True)),
                "differs_from_input": not torch.equal(nccl, first[:, :, 2].transpose(0, 1).reshape(nccl.shape))})
    result["written"] = _written_cases(group, config, rank, mutation)
    symmetric.release()
    if rank == 0:
        with open(out, "w") as file:
            json.dump(result, file)
    rank_exit.leave()


# The q/k kernel writing every rank's part into that rank's buffer (ulysses.rope_attention with our CUDA ops):
# (packing op's KernelSpec, variant, dtype, tokens per rank, D, heads). LTX-Video from coordinates and from tables,
# LTX-2's split RoPE.
WRITTEN = (("qk_rms_norm_rope_pack", "coords-4", torch.bfloat16, 83, 2048, 32),
           ("qk_rms_norm_rope_pack", "tables", torch.float16, 769, 2048, 32),
           ("qk_rms_norm_rope_split_pack", "video", torch.bfloat16, 83, 2048, 32))


def _written_cases(group, config, rank: int, mutation: str) -> list:
    from ltxbench import ops
    from ltxbench.ops.registry import SPECS

    def attend(inputs, split, heads):
        rope = {k: inputs[k] for k in ("cos", "sin", "grid", "freqs") if inputs.get(k) is not None}
        args = [inputs[k] for k in ("q", "k", "v", "wq", "wk", "eps")]
        return ulysses.rope_attention(ops, *args, rope, split, heads, None, config)

    def two_calls(first, second, split, heads):  # the second call's q depends on the first's output
        out = attend(first, split, heads)
        return out, attend({**second, "q": second["q"] + out[0, 0, 0, 0]}, split, heads)

    compiled = torch.compile(two_calls, fullgraph=True, mode="reduce-overhead")
    cases = []
    for name, variant, dtype, tokens, width, heads in WRITTEN:
        split = name == "qk_rms_norm_rope_split_pack"
        for call in range(3):
            if mutation == "stale-written" and call == 1:  # the kernel writes every part into this rank's own slot
                symmetric._Exchange.slots = lambda self: [self.inputs[self.rank].flatten(2).unsqueeze(0)] * self.ranks
            gen = torch.Generator().manual_seed(1000 * call + rank)
            first, second = (SPECS[name].make_inputs((1, tokens, width), dtype, "cuda", gen, variant) for _ in range(2))
            symmetric._usable[group.group_name] = False  # packed, then NCCL's all-to-all
            nccl, nccl_chain = attend(first, split, heads), two_calls(first, second, split, heads)
            symmetric._usable[group.group_name] = True
            written = attend(first, split, heads)
            graphed = [t.clone() for t in compiled(first, second, split, heads)]
            cases.append({"op": name, "variant": variant, "dtype": str(dtype), "call": call,
                          "shape": list(written.shape), "eager_equal": bool(torch.equal(written, nccl)),
                          "graphed_equal": all(torch.equal(a, b) for a, b in zip(graphed, nccl_chain, strict=True))})
    return cases


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")
