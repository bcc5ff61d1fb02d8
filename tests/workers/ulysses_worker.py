"""One rank of tests/parallel/test_ulysses_exchange.py (started by torch.distributed.run, gloo): our Ulysses attention
(ltxbench.parallel.ulysses.attention) against one process's attention over all tokens, per head count.
argv: output JSON path, mutation ("" or "swapped-heads")."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import rank_exit
import torch
import torch.distributed as dist
import torch.nn.functional as F

from ltxbench.parallel import ulysses


def main(out: str, mutation: str) -> None:
    dist.init_process_group("gloo")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    mesh = SimpleNamespace(get_group=lambda: dist.group.WORLD)
    config = SimpleNamespace(context_parallel_config=SimpleNamespace(
        ulysses_degree=ranks, ring_degree=1, ulysses_anything=False, _ulysses_mesh=mesh))
    if mutation == "swapped-heads":  # the output's exchange hands back the head groups in reverse rank order
        exchange = ulysses.exchange
        ulysses.exchange = lambda tensor, group: exchange(tensor, group).flip(0) if tensor.dim() == 4 else exchange(
            tensor, group)
    errors = {}
    for heads in (8, 6):  # 4 and 3 heads a rank: the order of the heads inside a rank's group counts
        torch.manual_seed(0)  # every rank draws the same full q, k, v (7 tokens per rank: an odd size)
        q, k, v = (torch.randn(1, 7 * ranks, heads, 16) * scale for scale in (1.0, 1.0, 3.0))
        full = F.scaled_dot_product_attention(*(t.double().transpose(1, 2) for t in (q, k, v))).transpose(1, 2)
        mine = slice(7 * rank, 7 * (rank + 1))
        got = ulysses.attention(q[:, mine], k[:, mine], v[:, mine], None, config)
        errors[f"heads{heads}"] = {"shape": list(got.shape), "error": (got.double() - full[:, mine]).abs().max().item()}
    if rank == 0:
        with open(out, "w") as file:
            json.dump(errors, file)
    rank_exit.leave()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")
