"""Whether two result documents can be compared at all, before any record is: the same benchmark kind, GPU count and
split, workload (model, shape settings, precision), FP8 accumulation and GPU model (docs/compare.md), and a complete
base."""

from __future__ import annotations

from ltxbench.configurations import MEMORY_BUDGET
from ltxbench.errors import IncomparableResults
from ltxbench.results.schema import incomplete


def gpu_name(doc: dict) -> str:
    """Name of the first GPU in the document's env, or 'cpu' when it recorded none."""
    env = doc.get("env") if isinstance(doc.get("env"), dict) else {}
    gpus = env.get("gpus")
    if isinstance(gpus, list) and gpus and isinstance(gpus[0], dict) and gpus[0].get("name"):
        return str(gpus[0]["name"])
    return "cpu"


def world_of(doc: dict) -> tuple[int, str | None]:
    """(world size, split) of the run: (1, None) for a one-process run (no `parallel` entry in run.config)."""
    config = doc.get("run", {}).get("config")
    parallel = config.get("parallel") if isinstance(config, dict) else None
    if not isinstance(parallel, dict):
        return 1, None
    size = parallel.get("world_size")
    return (size if isinstance(size, int) and not isinstance(size, bool) else 1), parallel.get("split")


def fp8_accumulation_of(doc: dict) -> str | None:
    """How the run's FP8 GEMMs accumulated (fp32 in files from before --fp8-accumulation); None: no FP8 precision."""
    config = doc.get("run", {}).get("config")
    if not isinstance(config, dict):
        return None
    return config.get("fp8_accumulation") or ("fp32" if config.get("precision", "bf16") != "bf16" else None)


# run.config settings that change what every configuration computes (the records' dtype, the FP8 configurations)
RUN_SETTINGS = ("precision", "dtype")


def _shared_params(doc: dict) -> dict:
    """The parameters every record of the document carries with one value: the run's model, family and shape
    settings (bench e2e, profile, generate); {} where the records differ in all of them (bench micro's shapes)."""
    params = [r["params"] for r in doc.get("records", ()) if isinstance(r, dict) and isinstance(r.get("params"), dict)]
    if not params:
        return {}
    return {k: v for k, v in params[0].items() if all(k in p and p[k] == v for p in params[1:])}


def workload_differences(base_doc: dict, new_doc: dict) -> list[str]:
    """What the two runs measured differently, as "model ltx-2b vs llama-3-8b": a parameter every record of each run
    carries with another value (so that no record could match), or a setting of RUN_SETTINGS. Settings one file
    lacks (written before they were recorded) are not compared, but for --precision (bf16 before it existed)."""
    configs = [d.get("run", {}).get("config") for d in (base_doc, new_doc)]
    # files from before --precision ran bf16 (as fp8_accumulation_of reads them)
    configs = [{"precision": "bf16", **c} if isinstance(c, dict) else {} for c in configs]
    differ = [(k, configs[0][k], configs[1][k]) for k in RUN_SETTINGS
              if k in configs[0] and k in configs[1] and configs[0][k] != configs[1][k]]
    base, new = _shared_params(base_doc), _shared_params(new_doc)
    for params, other, other_doc in ((base, new, new_doc), (new, base, base_doc)):  # no budget is a setting too
        if MEMORY_BUDGET in params and MEMORY_BUDGET not in other and not _any_record_has(other_doc, MEMORY_BUDGET):
            other[MEMORY_BUDGET] = None
    keys = sorted((k for k in base if k in new and base[k] != new[k]), key=lambda k: (k != "model", k))
    if "model" in keys and "family" in keys:  # another model's family says nothing more
        keys.remove("family")
    differ = [(k, base[k], new[k]) for k in keys] + [d for d in differ if d[0] not in keys]
    return [f"{key} {_text(a)} vs {_text(b)}" for key, a, b in differ]


def _any_record_has(doc: dict, key: str) -> bool:
    return any(isinstance(r, dict) and key in (r.get("params") or {}) for r in doc.get("records", ()))


def _text(value) -> str:
    if value is None:
        return "none"
    return ",".join(map(str, value)) if isinstance(value, list | tuple) else str(value)


def _world_text(world: tuple[int, str | None]) -> str:
    size, split = world
    return f"{size} GPU" + ("s" if size != 1 else "") + (f" (split {split})" if split else "")


def torch_version(doc: dict) -> str | None:
    env = doc.get("env") if isinstance(doc.get("env"), dict) else {}
    versions = env.get("versions") if isinstance(env.get("versions"), dict) else {}
    return versions.get("torch")


def check(base_doc: dict, new_doc: dict, allow_env_mismatch: bool, warnings: list[str]) -> None:
    """IncomparableResults (exit 3) where the two runs measured different things; what differs without making them
    so (another torch, the new run cut short, another GPU under --allow-env-mismatch) appended to `warnings`."""
    cut_short = incomplete(base_doc)
    if cut_short:
        raise IncomparableResults(f"the base result is incomplete ({cut_short.get('reason', 'cut short')}; not "
                                  f"measured: {', '.join(cut_short.get('not_measured', [])) or '?'}): not a baseline",
                                  hint="compare against a complete run")
    new_cut_short = incomplete(new_doc)
    if new_cut_short:
        warnings.append(f"the new result is incomplete ({new_cut_short.get('reason', 'cut short')}): "
                        "what it did not measure is listed as missing")
    if base_doc["kind"] != new_doc["kind"]:
        raise IncomparableResults(
            f"cannot compare a {base_doc['kind']!r} result with a {new_doc['kind']!r} result",
            hint="compare two runs of the same benchmark kind (--allow-env-mismatch does not cover this)",
        )
    base_world, new_world = world_of(base_doc), world_of(new_doc)
    if base_world != new_world:
        raise IncomparableResults(
            f"base ran on {_world_text(base_world)}, new on {_world_text(new_world)}: not comparable",
            hint="compare runs over the same --gpus and --parallel (--allow-env-mismatch does not cover this)")
    differences = workload_differences(base_doc, new_doc)
    if differences:
        raise IncomparableResults(
            f"not comparable: {'; '.join(differences)}",
            hint="compare two runs of the same model and settings (--allow-env-mismatch does not cover this)")
    base_sum, new_sum = fp8_accumulation_of(base_doc), fp8_accumulation_of(new_doc)
    if None not in (base_sum, new_sum) and base_sum != new_sum:
        raise IncomparableResults(
            f"base's FP8 GEMMs accumulated {base_sum}, new's {new_sum}: not comparable",
            hint="compare runs with the same --fp8-accumulation (--allow-env-mismatch does not cover this)")
    base_gpu, new_gpu = gpu_name(base_doc), gpu_name(new_doc)
    if base_gpu != new_gpu:
        msg = f"results come from different GPUs: base {base_gpu!r}, new {new_gpu!r}"
        if not allow_env_mismatch:
            raise IncomparableResults(msg, hint="compare runs from the same GPU, or pass --allow-env-mismatch")
        warnings.append(msg + " (compared anyway: --allow-env-mismatch)")
    base_torch, new_torch = torch_version(base_doc), torch_version(new_doc)
    if base_torch != new_torch:
        warnings.append(f"torch versions differ: base {base_torch}, new {new_torch}")
