"""This rank's part of a transformer call: the batch split over the guidance ranks, the video tokens over the
context-parallel ranks; the batch gathered back after the call.

A diffusers model hook on the transformer itself (the idiom of diffusers' own context-parallel hooks, which this
complements: they split what happens below the root, RoPE's output and the gather at proj_out).

- Batch (`cfg` ranks): with classifier-free guidance the pipeline calls the transformer on a batch of two halves
  (negative, positive). Each guidance rank runs its share of the batch, and the noise predictions are gathered along
  the batch once per call, so every rank leaves the call with the whole output and the pipeline's step is the same
  on all of them. Samples of a batch are computed independently: any batch that divides by the guidance degree
  splits exactly (up to the rounding of a smaller GEMM); a batch that does not (LTX-2's batch-1 guidance passes) runs
  whole on every rank.
- Both over the same 2 ranks (`hybrid`, LTX-2): a call whose batch splits (the guidance pair) splits by batch only,
  with context parallelism switched off for it (context.ContextSwitch); any other (LTX-2's batch-1 passes) splits
  its tokens, with context parallelism on. Each rank then runs one of the pair's samples whole, and half of a
  batch-1 pass, instead of all of it (`cfg`) or half of every call (`ulysses`).
- Tokens (`ulysses` / `ring` ranks): the video hidden states and every input that carries the video token count in
  the family's named dim (a per-token timestep) are split along the tokens, as diffusers' split hook would, with
  `tensor_split` so that a count that does not divide gives the balanced split diffusers' "anything" modes expect.
  The prompt is not split: every rank holds all of it, so cross-attention to it runs locally (parallel/context.py).

A patched `__call__` that prepares a step before the forward (LTX-Video's step_call) splits the call itself with
`split` and `gather`, and passes `step`: the hook then lets the call through untouched.
"""

from __future__ import annotations

import inspect

import torch
from diffusers.hooks.hooks import ModelHook

HOOK_NAME = "ltxbench_parallel_split"


class SplitHook(ModelHook):
    """Root hook of a parallel transformer (see the module doc). cfg: (guidance group, its degree, this rank's index
    in it); cp: (context-parallel degree, this rank's index in its group); sequence_inputs: {forward argument: the dim
    holding the video token count}; tokens_of: the argument whose dim 0 is the batch and whose dim 1 is that count,
    or from which `count` reads it (a patchifying transformer's latents); switch: the `hybrid` split's
    context.ContextSwitch (one split per call), None otherwise."""

    _is_stateful = False

    def __init__(self, cfg: tuple, cp: tuple, sequence_inputs: dict[str, int], tokens_of: str = "hidden_states",
                 switch=None, count=None):
        super().__init__()
        self.count = count
        self.cfg_group, self.cfg_degree, self.cfg_rank = cfg
        self.cp_degree, self.cp_rank = cp
        self.sequence_inputs, self.tokens_of = sequence_inputs, tokens_of
        self.switch = switch
        self.params: list[str] = []
        self._gathers: list[bool] = []   # per open call: whether its output is gathered on the way out
        self._views: dict[str, tuple] = {}  # argument -> (source tensor, its part): one part object per source

    # --- diffusers ModelHook protocol -------------------------------------------------------------------------
    def initialize_hook(self, module):
        from diffusers.utils.torch_utils import unwrap_module

        forward = type(unwrap_module(module)).forward
        self.params = list(inspect.signature(forward).parameters)[1:]
        return module

    def reset_state(self, module):
        self._views.clear()
        return module

    def pre_forward(self, module, *args, **kwargs):
        if "step" in kwargs:  # the caller (a patched __call__) split this call and gathers it
            self._gathers.append(False)
            return args, kwargs
        bound = dict(zip(self.params, args, strict=False))
        bound.update(kwargs)
        bound, gather = self.split(bound)
        self._gathers.append(gather)
        return (), bound

    def post_forward(self, module, output):
        return self.gather(output) if self._gathers.pop() else output

    # --- the split and the gather ---------------------------------------------------------------------------
    def split(self, bound: dict) -> tuple[dict, bool]:
        """This rank's part of the call's arguments, and whether its output must be gathered along the batch."""
        hidden = bound.get(self.tokens_of)
        if not torch.is_tensor(hidden) or hidden.dim() < 2:
            return bound, False
        batch, tokens = hidden.size(0), (self.count(hidden) if self.count else hidden.size(1))
        halves = self.cfg_degree > 1 and batch % self.cfg_degree == 0
        split_tokens = self.cp_degree > 1 and not (halves and self.switch is not None)
        if self.switch is not None:
            self.switch.set(split_tokens)
        out = {}
        for name, value in bound.items():
            part = value
            if torch.is_tensor(value) and value.dim():
                if halves and value.size(0) == batch:
                    part = part.tensor_split(self.cfg_degree)[self.cfg_rank]
                dim = self.sequence_inputs.get(name)
                if split_tokens and dim is not None and part.dim() > dim and part.size(dim) == tokens:
                    part = part.tensor_split(self.cp_degree, dim=dim)[self.cp_rank]
                part = self._stable(name, value, part)
            out[name] = part
        return out, halves

    def _stable(self, name: str, source, part):
        """The same part object while the source is the same object: caches keyed on tensor identity (LTX-Video's
        prompt keys/values) see the prompt's part as the same tensor at every step. A part is a view: it shares
        the source's version counter, so an in-place write to the source is still seen."""
        if part is source:
            return part
        kept = self._views.get(name)
        if kept is not None and kept[0] is source and kept[1].shape == part.shape:
            return kept[1]
        self._views[name] = (source, part)
        return part

    def gather(self, output):
        """The call's output with every tensor gathered along the batch over the guidance ranks."""
        if torch.is_tensor(output):
            return self._gather(output)
        if isinstance(output, tuple | list):
            return type(output)(self._gather(o) if torch.is_tensor(o) else o for o in output)
        if isinstance(output, dict):  # diffusers' BaseOutput is an ordered dict with attributes
            return type(output)(**{k: self._gather(v) if torch.is_tensor(v) else v for k, v in output.items()})
        return output

    def _gather(self, tensor):
        import torch.distributed._functional_collectives as funcol

        return funcol.wait_tensor(funcol.all_gather_tensor(tensor.contiguous(), 0, group=self.cfg_group))


def split_hook_of(module) -> SplitHook | None:
    """The SplitHook on `module` when it is the only hook wrapping its forward (what a patched __call__ can take
    over), else None."""
    registry = vars(module).get("_diffusers_hook")
    if registry is None or list(registry.hooks) != [HOOK_NAME]:
        return None
    return registry.hooks[HOOK_NAME]


def install(module, hook: SplitHook) -> None:
    from diffusers.hooks import HookRegistry

    HookRegistry.check_if_exists_or_initialize(module).register_hook(hook, HOOK_NAME)


def remove(module) -> None:
    """Remove the hook, and what the registry leaves on the instance once empty (context.unwrap)."""
    from ltxbench.parallel.context import unwrap

    registry = vars(module).get("_diffusers_hook")
    if registry is not None:
        registry.remove_hook(HOOK_NAME, recurse=False)
        unwrap(module)
