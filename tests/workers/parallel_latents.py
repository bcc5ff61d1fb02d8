"""One rank of the parallel exactness tests (test_parallel_split.py on the CPU with gloo, test_parallel_gpu.py on
the GPUs with NCCL), started by torch's launcher: the latents of an LTX-Video / LTX-2 generation in one
configuration (unpatched, or with our kernels) on this process alone, then split over the ranks
(ltxbench.parallel), then alone again after the split's revert and after the injection's. Rank 0 writes the
comparison as JSON to argv[1].

argv[2]: a JSON spec: family (ltx | ltx2 | wan), model (a preset, default the tiny one), split, config (baseline |
optimized | optimized+compile | optimized-fp8: our kernels with the FP8 projections), device (cpu | cuda),
num_frames, height, width, steps, guidance, image (image-to-video from a random first frame), mutation
("own-half": each guidance rank repeats its own half of the output instead of gathering both, which must fail
the check; "local-keys": LTX-2's video-to-audio attention run on this rank's video keys alone; "local-self": Wan's
video self-attention likewise; "swapped-heads":
our Ulysses attention's output exchange returns the head groups in reverse order; "own-keys": our ring
attention's all-gather returns this rank's own keys and values in every slot), reference (GPU: the
same model upcast to fp32 on rank 0 at the end, and each latent's cosine to it: the bf16 rounding of one GPU beside
the split's).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import rank_exit
import torch
import torch.distributed as dist


def _pipeline(spec, device, dtype):
    from ltxbench.models import ltx2_build, ltx_build
    from tests.helpers import realistic_modulation

    if spec["family"] == "wan":
        from ltxbench.models import wan_build

        pipe = wan_build.build_pipeline(spec["model"], "random", device, "bf16" if dtype == torch.bfloat16 else "fp32")
        pipe.set_progress_bar_config(disable=True)
        return pipe
    if spec["family"] == "ltx":  # the prompt comes as embeddings: the tiny T5 stands in for T5-XXL (faster to build)
        from diffusers import LTXPipeline

        configs = {**ltx_build.component_configs(spec["model"]),
                   "text_encoder": ltx_build.component_configs("ltx-tiny")["text_encoder"]}
        pipe = LTXPipeline(tokenizer=None, **ltx_build.build_components(configs, device, dtype, seed=0))
    else:
        pipe = ltx2_build.build_pipeline(spec["model"], "random", device, dtype, seed=0)
    if spec["image"]:  # image-to-video on the same components: per-token timesteps (the first frame's are 0)
        from ltxbench.models.video_image import to_image_to_video

        pipe = to_image_to_video(pipe, "LTXImageToVideoPipeline" if spec["family"] == "ltx"
                                 else "LTX2ImageToVideoPipeline")
    realistic_modulation(pipe.transformer, scale=0.3 if spec["family"] == "ltx" else 0.7)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _image(spec):
    """A first frame of the run's size, the same on every rank."""
    from PIL import Image

    pixels = torch.rand(spec["height"], spec["width"], 3, generator=torch.Generator().manual_seed(5))
    return {"image": Image.fromarray((pixels * 255).to(torch.uint8).numpy())} if spec["image"] else {}


def _runner(pipe, spec, device, dtype):
    """run() -> the generation's latents (LTX-2: video and audio, flattened)."""
    size = dict(num_frames=spec["num_frames"], height=spec["height"], width=spec["width"],
                num_inference_steps=spec["steps"], guidance_scale=spec["guidance"], output_type="latent",
                **_image(spec))
    if spec["family"] == "wan":  # the prompt through the family's encode (I2V's pipeline needs ftfy for text)
        from types import SimpleNamespace

        from ltxbench.models import family_of

        prompt = SimpleNamespace(prompt="a fox in the snow", negative_prompt="blurry",
                                 guidance_scale=spec["guidance"], batch_size=1)
        with torch.no_grad():
            embeds, negative = family_of(spec["model"]).encode(pipe, prompt, device)

        def run():
            with torch.no_grad():
                return pipe(prompt_embeds=embeds, negative_prompt_embeds=negative, return_dict=False,
                            generator=torch.Generator("cpu").manual_seed(3), **size)[0].float()
    elif spec["family"] == "ltx":
        channels = pipe.transformer.config.caption_channels
        embeds = torch.randn(1, 16, channels, generator=torch.Generator().manual_seed(1)).to(device, dtype)
        mask = torch.ones(1, 16, device=device)
        mask[:, -3:] = 0  # a padded prompt

        def run():
            with torch.no_grad():
                return pipe(prompt_embeds=embeds, prompt_attention_mask=mask, negative_prompt_embeds=-embeds,
                            negative_prompt_attention_mask=mask, generator=torch.Generator().manual_seed(0),
                            **size).frames.float()
    else:
        def run():
            with torch.no_grad():
                video, audio = pipe(prompt="a fox in the snow", negative_prompt="blurry", return_dict=False,
                                    generator=torch.Generator("cpu").manual_seed(3), **size,
                                    **({"image_crf": 0} if spec["image"] else {}))  # no H.264 pass (PyAV)
            return torch.cat([video.flatten().float(), audio.flatten().float()])
    return run


def main(out: str, spec_text: str) -> None:
    from ltxbench.models import family_of
    from ltxbench.parallel import split as split_module
    from ltxbench.parallel.launch import World, degrees
    from ltxbench.parallel.plan import parallelize

    spec = {"model": None, "config": "baseline", "device": "cpu", "num_frames": 9, "height": 64, "width": 64,
            "steps": 3, "guidance": 3.0, "mutation": "", "image": False, "reference": False, **json.loads(spec_text)}
    spec["model"] = spec["model"] or {"ltx": "ltx-tiny", "ltx2": "ltx2-tiny", "wan": "wan-tiny"}[spec["family"]]
    cuda = spec["device"] == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    device = f"cuda:{rank}" if cuda else "cpu"
    world = World(rank, size, rank, device, spec["split"], *degrees(spec["split"], size))
    family = family_of(spec["model"])
    dtype = torch.bfloat16 if cuda else torch.float32
    pipe = _pipeline(spec, "cuda" if cuda else "cpu", dtype)
    run = _runner(pipe, spec, device, dtype)
    unpatched = run()
    report = None
    if spec["config"].startswith("optimized"):
        # tuned_gemm off: the algorithm search (stored choices are off in the tests) would take most of a GPU test,
        # and the split's exactness does not depend on which GEMM algorithm runs
        settings = family.settings("bench e2e", model=spec["model"], weights="random", device=spec["device"],
                                   kernel_provider="cuda" if cuda else "reference", dtype="bf16" if cuda else "fp32",
                                   tuned_gemm=False,
                                   precision="fp8" if spec["config"].startswith("optimized-fp8") else "bf16")
        report = family.inject(pipe, settings)
    alone = run() if report is not None else unpatched  # the same configuration on this process alone
    if spec["mutation"] == "own-half":  # each guidance rank repeats its own half instead of gathering both
        split_module.SplitHook._gather = lambda self, tensor: torch.cat([tensor] * self.cfg_degree)
    calls = []
    original_split = split_module.SplitHook.split

    def counting_split(self, bound):
        part, gather = original_split(self, bound)
        hidden = part.get(self.tokens_of)
        calls.append(list(hidden.shape) if torch.is_tensor(hidden) else None)
        return part, gather

    split_module.SplitHook.split = counting_split
    exchanges = _count_exchanges(spec["mutation"] == "swapped-heads")
    gathers = _count_gathers(spec["mutation"] == "own-keys")
    if not cuda and spec["split"] == "cfg+ring":
        # diffusers' ring attention needs cuDNN's log-sum-exp, so the split refuses the CPU; our ring attention (one
        # attention over the gathered keys) does not: let it run, where it serves every ring attention (LTX-Video's
        # cfg+ring with our kernels; diffusers' ring attention, if reached, fails on the CPU)
        from ltxbench.parallel import context

        context._ring_backend = lambda transformer, local_attentions: None
    packs = _count_packs(report, spec["mutation"] == "scaled-packed-v")
    from ltxbench.models.video_phases import video_tokens

    # from the pipeline's own VAE factors and the transformer's patch, as the family's runs count them
    tokens = video_tokens(pipe, spec["num_frames"], spec["height"], spec["width"])
    plan = family.parallel_plan()
    if spec["mutation"] in ("local-keys", "local-self"):  # an attention over the split tokens on this rank's alone
        local = plan.local_attentions
        name = {"local-keys": "video_to_audio_attn", "local-self": "attn1"}[spec["mutation"]]

        def blocks(model):
            return model.blocks if spec["family"] == "wan" else model.transformer_blocks

        plan = dataclasses.replace(plan, local_attentions=lambda model: [
            *local(model), *(getattr(block, name) for block in blocks(model))])
    if spec["family"] == "wan":  # every denoiser (both experts of Wan 2.2 A14B)
        from ltxbench.models.wan_run import ParallelReports

        parallel = ParallelReports([parallelize(module, world, plan, tokens) for module in family.denoisers(pipe)])
    else:
        parallel = parallelize(pipe.transformer, world, plan, tokens)
    if spec["config"].endswith("compile"):
        pipe.transformer.compile(dynamic=False)
    before = _cache_counts(pipe.transformer)
    seen = _self_attention_tokens(pipe, family) if spec["family"] == "wan" else (set(), [])
    together = run()
    for handle in seen[1]:
        handle.remove()
    caches = {k: v - before[k] for k, v in _cache_counts(pipe.transformer).items()}
    description = parallel.as_dict()
    pipe.transformer._compiled_call_impl = None
    parallel.revert()
    again = run()
    if report is not None:
        report.revert()
    after = run()
    if rank == 0:
        result = {"error": (together - alone).abs().max().item() / alone.abs().max().item(),
                  "cosine": _agreement(together, alone)["cosine"],
                  "after_revert_equal": torch.equal(after, unpatched) and torch.equal(again, alone),
                  "alone_vs_unpatched": (alone - unpatched).abs().max().item() / unpatched.abs().max().item(),
                  "calls": calls, "parallel": description, "caches": caches, "exchanges": exchanges[0],
                  "gathers": gathers[0],
                  "packs": packs[0],
                  "hooks_left": _hooks_left(pipe.transformer), "self_attention_tokens": sorted(seen[0])}
        if spec["reference"]:  # the same weights in fp32 (bf16 values are exact in fp32): the math without rounding
            reference = _runner(pipe.to(torch.float32), spec, device, torch.float32)()
            result["vs_fp32"] = {name: _agreement(latents, reference) for name, latents in
                                 (("unpatched", unpatched), ("alone", alone), ("together", together))}
        with open(out, "w") as file:
            json.dump(result, file)
    rank_exit.leave()


def _self_attention_tokens(pipe, family) -> tuple[set, list]:
    """({token counts of the calls to block 0's attn1 in each denoiser}, the hooks that record them): how many
    tokens this rank's self-attention takes (below the split)."""
    seen = set()

    def record(module, args, kwargs):
        seen.add((args[0] if args else kwargs["hidden_states"]).shape[1])

    return seen, [denoiser.blocks[0].attn1.register_forward_pre_hook(record, with_kwargs=True)
                  for denoiser in family.denoisers(pipe)]


def _count_exchanges(swap_heads: bool) -> list:
    """[calls of our Ulysses attention (ltxbench.parallel.ulysses)]; swap_heads: its output exchange hands each
    rank the other ranks' heads in reverse order, which must fail the check."""
    from ltxbench.parallel import ulysses

    count, attention, exchange = [0], ulysses.exchanged_attention, ulysses.exchange

    def counting_attention(*args):
        if not torch.compiler.is_compiling():  # traced, the count would be a guard: a recompile at every call
            count[0] += 1
        return attention(*args)

    def swapped(tensor, group):
        out = exchange(tensor, group)
        return out.flip(0) if tensor.dim() == 4 else out  # the output's exchange: (ranks, tokens, heads, dim)

    ulysses.exchanged_attention = counting_attention
    if swap_heads:
        ulysses.exchange = swapped
    return count


def _count_gathers(own_keys: bool) -> list:
    """[calls of our ring attention (ltxbench.parallel.ring)]; own_keys: its all-gather hands back this rank's own
    keys and values in every slot, which must fail the check."""
    from ltxbench.parallel import ring

    count, attention, gather = [0], ring.attention, ring.gather

    def counting_attention(*args):
        if not torch.compiler.is_compiling():
            count[0] += 1
        return attention(*args)

    def own(tensor, group):
        return torch.cat([tensor] * gather(tensor, group).shape[0])

    ring.attention = counting_attention
    if own_keys:
        ring.gather = own
    return count


def _count_packs(report, scale_v: bool) -> list:
    """[calls of the provider's Ulysses send-buffer kernels (qk_rms_norm_rope_pack, LTX-Video's and LTX-2's
    interleaved RoPE; qk_rms_norm_rope_split_pack, LTX-2's split RoPE)]; scale_v: their v slot 1% too large, which
    must fail the check."""
    if report is None:
        return [0]
    from ltxbench import ops
    from ltxbench.ops import reference

    provider = ops if report.provider == "cuda" else reference
    count = [0]

    def counting(pack):
        def counting_pack(*args, **kwargs):
            if not torch.compiler.is_compiling():
                count[0] += 1
            out = pack(*args, **kwargs)
            if scale_v:
                out[..., 2, :] *= 1.01
            return out
        return counting_pack

    for name in ("qk_rms_norm_rope_pack", "qk_rms_norm_rope_split_pack"):
        setattr(provider, name, counting(getattr(provider, name)))
    return count


def _agreement(latents, reference) -> dict:
    latents, reference = latents.flatten().double(), reference.flatten().double()
    return {"cosine": torch.nn.functional.cosine_similarity(latents, reference, dim=0).item(),
            "relative_l2": ((latents - reference).norm() / reference.norm()).item()}


def _cache_counts(model) -> dict:
    """Builds and hits of the patched model's prompt key/value cache (LTX-Video's or LTX-2's; zeros unpatched)."""
    cache = vars(model).get("_ltxbench_cross_kv_cache") or vars(model).get("_ltxbench_text_kv_cache")
    return {"builds": getattr(cache, "builds", 0), "hits": getattr(cache, "hits", 0)}


def _hooks_left(model) -> list:
    """Modules that still carry a hook or an instance forward (diffusers' pipelines leave empty registries)."""
    return [name for name, module in model.named_modules()
            if "forward" in vars(module) or getattr(vars(module).get("_diffusers_hook"), "hooks", None)]


if __name__ == "__main__":
    main(*sys.argv[1:])
