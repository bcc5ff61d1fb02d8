"""A tiny program that `ltxbench.parallel.launch.relaunch` starts as N processes in
tests/parallel/test_parallel_launch.py (`python -m parallel_worker MODE ...`), in place of `python -m ltxbench`.

Modes: `world OUT [DEVICE]` (join the group, gloo on the CPU or NCCL on cuda, check what every rank sees; rank 0
writes it to OUT as JSON), `exit CODE
RANK` (that rank exits with CODE, the others wait to be stopped), `kill RANK` (that rank dies of SIGKILL).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def _world(out: str, device: str = "cpu") -> None:
    import torch
    import torch.distributed as dist

    from ltxbench.parallel import launch

    world = launch.init_world(os.environ[launch.SPLIT_ENV], device, timeout_s=60)
    seen = [None] * world.size
    dist.all_gather_object(seen, {"rank": world.rank, "size": world.size, "local_rank": world.local_rank,
                                  "device": world.device,
                                  "current": torch.cuda.current_device() if device == "cuda" else None})
    total = torch.tensor([world.rank + 1], device=world.device)
    dist.all_reduce(total)
    described = launch.describe(world)
    launch.barrier()
    if launch.is_main():
        doc = {"seen": seen, "sum": int(total), "described": described, "split": world.split,
               "degrees": [world.cfg_degree, world.cp_degree], "threads": os.environ.get("OMP_NUM_THREADS"),
               "nvls": os.environ.get("NCCL_NVLS_ENABLE")}
        with open(out, "w", encoding="utf-8") as f:
            json.dump(doc, f)
    launch.shutdown()
    launch.shutdown()  # idempotent
    assert launch.current_world() is None


def main(mode: str, *args: str) -> None:
    rank = int(os.environ["RANK"])
    if mode == "world":
        _world(*args)
    elif mode == "exit":
        code, failing = int(args[0]), int(args[1])
        if rank == failing:
            print(f"error: worker {rank} gives up", file=sys.stderr)
            sys.exit(code)
        time.sleep(60)  # stopped by the launcher once the other rank failed
    elif mode == "kill":
        if rank == int(args[0]):
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)


if __name__ == "__main__":
    from ltxbench.parallel.launch import run_rank

    run_rank(main, *sys.argv[1:])  # ends as `python -m ltxbench` does under the launcher
