"""`ops.linear`'s GEMM choices kept across processes: one JSON file per GPU model.

The search (cuda/gemm.cpp) costs 10-55 s per process for LTX-2B (H100, H200); its choices depend only on the GPU, the
problem and the cuBLASLt version. `load` hands the stored records to the extension, which keeps each one only
if it is from this cuBLASLt version and `cublasLtMatmulAlgoCheck` accepts it on this GPU; the first `load` of a
process registers `save` to run at exit, which merges the process's searched choices into the file (written to
a temporary file and renamed, so a reader never sees half a file).

Where: `<build cache>/gemm-choices/<GPU name>.json`; LTXBENCH_GEMM_CACHE=<dir> puts the files elsewhere,
LTXBENCH_GEMM_CACHE=off turns loading and saving off (every process searches again). Choices the project's own runs
searched ship with the package (`ltxbench/ops/gemm_choices/<GPU name>.json`, copied from a device run's cache): `load`
adds those of their problems the user's file lacks, so a fresh machine with the same GPU model and cuBLASLt version
skips the search (the extension's checks apply to them as to any record; the user's own search takes precedence).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import warnings
from pathlib import Path

SCHEMA = "ltxbench.gemm-choices"
VERSION = 1
_KEY_FIELDS = 13  # tag, cuBLASLt version, dtype, act, align, bias, residual, tokens, n, k, ldx, ldw, ldout
_saving: set[int] = set()  # devices whose choices are saved at exit
SHIPPED = Path(__file__).with_name("gemm_choices")  # the project's searched choices, per GPU model (package data)


def directory() -> Path | None:
    """Where the files live, or None when LTXBENCH_GEMM_CACHE=off."""
    setting = os.environ.get("LTXBENCH_GEMM_CACHE", "").strip()
    if setting.lower() in ("off", "0", "false", "no"):
        return None
    if setting:
        return Path(setting).expanduser()
    from ltxbench.ops import build

    return build.cache_dir() / "gemm-choices"


def file_name(device_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", device_name).strip("-") + ".json"


def cache_file(device_name: str) -> Path | None:
    folder = directory()
    return None if folder is None else folder / file_name(device_name)


def stored_records(device_name: str) -> list[str]:
    """The user's records for a GPU model, then the shipped ones of the problems the user's file lacks; [] when
    LTXBENCH_GEMM_CACHE=off."""
    path = cache_file(device_name)
    if path is None:
        return []
    records = read_records(path)
    own = {record_key(r) for r in records}
    return records + [r for r in read_records(SHIPPED / file_name(device_name)) if record_key(r) not in own]


def record_key(record: str) -> str:
    """The part of a record that names its problem (and cuBLASLt version): equal keys, one record."""
    return " ".join(record.split("\t", 1)[0].split()[:_KEY_FIELDS])


def _format_and_version(record: str) -> tuple[str, ...]:
    """(record format tag, cuBLASLt version): the extension refuses records that differ from its own in either."""
    return tuple(record.split()[:2])


def read_records(path: Path) -> list[str]:
    """The records of one file; [] when it is missing, and a warning when it is not ours or not readable."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        warnings.warn(f"GEMM choices in {path} not read ({exc}): the search runs again", stacklevel=2)
        return []
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("version") != VERSION:
        warnings.warn(f"{path} is not a version-{VERSION} {SCHEMA} file: not read", stacklevel=2)
        return []
    return [r for r in doc.get("records", []) if isinstance(r, str)]


def write_records(path: Path, device_name: str, records: list[str]) -> None:
    """Merge `records` into the file at `path`: a record replaces the stored one of the same problem, and stored
    records of another format or cuBLASLt version than the new ones are dropped (the extension would refuse them)."""
    versions = {_format_and_version(r) for r in records}
    merged = {record_key(r): r for r in read_records(path) if not versions or _format_and_version(r) in versions}
    merged.update({record_key(r): r for r in records})
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"schema": SCHEMA, "version": VERSION, "device": device_name, "records": sorted(merged.values())}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


def _device_index(device) -> int:
    import torch

    if device is None:
        return torch.cuda.current_device()
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"GEMM choices are per CUDA device, got device {device}")
    return device.index if device.index is not None else torch.cuda.current_device()


def load(device=None) -> int:
    """Load the stored choices for `device` (default: the current CUDA device; the user's and the shipped ones,
    stored_records); returns how many the extension kept.
    Registers `save(device)` to run at the process's exit."""
    import torch

    from ltxbench.ops import _lib

    index = _device_index(device)
    name = torch.cuda.get_device_name(index)
    if cache_file(name) is None:
        return 0
    kept = int(_lib().gemm_import(index, stored_records(name)))
    if index not in _saving:
        _saving.add(index)
        atexit.register(_save_quietly, index)
    return kept


def save(device=None) -> Path | None:
    """Merge this process's searched choices for `device` into its file; returns the path, or None when there
    was nothing to save or saving is off."""
    import torch

    from ltxbench.ops import _lib

    index = _device_index(device)
    name = torch.cuda.get_device_name(index)
    path = cache_file(name)
    records = list(_lib().gemm_export(index))
    if path is None or not records:
        return None
    write_records(path, name, records)
    return path


def _save_quietly(index: int) -> None:
    try:
        save(index)
    except Exception as exc:  # at exit, a cache that cannot be written must not turn a finished run into a failure
        warnings.warn(f"GEMM choices not saved: {exc}", stacklevel=1)
