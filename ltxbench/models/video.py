"""The video families' common behaviour (LTX-Video, LTX-2, Wan): `VideoFamily`, one iteration = one generation
timed per phase (ltxbench.models.video_phases), its configurations applied (attention backend, patch, split), its
records and profile. With --image (image-to-video) the family runs diffusers' image-to-video pipeline on the same
components: the image is read once, outside the phases; its VAE encode is part of the pipeline's set-up (step 0).
Only the standard library at top level.
"""

from __future__ import annotations

from types import ModuleType
from typing import ClassVar

from ltxbench.configurations import CUDA_GRAPH_MODES, Configuration
from ltxbench.models.family import ModelFamily, PeerConfig
from ltxbench.models.video_image import to_image_to_video, validate_image
from ltxbench.models.video_peers import OFFLOADS
from ltxbench.models.video_phases import video_tokens


# --- the video families' common behaviour ------------------------------------------------------------------------
class VideoFamily(ModelFamily):
    """What LTX-Video and LTX-2 share: a diffusers text-to-video pipeline (image-to-video with --image), its
    transformer compiled, one iteration = one generation timed per phase, the records and the profile of those
    phases. A subclass names its decodes, its image-to-video class and its guidance options, and implements
    its builder module, and implements encode and iteration (+ inject, claims)."""

    makes_video = True
    decodes: ClassVar[tuple[str, ...]] = ("vae_decode",)  # timed after the loop, in order; "vae_decode" is the video
    image_to_video: ClassVar[str]                          # diffusers' image-to-video pipeline class
    builder_module: ClassVar[str]  # its models/<family>_build module: validate_video_args, build_pipeline
    guidance: ClassVar[tuple[str, ...]] = ("guidance_scale",)  # settings that must not be negative
    # --memory-budget (ltxbench.memory): component -> its stack of layers that can stream; parts left on the host
    memory_stacks: ClassVar[dict[str, str]] = {}
    memory_host_only: ClassVar[tuple[str, ...]] = ()
    text_tokens: ClassVar[int] = 0  # the prompt length the text encoder runs
    # the blocks' text cross-attentions, whose keys/values our kernels keep for a generation; per guided call, the
    # prompt rows they keep beyond the guidance batch's (LTX-2: the positive half, for its STG and modality passes)
    text_attentions: ClassVar[tuple[str, ...]] = ("attn2",)
    text_kv_extra_rows: ClassVar[int] = 0
    decode_frames: ClassVar[int | None] = None  # frames a VAE decode holds at once (None: all of them)

    @property
    def builder(self) -> ModuleType:
        """The family's build module, imported when a run of this family first needs it (a run of another family
        never loads it, so editing it leaves their stored results current)."""
        import importlib

        return importlib.import_module(self.builder_module)

    # --- what a video family implements ---
    def encode(self, pipe, settings, device):
        """The prompt embeddings, as the pipeline's encode_prompt returns them."""
        raise NotImplementedError

    def iteration(self, pipe, settings, embeds=None, phase=None, on_step=None) -> tuple[dict, dict]:
        """One timed generation (timed_generation): (timings, {decode name: output})."""
        raise NotImplementedError

    def before_configs(self, pipe, settings, embeds, log):
        """Untimed work before the first configuration. Returns None, or a function called after the last one whose
        dict joins the optimized configurations' injection reports."""
        return None

    def audio(self, pipe, outputs: dict):
        """The audio track of a generation, (waveform (channels, n), sample rate), or None."""
        return None

    def settings_for(self, settings, config: str):
        """The run settings of configuration `config` (a peer may change the pipeline's arguments)."""
        return settings

    # --- the ModelFamily interface, for every video family ---
    def validate(self, settings, command: str) -> None:
        from ltxbench.errors import UsageError

        self.validate_shape(settings)
        for name in self.guidance:
            if getattr(settings, name) < 0:
                raise UsageError(f"--{name.replace('_', '-')} {getattr(settings, name)} must not be negative")
        if settings.frame_rate < 1:
            raise UsageError(f"--frame-rate {settings.frame_rate} must be at least 1")
        validate_image(settings.image)
        from ltxbench.inject import attention_backend

        attention_backend.validate(settings.attention_backend, settings.dtype, settings.device, settings.gpus,
                                   settings.precision, settings.configs)
        own = {c.attention: c for c in map(Configuration, settings.configs or ()) if c.attention}
        if own and settings.attention_backend is not None:
            raise UsageError(f"--attention-backend {settings.attention_backend} sets every configuration's attention, "
                             f"and --configs names {next(iter(own.values()))}", hint="choose one of them")
        for name, config in own.items():  # a configuration's own: fp8-attention ones cannot take it (Configuration)
            attention_backend.validate(name, settings.dtype, settings.device, settings.gpus, "bf16",
                                       flag=f"--configs {config}")
        offloads = [c for c in map(Configuration, settings.configs or ()) if c.peer in OFFLOADS]
        if offloads and settings.gpus > 1:
            raise UsageError(f"--configs {offloads[0]}: diffusers' offloading runs on one GPU, not --gpus "
                             f"{settings.gpus}", hint="drop it, or run on one GPU")
        if any(c.compiled for c in offloads) and settings.compile_mode in CUDA_GRAPH_MODES:
            raise UsageError(f"--configs {next(c for c in offloads if c.compiled)} with --compile-mode "
                             f"{settings.compile_mode} (CUDA graphs) is not supported",
                             hint="diffusers moves the weights between the kernels a graph would replay")

    def validate_shape(self, settings) -> None:
        """Frames, height, width and steps the family's pipeline takes as they are (UsageError naming the value)."""
        self.builder.validate_video_args(settings.num_frames, settings.height, settings.width, settings.steps)

    def build(self, settings):
        from ltxbench.models.family import torch_dtype

        pipe = self.builder.build_pipeline(settings.model, settings.weights, settings.device,
                                           torch_dtype(settings.dtype), settings.seed)
        return pipe if settings.image is None else to_image_to_video(pipe, self.image_to_video)

    def denoisers(self, pipe) -> list:
        """The pipeline's denoising modules, each compiled, patched and counted: its transformer (Wan 2.2 A14B: both
        experts)."""
        return [pipe.transformer]

    def compiled_modules(self, pipe) -> list:
        return self.denoisers(pipe)

    def set_attention(self, pipe, settings, log=None) -> dict | None:
        """--attention-backend on every denoiser (ltxbench.inject.attention_backend): set before any configuration,
        so the unpatched model and ours attend with the same kernel."""
        if settings.attention_backend is None:
            return None
        from ltxbench.inject import attention_backend

        if settings.attention_backend == attention_backend.AUTO:
            return self.measured_attention(pipe, settings, log).info
        return attention_backend.apply(self.denoisers(pipe), settings.attention_backend, settings.dtype)

    def measured_attention(self, pipe, settings, log=None):
        """`auto`: each attention of the denoisers on the backend measured fastest at its shape, captured in a short
        untimed run of the pipeline (ltxbench.inject.attention_auto); an AttentionChoice (revertible)."""
        import dataclasses

        from ltxbench.inject import attention_auto

        short = dataclasses.replace(settings, steps=attention_auto.CAPTURE_STEPS)
        return attention_auto.choose(self.denoisers(pipe), lambda: self.iteration(pipe, short),
                                     log=log or (lambda _: None), device=str(pipe._execution_device))

    def peers(self) -> dict[str, PeerConfig]:
        """diffusers' offloading (models.video_peers): group offloading and model CPU offload."""
        from ltxbench.models import video_peers

        return {video_peers.GROUP_OFFLOAD: PeerConfig(video_peers.GROUP_OFFLOAD, video_peers.apply_group_offload),
                video_peers.MODEL_OFFLOAD: PeerConfig(video_peers.MODEL_OFFLOAD, video_peers.apply_model_offload)}

    # compile@fa3, optimized+compile@auto, ...: FlashAttention-3, or the measured choice, for that configuration
    attentions = ("fa3", "auto")

    # --- several GPUs (ltxbench.parallel) ---
    supports_parallel = True

    def parallel_plan(self):
        """This family's ParallelPlan (ltxbench.parallel)."""
        raise NotImplementedError

    def tokens(self, pipe, settings) -> int:
        """Video tokens of a generation, from the pipeline's VAE and patch sizes (video_tokens)."""
        return video_tokens(pipe, settings.num_frames, settings.height, settings.width)

    def parallelize(self, pipe, settings):
        """The run's split (launch.current_world) applied to the transformer, after the injection; its report."""
        from ltxbench.parallel.launch import current_world
        from ltxbench.parallel.plan import parallelize

        return parallelize(pipe.transformer, current_world(), self.parallel_plan(), self.tokens(pipe, settings))

    def inject_placed(self, pipe, settings):
        """inject(); under --memory-budget with the streamers uninstalled around it, and its revert likewise."""
        from ltxbench.memory.apply import placed

        return placed(pipe, lambda: self.inject(pipe, settings))

    def apply_config(self, target, settings, config: str):
        """The configuration's own attention backend (<config>@<attention>: set first, so that ours copies it into the
        processors it installs; reverted last), its patch (ours under --memory-budget: with the streamers
        uninstalled around it), then, in a parallel run, the split on top (reverted first)."""
        attention = Configuration(config).attention
        if attention is None:
            return self._apply_config(target, settings, config)
        from ltxbench.inject import attention_backend

        if attention == attention_backend.AUTO:  # measured now, on the unpatched model: before the warmups
            choice = self.measured_attention(target, settings)
        else:
            choice = attention_backend.choose(self.denoisers(target), attention, settings.dtype)
        try:
            return choice.around(self._apply_config(target, settings, config))
        except BaseException:
            choice.revert()
            raise

    def _apply_config(self, target, settings, config: str):
        from ltxbench.memory.apply import placed
        from ltxbench.parallel.launch import current_world

        if Configuration(config).ours:
            report = placed(target, lambda: ModelFamily.apply_config(self, target, settings, config))
        else:
            report = super().apply_config(target, settings, config)
        if current_world() is None:
            return report
        return _WithParallel(report, self.parallelize(target, settings), config)

    def prepare(self, pipe, settings):
        """Quiet progress bars; the prompt embeddings once for --phase transformer (None: each iteration encodes)."""
        import torch

        pipe.set_progress_bar_config(disable=True)
        if settings.phase != "transformer":
            return None
        with torch.no_grad():
            return self.encode(pipe, settings, pipe._execution_device)

    def bench(self, pipe, settings, log) -> dict:
        from ltxbench.bench.e2e import run_configs
        from ltxbench.bench.flops import video_step
        from ltxbench.memory.apply import budget_enforcer

        embeds = self.prepare(pipe, settings)
        after = self.before_configs(pipe, settings, embeds, log)
        errors = self.precision_errors(pipe, settings, embeds, log)
        results = run_configs(self.denoisers(pipe), settings.configs, lambda c: self.apply_config(pipe, settings, c),
                              lambda c: self.iteration(pipe, self.settings_for(settings, c), embeds)[0],
                              settings.warmup,
                              settings.repeats, pipe._execution_device, log, settings.compile_mode, settings.rounds,
                              compile_scope=settings.compile_scope, warmed_up=budget_enforcer(pipe, log),
                              unit_flops=video_step, budget_gib=settings.memory_budget_gib,
                              work=lambda c: repr(self.settings_for(settings, c)))  # stg-off: no STG pass
        extra = after() if after is not None else {}
        for name, res in results.items():
            if Configuration(name).ours:
                res["injection"].update(extra)
        for precision, error in errors.items():  # one measurement each, under the precision's first configuration
            results[next(n for n in results if Configuration(n).precision == precision)]["precision_error"] = error
        return results

    def precision_errors(self, pipe, settings, embeds, log) -> dict:
        """{precision: its error on one transformer step (bench.precision_error)} for each FP8 precision among the
        configurations, measured before the timed runs on one GPU; {} otherwise."""
        import dataclasses

        from ltxbench.parallel.launch import current_world

        precisions = list(dict.fromkeys(c.precision for c in map(Configuration, settings.configs)
                                        if c.precision != "bf16"))
        if not precisions or current_world() is not None:
            return {}
        from ltxbench.bench import precision_error

        errors = {}
        for precision in precisions:
            errors[precision] = precision_error.measure(
                pipe, lambda p: self.inject_placed(pipe, dataclasses.replace(settings, precision=p)),
                lambda: self.iteration(pipe, settings, embeds), log, run_full=lambda: self.iteration(pipe, settings),
                precision=precision)
            log(precision_error.summary(errors[precision]))
        return errors

    def records(self, results: dict, params: dict, settings) -> list[dict]:
        from ltxbench.bench.e2e_report import phase_records

        phases = (("text_encode", "text_encode_ms"), ("denoise_step", "step_ms"),
                  *((name, f"{name}_ms") for name in self.decodes), ("total", "total_ms"))
        from ltxbench.bench.precision_error import error_records

        return (phase_records(results, params, settings.dtype, phases, step="denoise_step", rate="transformer_it_s")
                + error_records(results, params))

    def plot_parts(self, records) -> list[str]:
        return ["text_encode", "denoise_step", *self.decodes]

    def profile(self, pipe, settings, traces: dict, log) -> dict:
        from ltxbench.bench.profile import phase, profile_configs

        embeds = self.prepare(pipe, settings)
        cuda = str(pipe._execution_device).startswith("cuda")
        applied = {}  # the configuration profile_configs applied last: its run settings (settings_for)

        def apply(config):
            applied["settings"] = self.settings_for(settings, config)
            return self.apply_config(pipe, settings, config)

        results = profile_configs(self.denoisers(pipe), settings.configs, apply,
                                  lambda: self.iteration(pipe, applied["settings"], embeds,
                                                         phase=lambda name: phase(name, cuda)),
                                  pipe._execution_device, traces, settings.top, log, settings.compile_mode,
                                  compile_scope=settings.compile_scope,
                                  work=lambda c: repr(self.settings_for(settings, c)))  # stg-off: no STG pass
        return results

    def bench_argv(self, settings) -> list[str]:
        flags = [a for name in self.guidance for a in (f"--{name.replace('_', '-')}", str(getattr(settings, name)))]
        return ["--steps", "2", "--num-frames", str(settings.num_frames), "--height", str(settings.height),
                "--width", str(settings.width), "--phase", settings.phase or "all", *flags,
                *(["--image", settings.image] if settings.image is not None else [])]

    def generate(self, pipe, settings, on_step=None):
        """One video as users run it: (frames: list of HxWx3 float arrays in [0, 1], timings with peak memory, the
        audio track or None)."""
        import torch

        pipe.set_progress_bar_config(disable=True)
        device = torch.device(pipe._execution_device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        timings, outputs = self.iteration(pipe, settings, on_step=on_step)
        timings["peak_memory_bytes"] = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        frames = pipe.video_processor.postprocess_video(outputs["vae_decode"].float(), output_type="np")[0]
        return list(frames), timings, self.audio(pipe, outputs)


class _WithParallel:
    """A configuration's report (None for baseline / compile) with a parallel run's split: reverted split first;
    the injection dict gains a `parallel` entry."""

    def __init__(self, report, parallel, config: str):
        self.report, self.parallel, self.config = report, parallel, config

    def revert(self) -> None:
        self.parallel.revert()
        if self.report is not None:
            self.report.revert()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.revert()

    def as_dict(self) -> dict:
        base = (self.report.as_dict() if self.report is not None
                else {"applied": False, "reason": f"config {self.config}"})
        return {**base, "parallel": self.parallel.as_dict()}

    def outcomes(self) -> dict:
        from ltxbench.inject import outcomes_of

        return outcomes_of(self.report)
