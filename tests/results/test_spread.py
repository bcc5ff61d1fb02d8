"""A one-GPU folder's benchmarks spread over several GPUs of one host (ltxbench.results.spread): each benchmark runs
once, on one GPU at a time, the ones streaming host memory with nothing beside them, each result saying what ran
beside it; a budget, a failure and Ctrl-C leave the folder as the sequential run does."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from ltxbench.results import benchmarks, commands, manifest, remeasure, spread
from ltxbench.results.report_documents import Document
from tests.helpers import CLEAN_HEAD as HEAD

SHARED = ["e2e-ltx-2b-49f", "e2e-ltx-2b-161f", "micro-attention", "micro-wan-f32"]
ALONE = "e2e-ltx-2b-161f-8gib"  # --memory-budget: streams from pinned host memory


class GpuRunner:
    """A fake command per GPU: takes `seconds`, records where and beside what it ran, and writes a result."""

    def __init__(self, seconds=0.15, fail=None, interrupt=None):
        self.seconds, self.fail, self.interrupt = seconds, fail, interrupt
        self.lock, self.running, self.ran, self.overlaps, self.cpus = threading.Lock(), set(), [], {}, {}

    def __call__(self, argv, output: Path, timeout_s, device=None, log=None, cpus=None):
        name = output.stem
        with self.lock:
            self.ran.append((name, device))
            self.cpus[name] = cpus
            self.overlaps[name] = set(self.running)
            for other in self.running:
                self.overlaps[other].add(name)
            self.running.add(name)
        if log is not None:
            log.write_text(f"{name} on {device}\n")
        try:
            time.sleep(self.seconds)
            if name == self.interrupt:
                raise KeyboardInterrupt
            run = {"argv": ["ltxbench", *argv], "started_at": "2026-12-05T10:00:00+00:00"}
            output.write_text(json.dumps({"kind": "e2e", "env": {"git": HEAD}, "run": run, "records": [{"x": 1}]}))
            return 1 if name == self.fail else 0
        finally:
            with self.lock:
                self.running.discard(name)


def _run(folder, runner, names, devices=(0, 1), **kwargs):
    return manifest.run(folder, only=list(names), runner=runner, regenerate=lambda f: None, devices=list(devices),
                        **kwargs)


def _stamped_beside(folder, name):
    return json.loads((folder / f"{name}.json").read_text())["run"][remeasure.BESIDE]


def test_each_benchmark_runs_once_on_one_gpu_and_says_what_ran_beside_it(tmp_path, head):
    folder = tmp_path / "results" / "h100"
    runner = GpuRunner()
    assert _run(folder, runner, SHARED) == 0
    assert sorted(n for n, _ in runner.ran) == sorted(SHARED)
    assert {d for _, d in runner.ran} == {0, 1}  # both GPUs worked
    for name in SHARED:
        assert remeasure.is_current(folder / f"{name}.json", HEAD)
        # every command that ran at the same time is named (the board counts from start to file kept: a superset)
        assert runner.overlaps[name] <= set(_stamped_beside(folder, name)) <= set(SHARED) - {name}
    assert any(runner.overlaps.values())  # side by side, and said so
    for name, others in runner.overlaps.items():  # each on CPU cores of its own, recorded
        assert runner.cpus[name] and all(not set(runner.cpus[name]) & set(runner.cpus[o]) for o in others)
        assert json.loads((folder / f"{name}.json").read_text())["run"][remeasure.CORES] == len(runner.cpus[name])
    logs = tmp_path / "results" / "runs" / "manifest-logs" / "h100"
    assert sorted(p.stem for p in logs.glob("*.log")) == sorted(SHARED)
    assert not (tmp_path / "results" / "runs" / "manifest" / "h100").exists()  # the work folders are gone


def test_a_benchmark_streaming_host_memory_runs_with_nothing_beside_it(tmp_path, head):
    folder = tmp_path / "results" / "h100"
    runner = GpuRunner()
    names = [SHARED[0], ALONE, *SHARED[1:]]  # in the middle of the order: run after the others, alone
    assert spread.alone(next(b for b in benchmarks.BENCHMARKS if b.name == ALONE))
    assert _run(folder, runner, names, devices=(0, 1, 2)) == 0
    assert runner.overlaps[ALONE] == set() and _stamped_beside(folder, ALONE) == []
    assert runner.cpus[ALONE] is None  # the whole host's cores
    assert [n for n, _ in runner.ran][-1] == ALONE


def test_the_budget_leaves_what_does_not_fit_pending(tmp_path, head, capsys):
    folder = tmp_path / "results" / "h100"
    runner = GpuRunner(seconds=0)
    assert _run(folder, runner, SHARED, budget_minutes=1.05) == 124  # the micro benchmarks (1 min) fit
    assert sorted(n for n, _ in runner.ran) == ["micro-attention", "micro-wan-f32"]
    assert "2 pending (e2e-ltx-2b-49f, e2e-ltx-2b-161f)" in capsys.readouterr().out


def test_a_failure_starts_nothing_more_and_keeps_the_stored_file(tmp_path, head):
    folder = tmp_path / "results" / "h100"
    folder.mkdir(parents=True)
    runner = GpuRunner(fail=SHARED[0])
    assert _run(folder, runner, SHARED, devices=(0,) * 1 + (1,)) == 1
    assert not (folder / f"{SHARED[0]}.json").exists()
    ran = [n for n, _ in runner.ran]
    assert len(ran) < len(SHARED) and SHARED[1] in ran  # the other GPU's first one finished and is kept
    assert remeasure.is_current(folder / f"{SHARED[1]}.json", HEAD)


def test_ctrl_c_in_one_command_stops_the_run_and_keeps_what_finished(tmp_path, head, capsys):
    folder = tmp_path / "results" / "h100"
    runner = GpuRunner(interrupt=SHARED[1])
    assert _run(folder, runner, SHARED) == 130
    assert remeasure.is_current(folder / f"{SHARED[0]}.json", HEAD)  # ran beside the interrupted one, finished
    assert not (folder / f"{SHARED[1]}.json").exists()
    assert f"interrupted: kept {SHARED[0]}" in capsys.readouterr().out


def test_devices_are_checked_and_spread_only_one_gpu_folders(tmp_path, head, capsys):
    assert commands.parse_devices("0,1,2,3", 4) == ([0, 1, 2, 3], None)
    assert commands.parse_devices("0, 2", 4) == ([0, 2], None)
    for text, problem in (("0,0", "named twice"), ("0,4", "4 GPU(s) visible"), ("a", "GPU indices"), ("", "GPU")):
        assert problem in commands.parse_devices(text, 4)[1]
    assert "no GPU is visible" in commands.parse_devices("0", 0)[1]
    assert _run(tmp_path / "results" / "h100x4", GpuRunner(), [], devices=(0, 1)) == 2
    assert "holds the 4-GPU set" in capsys.readouterr().err


def test_one_device_pins_the_sequential_run_to_that_gpu(tmp_path, head):
    folder = tmp_path / "results" / "h100"
    runner = GpuRunner(seconds=0)
    assert _run(folder, runner, SHARED[:2], devices=(3,)) == 0
    assert runner.ran == [(SHARED[0], 3), (SHARED[1], 3)]
    assert remeasure.BESIDE not in json.loads((folder / f"{SHARED[0]}.json").read_text())["run"]


def test_the_command_sees_only_its_gpu_and_writes_its_log(tmp_path, monkeypatch):
    seen = {}

    class Process:
        pid, returncode = 12345, 0

        def wait(self, timeout=None):
            return 0

    def popen(command, **kwargs):
        seen.update(kwargs)
        kwargs["stdout"].write("hello\n")
        return Process()

    monkeypatch.setattr(commands.subprocess, "Popen", popen)
    monkeypatch.setattr(commands.os, "sched_setaffinity", lambda pid, cpus: seen.update(affinity=(pid, list(cpus))))
    log = tmp_path / "x.log"
    assert commands.execute(["bench", "e2e"], tmp_path / "r.json", 10, device=2, log=log, cpus=[4, 5, 6]) == 0
    assert seen["env"]["CUDA_VISIBLE_DEVICES"] == "2" and seen["stderr"] == commands.subprocess.STDOUT
    assert seen["env"]["OMP_NUM_THREADS"] == "3" and seen["affinity"] == (12345, [4, 5, 6])
    assert log.read_text() == "hello\n"


def test_the_report_says_a_result_was_measured_beside_others(tmp_path):
    doc = {"kind": "e2e", "env": {"git": HEAD, "gpus": [{"name": "NVIDIA H100 80GB HBM3"}]},
           "run": {"argv": ["ltxbench"], "started_at": "2026-12-05T10:00:00+00:00", remeasure.BESIDE: ["a", "b"],
                   remeasure.CORES: 16}}
    assert "beside 2 other benchmarks on this host's GPUs, on 16 CPU cores of its own" in \
        Document(tmp_path / "x.json", doc).provenance
    doc["run"][remeasure.BESIDE] = []
    assert "beside" not in Document(tmp_path / "x.json", doc).provenance
