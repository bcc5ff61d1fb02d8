"""A parallel run's plan (what a model family declares: ParallelPlan) and its application to a transformer
(`parallelize`), reverted by the report it returns."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ParallelPlan:
    """What a model family declares for a parallel run.
    sequence_inputs: forward arguments carrying the video tokens, {name: the dim holding their count};
    below_root(transformer): diffusers' context-parallel plan below the root (RoPE's output, proj_out's gather);
    local_attentions(transformer): the attention modules whose keys and values every rank holds whole (the
    prompt's), which run without communication. An attention whose queries every rank holds whole but whose keys
    come from the split tokens (LTX-2's video-to-audio) keeps the parallel config: Ulysses and ring attention are
    exact with replicated queries (each rank's copy is answered over all the keys).
    token_count(transformer): for a transformer that patchifies its own input (Wan's root takes (B, C, F, H, W)
    latents), a function of the root's hidden_states giving the call's video token count, the size a per-token
    input holds; None: the hidden states are the tokens, (B, S, D)."""

    sequence_inputs: dict[str, int] = field(default_factory=lambda: {"hidden_states": 1})
    below_root: Callable | None = None
    local_attentions: Callable | None = None
    token_count: Callable | None = None


class ParallelReport:
    """What `parallelize` installed; revert() removes it (split hook, context-parallel hooks and configs)."""

    def __init__(self, description: dict):
        self.description = description
        self._undo: list[Callable[[], None]] = []

    def revert(self) -> None:
        while self._undo:
            self._undo.pop()()

    def as_dict(self) -> dict:
        return dict(self.description)


def parallelize(transformer, world, plan: ParallelPlan, tokens: int | None = None) -> ParallelReport:
    """Apply `world`'s split (launch.World) to `transformer`; tokens: the video token count of the run (whether the
    context-parallel split is even). Call after the injection and before compiling."""
    from ltxbench.parallel import context, split
    from ltxbench.parallel.launch import HYBRID

    device_type = "cuda" if str(world.device).startswith("cuda") else "cpu"
    cfg, ring, ulysses = context.degrees(world.split, world.cfg_degree, world.cp_degree)
    hybrid = world.split == HYBRID
    # hybrid: the same ranks form the guidance group and the Ulysses group, a mesh each; else one (cfg, ring, ulysses)
    device_mesh = context.mesh(device_type, 1 if hybrid else cfg, ring, ulysses)
    cfg_mesh = (context.mesh(device_type, cfg, 1, 1) if hybrid else device_mesh)["cfg"]
    uneven = bool(tokens) and world.cp_degree > 1 and tokens % world.cp_degree != 0
    report = ParallelReport({"split": world.split, "world_size": world.size, "cfg_degree": cfg,
                                    "ring_degree": ring, "ulysses_degree": ulysses, "uneven_tokens": uneven})
    cp_rank, switch = 0, None
    if world.cp_degree > 1:
        config = context.context_config(device_mesh, ring, ulysses, uneven)
        below = plan.below_root(transformer)
        local = plan.local_attentions(transformer) if plan.local_attentions else []
        context.enable(transformer, config, below, local)
        switch = context.ContextSwitch(transformer) if hybrid else None

        def undo_context():
            if switch is not None:
                switch.set(True)
            context.disable(transformer, below)

        report._undo.append(undo_context)
        cp_rank = config._flattened_mesh.get_local_rank()
        if ulysses > 1:  # how our Ulysses attention exchanges q/k/v and its output (symmetric.py)
            from ltxbench.parallel import symmetric

            group = config._ulysses_mesh.get_group()
            if device_type == "cuda" and not uneven:  # uneven token counts go through diffusers' exchange
                symmetric.prepare(group)  # collective: every rank decides the exchange here
            report.description["ulysses_exchange"] = symmetric.describe(group)
    hook = split.SplitHook((cfg_mesh.get_group(), cfg, cfg_mesh.get_local_rank()),
                           (world.cp_degree, cp_rank), plan.sequence_inputs, switch=switch,
                           count=plan.token_count(transformer) if plan.token_count else None)
    split.install(transformer, hook)
    report._undo.append(lambda: split.remove(transformer))
    return report
