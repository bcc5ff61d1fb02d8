"""The stored result documents `ltxbench report` reads (`Document`, `load_folder`) and the formatting its tables and
figures share. ltxbench.results.report_tables makes the tables, ltxbench.results.report_plots the figures."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from ltxbench.errors import UsageError
from ltxbench.results.comparable import world_of
from ltxbench.results.io import load_result
from ltxbench.results.provenance import label as provenance_label
from ltxbench.results.remeasure import BESIDE, CORES

OURS = "cuda"  # the provider name of ltxbench's own kernels in `bench micro`
DASH = "–"


@dataclass(frozen=True)
class Document:
    """One result file: where it lies (as the user named the folder) and its validated content."""

    path: Path
    doc: dict

    @property
    def stem(self) -> str:
        return self.path.stem

    @property
    def gpu(self) -> str:
        gpus = (self.doc.get("env") or {}).get("gpus") or []
        return gpus[0].get("name", "cpu") if gpus else "cpu"

    @property
    def devices(self) -> str:
        """The GPU, or for a run over several GPUs their count and split ("4× NVIDIA H100 80GB HBM3, cfg+ulysses")."""
        size, split = world_of(self.doc)
        return f"{size}× {self.gpu}, {split}" if size > 1 else self.gpu

    @property
    def commit(self) -> str:
        return provenance_label((self.doc.get("env") or {}).get("git"))

    @property
    def started(self) -> str:
        return str(self.doc["run"]["started_at"])[:16].replace("T", " ")

    @property
    def command(self) -> str:
        """The command line that wrote the file, without its output path (a detail of the machine it ran on)."""
        argv, kept, skip = list(self.doc["run"]["argv"]), [], False
        for arg in argv:
            if skip:
                skip = False
            elif arg in ("--output", "-o"):
                skip = True
            elif not arg.startswith("--output="):
                kept.append(arg)
        return shlex.join(kept)

    @property
    def provenance(self) -> str:
        beside = self.doc["run"].get(BESIDE)  # the results manifest ran it on one GPU of several, others beside it
        cores = self.doc["run"].get(CORES)
        shared = f" · beside {len(beside)} other benchmarks on this host's GPUs" if beside else ""
        shared += f", on {cores} CPU cores of its own" if beside and cores else ""
        return f"{self.path.as_posix()} · {self.devices} · git {self.commit} · {self.started} UTC{shared}"


def load_folder(folder: Path) -> list[Document]:
    """Every result document (*.json) directly in `folder`, by file name; an unreadable one stops the report. The
    chrome traces `profile` writes beside its result (*.trace.json) are not result documents."""
    if not folder.is_dir():
        raise UsageError(f"RESULTS_DIR {folder} is not a folder")
    paths = sorted(p for p in folder.glob("*.json") if not p.name.endswith(".trace.json"))
    if not paths:
        raise UsageError(f"RESULTS_DIR {folder} holds no result documents (*.json)",
                         hint="point it at a folder that `ltxbench bench ... --output` wrote into")
    return [Document(path, load_result(path)) for path in paths]


# --- formatting -------------------------------------------------------------------------------------

def fmt(value, spec: str = ".2f", suffix: str = "") -> str:
    return DASH if value is None else f"{value:{spec}}{suffix}"


def fmt_us(ms) -> str:
    if ms is None:
        return "n/a"
    us = ms * 1000
    return f"{us:.2f}" if us < 10 else f"{us:.1f}"


def to_markdown(frame) -> str:
    """A pandas frame of strings as a Markdown table (pipes inside cells escaped)."""
    cols = [str(c) for c in frame.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join(" --- " for _ in cols) + "|"]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |")
    return "\n".join(lines)


# --- what a table reads ---------------------------------------------------------------------------

def measure_label(rec: dict) -> str:
    """The measured quantity of an e2e record: its phase, and the prompt length for LLM prefill."""
    if rec["name"] == "prefill" and "prompt_len" in rec["params"]:
        return f"prefill {rec['params']['prompt_len']}"
    return rec["name"]


def main_measure(records) -> str | None:
    """The record the speedups and GPU columns are read from: the whole run for a full pipeline, else the step."""
    names = {measure_label(r) for r in records}
    if "total" in names and any(r["params"].get("phase") == "all" for r in records):
        return "total"
    return next((n for n in ("denoise_step", "decode_step", "generate", "total") if n in names), None)


def gib(nbytes):
    return None if nbytes is None else nbytes / 2**30
