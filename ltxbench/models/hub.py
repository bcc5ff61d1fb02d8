"""Where a video model comes from: its components' configs (the package's presets, a directory, the hub), pretrained
pipelines from the Hugging Face hub or a directory, and what to say when they are not there.

huggingface_hub's and diffusers' own messages run to paragraphs (and cut to one line, end mid-word): the user gets
one line in our words, saying where we looked and why the hub did not deliver.
"""

from __future__ import annotations

from pathlib import Path

from ltxbench.errors import EnvironmentProblem, UsageError

MODEL_FORMS = "a preset (ltx-2b, ltx-13b, ltx-tiny), a hub id (owner/name) or a pipeline directory"


def looks_like_path(model: str) -> bool:
    """A --model that names a file system path rather than a preset or a hub id (owner/name)."""
    return model.startswith(("/", "./", "../", "~")) or model.count("/") > 1 or "\\" in model


def no_such_directory(model: str, forms: str = MODEL_FORMS) -> UsageError:
    return UsageError(f"--model {model}: no such directory", hint=f"--model takes {forms}")


def pretrained_source(model: str, presets: dict, forms: str) -> str:
    """The hub id or directory that --weights pretrained loads for `model`, a preset of `presets` (preset -> (config
    dirs, hub id or None)) or a hub id or directory itself; UsageError where there is none."""
    if model in presets and presets[model][1] is None:
        raise UsageError(f"--model {model} has no pretrained weights", hint="use --weights random")
    source = presets[model][1] if model in presets else model
    if looks_like_path(source) and not Path(source).expanduser().is_dir():
        raise no_such_directory(source, forms)
    return source


def hub_reason(exc: BaseException) -> str:
    """Why the hub did not deliver, from the exception and its causes."""
    chain, seen = [], exc
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    names = {type(e).__name__ for e in chain}
    text = " ".join(str(e) for e in chain)
    if "GatedRepoError" in names or " 401 " in text or " 403 " in text:
        return "the repository is gated: it needs `hf auth login` with an account that accepted its terms"
    if "RepositoryNotFoundError" in names or " 404 " in text:
        return "the hub has no public repository of that name"
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE=1 forbids downloading them"
    return "the hub cannot be reached to download them"


def offline_error(model: str, exc: BaseException, configs_only: bool = False) -> EnvironmentProblem:
    """The hub did not deliver `model`'s weights, or (configs_only: --weights random of a hub id) its config files,
    whose hint then cannot be --weights random."""
    from huggingface_hub import constants

    if configs_only:
        return EnvironmentProblem(f"the config files of {model!r} are not in the Hugging Face cache "
                                  f"({constants.HF_HUB_CACHE}) and {hub_reason(exc)}",
                                  hint=f"download them where the hub is reachable (`hf download {model}`), or give "
                                  "--weights random a preset (see --help)")
    return EnvironmentProblem(f"weights for {model!r} are not in the Hugging Face cache ({constants.HF_HUB_CACHE}) "
                              f"and {hub_reason(exc)}",
                              hint=f"download them where the hub is reachable (`hf download {model}`), or use "
                              "--weights random to benchmark with random weights (no download)")


def dtype_keyword() -> str:
    """from_pretrained's dtype argument: `dtype` where diffusers has renamed it (its `torch_dtype` then warns that it
    is deprecated), `torch_dtype` in the releases before."""
    from diffusers.utils import deprecation_utils

    return "dtype" if hasattr(deprecation_utils, "_resolve_dtype") else "torch_dtype"


def load_ltx_pipeline(model: str, dtype, pipeline_class=None, forms: str = MODEL_FORMS):
    """`pipeline_class`.from_pretrained (LTXPipeline unless given, e.g. LTX2Pipeline) of a directory or hub id (on the
    CPU), every failure to find it in one line; `forms` is what --model takes, for the hint."""
    if pipeline_class is None:
        from diffusers import LTXPipeline as pipeline_class

    local = Path(model).expanduser()
    try:
        from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

        hub_errors: tuple = (HfHubHTTPError, OfflineModeIsEnabled)
    except ImportError:  # pragma: no cover - older huggingface_hub
        hub_errors = ()
    from diffusers.utils import logging as diffusers_logging

    verbosity = diffusers_logging.get_verbosity()
    diffusers_logging.set_verbosity_error()  # its "Couldn't connect to the Hub ... will try the cache" lines
    try:
        return pipeline_class.from_pretrained(str(local) if local.is_dir() else model, **{dtype_keyword(): dtype})
    except (OSError, ConnectionError, *hub_errors) as exc:
        raise offline_error(model, exc) from exc
    except ValueError as exc:
        if "valid repo id" not in str(exc):
            raise
        raise UsageError(f"--model {model} is neither a local directory nor a valid hub id",
                         hint=f"--model takes {forms}") from exc
    finally:
        diffusers_logging.set_verbosity(verbosity)


def packaged_component_configs(root: Path, folders, components, model: str, optional=()) -> dict[str, dict]:
    """A preset's configs from the package's `root` (configs/<family>): `<folder>/<component>.json` of each of
    `components` and of the `optional` ones, later folders overriding earlier ones. EnvironmentProblem where one of
    `components` is missing: the package's own files, an incomplete installation, not the user's arguments."""
    import json

    found = {comp: json.loads((root / sub / f"{comp}.json").read_text())
             for sub in folders for comp in (*components, *optional) if (root / sub / f"{comp}.json").is_file()}
    if missing := [comp for comp in components if comp not in found]:
        raise EnvironmentProblem(f"the installed ltxbench lacks the {', '.join(missing)} config of {model} "
                                 f"(looked in {root})", hint="reinstall ltxbench")
    return found


def directory_component_configs(root: Path, model: str, components, config_file) -> dict[str, dict]:
    """The config of each of `components` in the directory `root` (`model` as given): `<component>.json` (the
    configs/ layout) or `<component>/<config_file(component)>` (diffusers'); UsageError naming the first missing."""
    import json

    configs = {}
    for comp in components:
        candidates = [path for path in (root / f"{comp}.json", root / comp / config_file(comp)) if path.is_file()]
        if not candidates:
            raise UsageError(f"{model} has no config for {comp} ({comp}.json or {comp}/{config_file(comp)})")
        configs[comp] = json.loads(candidates[0].read_text())
    return configs


def hub_component_configs(model: str, components, config_file, forms: str) -> dict[str, dict]:
    """The config of each of `components` of `model` taken as a hub id (config_file(component): its file name in the
    component's folder), from the local cache when offline: only those small files are read. A path that does not
    exist is refused first (no_such_directory, naming `forms`); any hub, network or cache failure is offline_error."""
    import json
    from pathlib import Path

    if looks_like_path(model):
        raise no_such_directory(model, forms)
    try:
        from huggingface_hub import hf_hub_download

        return {comp: json.loads(Path(hf_hub_download(model, config_file(comp), subfolder=comp)).read_text())
                for comp in components}
    except Exception as exc:  # noqa: BLE001 - any hub/network/cache failure means "not here"
        raise offline_error(model, exc, configs_only=True) from exc  # only --weights random reads them
