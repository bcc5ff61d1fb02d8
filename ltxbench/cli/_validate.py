"""Argument checks shared by the commands: one wording for each kind of bad value, all before torch loads.

Only the standard library and ltxbench.errors here (the commands' help must stay instant)."""

from __future__ import annotations

import importlib.util
import os

from ltxbench.errors import EnvironmentProblem, UsageError

OVERWRITE_HINT = "pass --force to overwrite, or choose another --output"


def choice(flag: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise UsageError(f"{flag} {value!r} is not one of {', '.join(allowed)}")
    return value


def runtime(device: str, kernel_provider: str | None, dtype: str | None, *, kernels_used: bool = True,
            cpu_hint: str = "use --kernel-provider reference on the CPU") -> tuple[str, str]:
    """(provider, dtype) for --device: provider cuda on cuda, reference on cpu; bf16 on cuda, fp32 on cpu.
    Asking for the cuda kernels on the CPU is a usage error (when kernels are used at all)."""
    choice("--device", device, ("cuda", "cpu"))
    provider = choice("--kernel-provider", kernel_provider or ("cuda" if device == "cuda" else "reference"),
                      ("cuda", "reference"))
    if kernels_used and provider == "cuda" and device == "cpu":
        raise UsageError("--kernel-provider cuda needs --device cuda (got --device cpu)", hint=cpu_hint)
    return provider, choice("--dtype", dtype or ("bf16" if device == "cuda" else "fp32"), ("bf16", "fp16", "fp32"))


def refuse_existing(paths, hint: str = OVERWRITE_HINT) -> None:
    """Never overwrite silently: the first of `paths` that exists is a usage error (unless --force)."""
    for path in paths:
        if path.exists():
            raise UsageError(f"{path} already exists; not overwriting it", hint=hint)


def check_outputs(paths, force: bool, hint: str = OVERWRITE_HINT) -> None:
    """Before any work: every output's folder exists or can be made (no file in the way, writable), and unless
    --force none of the outputs exists, so a finished run never fails at its last step."""
    for path in paths:
        if path.is_dir():  # even with --force: a folder is not replaced by a file
            raise UsageError(f"cannot write {path}: it is a folder", hint="name a file in it, or another path")
        for folder in path.parents:
            if folder.exists():
                if not folder.is_dir():
                    raise UsageError(f"cannot write {path}: {folder} is a file, not a folder")
                if not os.access(folder, os.W_OK | os.X_OK) or not _can_create_in(folder):
                    raise UsageError(f"cannot write {path}: the folder {folder} is not writable")
                break
    if not force:
        refuse_existing(paths, hint)


def _can_create_in(folder) -> bool:
    """Whether a file can really be created in `folder`: os.access says yes for root in /proc or on a read-only
    mount, where the write then fails after the whole run."""
    import tempfile

    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".ltxbench-probe-"):
            return True
    except OSError:
        return False


def known_model(model: str, weights: str | None) -> None:
    """Refuse at once a --model that is no preset, no existing path and no hub id (owner/name) where it is a near
    miss of a preset (`ltx-tiy`: not a hub lookup that fails after its retries), or where --weights random needs a
    preset's config (a hub id's or a directory's serve too)."""
    import difflib
    from pathlib import Path

    from ltxbench.models import presets
    from ltxbench.models.hub import looks_like_path

    names = list(presets())
    path = Path(model).expanduser()
    if model in names or "/" in model or looks_like_path(model) or path.suffix == ".json" or path.exists():
        return  # a hub id, or a path: model_and_weights says when it does not exist
    close = difflib.get_close_matches(model.lower(), names, n=1)
    if close:
        raise UsageError(f"unknown model {model!r}; did you mean {close[0]}?",
                         hint=f"--model takes a preset ({', '.join(names)}), a hub id (owner/name) or a local path")
    if weights == "random":
        raise UsageError(f"unknown model {model!r}: --weights random builds a preset's config",
                         hint=f"choose a preset ({', '.join(names)}), a hub id (owner/name) or a local directory")


def model_and_weights(model: str, weights: str | None) -> str:
    """--weights for --model, before anything loads: a path that does not exist is a usage error; --weights defaults
    to random for the presets that only exist with random weights (ltx-tiny, llama-tiny), else to pretrained, and
    pretrained for such a preset is a usage error."""
    from pathlib import Path

    from ltxbench.models import family_of
    from ltxbench.models.hub import looks_like_path

    path = Path(model).expanduser()
    if (looks_like_path(model) or path.suffix == ".json") and not path.exists():
        raise UsageError(f"--model {model}: no such {'file' if path.suffix == '.json' else 'directory'}",
                         hint="--model takes a preset (see --help), a hub id (owner/name) or an existing path")
    random_only = family_of(model).random_only(model)
    if weights is None:
        return "random" if random_only else "pretrained"
    choice("--weights", weights, ("pretrained", "random"))
    if random_only and weights == "pretrained":
        raise UsageError(f"--model {model} has no pretrained weights: it only exists with random weights",
                         hint="pass --weights random, or leave --weights out")
    return weights


def prompt_text(flag: str, text: str | None) -> str | None:
    """A prompt that says something: an empty or blank one is a usage error, never a silent empty conditioning."""
    if text is not None and not text.strip():
        raise UsageError(f"{flag} is empty", hint=f"give {flag} some text, e.g. {flag} \"a red fox in the snow\"")
    return text


def not_a_folder(flag: str, value: str | None, example: str) -> None:
    """An output that names an existing folder is a usage error: the files would go beside it, under its name."""
    from pathlib import Path

    if value is not None and Path(value).is_dir():
        raise UsageError(f"{flag} {value} is a directory; give a file path",
                         hint=f"e.g. {flag} {Path(value) / example}")


PLOT_SUFFIXES = (".png", ".svg", ".pdf")  # what the plots are saved as, by the name's suffix (matplotlib's savefig)


def check_plot(plot: str | None) -> None:
    """--plot names a file of a format the plots are written in, and matplotlib is there to draw it: refused before
    the run, never after it."""
    from pathlib import Path

    if plot is None:
        return
    not_a_folder("--plot", plot, "plot.png")
    if Path(plot).suffix.lower() not in PLOT_SUFFIXES:
        raise UsageError(f"--plot {plot} must end in {', '.join(PLOT_SUFFIXES[:-1])} or {PLOT_SUFFIXES[-1]}")
    require_matplotlib()


def result_outputs(output: str | None, plot: str | None) -> list:
    """The files a benchmark writes for --output (JSON and CSV; none for the default, a fresh name) and --plot, once
    neither names a folder and --plot names a format it can be drawn in."""
    from pathlib import Path

    from ltxbench.results.io import result_paths

    not_a_folder("--output", output, "run.json")
    check_plot(plot)
    return [*(result_paths(output) if output is not None else ()), *([Path(plot)] if plot is not None else [])]


def require_matplotlib() -> None:
    if importlib.util.find_spec("matplotlib") is None:
        raise EnvironmentProblem("--plot needs matplotlib, which is not installed",
                                 hint="pip install matplotlib (a dependency of ltxbench: reinstall it), or drop --plot")


def require_mp4_writer(output, audio: bool) -> None:
    """Before the model is built: the mp4 can be written. diffusers' export_to_video writes through imageio's ffmpeg
    plugin (imageio-ffmpeg), or through OpenCV where imageio is not installed at all; an audio track is muxed by
    imageio-ffmpeg's ffmpeg."""
    try:
        import imageio_ffmpeg

        imageio_ffmpeg.get_ffmpeg_exe()  # RuntimeError when it finds no ffmpeg binary
        return
    except (ImportError, RuntimeError) as exc:
        reason = "imageio-ffmpeg is not installed" if isinstance(exc, ImportError) else "imageio-ffmpeg finds no ffmpeg"
    if not audio and importlib.util.find_spec("imageio") is None and importlib.util.find_spec("cv2") is not None:
        return  # diffusers' OpenCV fallback
    raise EnvironmentProblem(f"cannot write the mp4 {output}: {reason}",
                             hint="pip install imageio-ffmpeg (a dependency of ltxbench: reinstall it)")


def memory_budget(family, settings, cpu_offload: bool = False) -> None:
    """--memory-budget: a video family that plans it (LTX-Video, LTX-2, Wan), on one CUDA GPU, without another way of
    placing the weights and without CUDA graphs (the streamed blocks' loads run between graph replays)."""
    from ltxbench.configurations import CUDA_GRAPH_MODES

    budget = settings.memory_budget_gib
    if budget is None:
        return
    flag = f"--memory-budget {budget:g}"
    if not getattr(family, "memory_stacks", None):
        raise UsageError(f"{flag} applies to the LTX-Video, LTX-2 and Wan models, not {family.title}",
                         hint="drop --memory-budget")
    if settings.device != "cuda":
        raise UsageError(f"{flag} needs --device cuda (it budgets GPU memory)")
    if settings.gpus > 1:
        raise UsageError(f"{flag} runs on one GPU: drop it, or --gpus {settings.gpus}")
    if cpu_offload:
        raise UsageError(f"{flag} and --cpu-offload both place the weights: choose one",
                         hint="--memory-budget streams the blocks it cannot hold; --cpu-offload moves whole models")
    if settings.compile_mode in CUDA_GRAPH_MODES:
        raise UsageError(f"{flag} with --compile-mode {settings.compile_mode} (CUDA graphs) is not supported",
                         hint="streamed blocks load between the kernels a graph would replay: use --compile-mode "
                              "default or max-autotune-no-cudagraphs")


def attention_installed(family, settings) -> None:
    """The attention kernels the run asks for, before the model is built (exit 4 where none imports, not after the
    build): FlashAttention-3 for --attention-backend fa3 or a configuration's @fa3; an FP8 attention backend where
    the run takes FP8 attention (--precision fp8-attention, or an optimized-fp8-attention configuration), exit 2 where
    it refuses a preset's head dim (read from its shipped config; other models are checked at injection)."""
    from ltxbench.configurations import Configuration
    from ltxbench.inject.attention_backend import FA3, check_name, require_flash_attention_3

    names = {Configuration(c).attention for c in settings.configs or ()}
    for name in sorted((names | {getattr(settings, "attention_backend", None)}) - {None}):
        check_name(name)
        if name == FA3:
            require_flash_attention_3(FA3, settings.dtype)
    if settings.precision == "fp8-attention" or any(Configuration(c).precision == "fp8-attention"
                                                    for c in settings.configs or ()):
        from ltxbench.inject.fp8_attention import fp8_attention

        backend = fp8_attention(settings.kernel_provider or "cuda")
        builder = getattr(family, "builder", None)
        if builder is not None and settings.model in family.presets:
            head_dim = builder.component_configs(settings.model)["transformer"].get("attention_head_dim")
            if isinstance(head_dim, int):
                backend.require(head_dim)
