"""--gpus / --parallel: the split's validation, the re-launch as N processes (gloo on the CPU, through
tests/workers/parallel_worker.py in place of `python -m ltxbench`), one rank's process group, rank-0-only output and
files, the records of a multi-GPU run and `ltxbench report` on them (CPU only, no model built)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from ltxbench.cli import app
from ltxbench.errors import EnvironmentProblem, UsageError
from ltxbench.parallel import launch
from tests.helpers import WORKERS

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


# --- resolve_split, check_visible, under_launcher ----------------------------------------------------

@pytest.mark.parametrize(("gpus", "parallel", "split", "degrees"), [
    (1, None, None, None), (2, None, "cfg", (2, 1)), (3, None, "ulysses", (1, 3)), (4, None, "cfg+ulysses", (2, 2)),
    (8, None, "cfg+ulysses", (2, 4)), (2, "ulysses", "ulysses", (1, 2)), (4, "ring", "ring", (1, 4)),
    (2, "cfg", "cfg", (2, 1)), (6, "cfg+ulysses", "cfg+ulysses", (2, 3)), (4, "cfg+ring", "cfg+ring", (2, 2)),
])
def test_split_defaults_and_degrees(gpus, parallel, split, degrees):
    assert launch.resolve_split(gpus, parallel) == split
    if split is not None:
        assert launch.degrees(split, gpus) == degrees and degrees[0] * degrees[1] == gpus


@pytest.mark.parametrize(("split", "mesh"), [("cfg+ring", (2, 2, 1)), ("cfg+ulysses", (2, 1, 2)), ("ring", (1, 4, 1))])
def test_mesh_degrees_of_the_token_splits(split, mesh):
    """(cfg, ring, ulysses): cfg+ring puts a guidance half's ranks on the ring dim, cfg+ulysses on the Ulysses one."""
    from ltxbench.parallel import context

    assert context.degrees(split, *launch.degrees(split, 4)) == mesh


def test_hybrid_uses_both_degrees_over_the_same_two_ranks():
    assert launch.resolve_split(2, "hybrid") == "hybrid" and launch.degrees("hybrid", 2) == (2, 2)


def test_the_two_gpu_default_is_the_familys():
    from ltxbench.models import family_of

    assert [family_of(model).two_gpu_split for model in ("ltx-tiny", "ltx2-tiny")] == ["cfg", "hybrid"]
    assert launch.resolve_split(2, None, "hybrid") == "hybrid"
    assert launch.resolve_split(4, None, "hybrid") == "cfg+ulysses"


@pytest.mark.parametrize(("gpus", "parallel", "flag", "words"), [
    (0, None, "--gpus", "at least 1"),
    (1, "cfg", "--parallel", "needs --gpus 2 or more"),
    (2, "tensor", "--parallel", "not one of cfg, ulysses, ring, cfg+ulysses, cfg+ring, hybrid"),
    (4, "hybrid", "--parallel hybrid", "use --gpus 2"),
    (3, "cfg", "--parallel cfg", "use --gpus 2"),
    (4, "cfg", "--parallel cfg", "use --gpus 2"),
    (2, "cfg+ulysses", "--parallel cfg+ulysses", "even --gpus of at least 4"),
    (5, "cfg+ulysses", "--parallel cfg+ulysses", "even --gpus of at least 4"),
    (2, "cfg+ring", "--parallel cfg+ring", "even --gpus of at least 4"),
])
def test_split_refusals_name_the_flag_in_one_line(gpus, parallel, flag, words):
    with pytest.raises(UsageError) as err:
        launch.resolve_split(gpus, parallel)
    assert flag in err.value.message and words in err.value.message and "\n" not in err.value.message


def test_world_main_is_rank_0():
    world = launch.World(rank=1, size=2, local_rank=1, device="cpu", split="cfg", cfg_degree=2, cp_degree=1)
    assert not world.main and launch.World(**{**world.__dict__, "rank": 0}).main


def test_ranks_start_a_timed_generation_together(monkeypatch):
    """Each rank's GPU drained, then a barrier: no rank starts its clock before the others (it would time its wait
    for them at the first collective); one process does neither."""
    import torch
    import torch.distributed as dist

    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(("sync", device)))
    monkeypatch.setattr(dist, "barrier", lambda *args, **kwargs: calls.append(("barrier",)))
    monkeypatch.setattr(launch, "_world", None)
    launch.start_together()
    assert calls == []
    monkeypatch.setattr(launch, "_world", launch.World(1, 2, 1, "cuda:1", "cfg", 2, 1))
    launch.start_together()
    assert calls == [("sync", "cuda:1"), ("barrier",)]
    calls.clear()
    monkeypatch.setattr(launch, "_world", _world(0))  # gloo on the CPU: the barrier alone
    launch.start_together()
    assert calls == [("barrier",)]


def test_under_launcher_needs_all_three_variables(monkeypatch):
    for name in launch.LAUNCHER_ENV:
        monkeypatch.delenv(name, raising=False)
    assert not launch.under_launcher()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert not launch.under_launcher()
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert launch.under_launcher() and launch.launcher_world_size() == 2


def test_check_visible(monkeypatch):
    import torch

    launch.check_visible(8, "cpu")  # gloo processes: nothing to see
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    launch.check_visible(1, "cuda")
    with pytest.raises(EnvironmentProblem) as err:
        launch.check_visible(2, "cuda")
    assert "--gpus 2" in err.value.message and "1 visible" in err.value.message
    assert "CUDA_VISIBLE_DEVICES" in err.value.hint


TOPO = ("\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\nGPU0\t X \tNV18\t0-31\t0\t\tN/A\n"
        "GPU1\tNV18\t X \t0-31\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n  NV#  = Connection traversing a bonded set\n")


def test_the_interconnect_is_nvidia_smi_topo_without_its_legend_and_escapes(monkeypatch):
    import subprocess

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: SimpleNamespace(returncode=0, stdout=TOPO))
    table = TOPO.replace("\x1b[4m", "").replace("\x1b[0m", "").split("\n\nLegend")[0]
    assert launch._topology() == table and table.startswith("\tGPU0\tGPU1") and table.endswith("N/A")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: SimpleNamespace(returncode=9, stdout="NVML failed"))
    assert launch._topology() is None

    def absent(*args, **kwargs):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(subprocess, "run", absent)
    assert launch._topology() is None


# --- relaunch: N real processes -------------------------------------------------------------------

@pytest.fixture
def worker_path(monkeypatch):
    """`python -m parallel_worker` finds tests/workers/parallel_worker.py (and ltxbench) in the launched processes."""
    path = os.pathsep.join(filter(None, [str(WORKERS), str(REPO), os.environ.get("PYTHONPATH")]))
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.delenv(launch.SPLIT_ENV, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


def test_two_gloo_ranks_agree_on_their_world(tmp_path, worker_path):
    out = tmp_path / "world.json"
    assert launch.relaunch(["world", str(out)], 2, "ulysses", module="parallel_worker") == 0
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["seen"] == [{"rank": r, "size": 2, "local_rank": r, "device": "cpu", "current": None} for r in range(2)]
    assert doc["sum"] == 3 and doc["split"] == "ulysses" and doc["degrees"] == [1, 2]
    assert doc["described"] == {"world_size": 2, "split": "ulysses", "cfg_degree": 1, "cp_degree": 2, "gpus": [],
                                "interconnect": None, "backend": "gloo"}
    assert doc["nvls"] == "0" and int(doc["threads"]) >= 1
    assert launch.SPLIT_ENV not in os.environ and "OMP_NUM_THREADS" not in os.environ  # the launcher's, restored


def test_a_rank_that_exits_with_our_code_gives_that_code(worker_path, capfd):
    assert launch.relaunch(["exit", "2", "1"], 2, "cfg", module="parallel_worker") == 2
    err = capfd.readouterr().err
    assert "error: worker 1 gives up" in err and "failed (" not in err and "Traceback" not in err


@pytest.mark.parametrize(("code", "status", "message"),
                         [(None, 0, ""), (3, 3, ""), ("error: gave up", 1, "error: gave up\n")])
def test_a_rank_ends_with_its_code_and_its_output_flushed(code, status, message):
    """end_rank skips the interpreter's finalization: what the rank printed must still arrive (pipes buffer it), and
    the exit handlers still run (the GEMM choices are saved by one)."""
    import subprocess

    program = ("import atexit, sys; from ltxbench.parallel import launch; atexit.register(print, '+', end=''); "
               f"print('done', end=''); sys.stderr.write('w'); launch.end_rank({code!r})")
    buffered = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, cwd=REPO, env=buffered,
                          timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (status, "done+", "w" + message)


@pytest.mark.parametrize(("argv", "status", "stream", "expected"),
                         [(["compare", "--help"], 0, "stdout", "Usage"),
                          (["compare", "missing-a.json", "missing-b.json"], 3, "stderr", "missing-a.json")])
def test_a_rank_of_the_cli_exits_with_the_command_code(tmp_path, argv, status, stream, expected):
    """`python -m ltxbench` as one rank (the launcher's variables set) ends through end_rank, with the command's exit
    code and its whole output."""
    import subprocess

    env = {**{name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"},
           "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    done = subprocess.run([sys.executable, "-m", "ltxbench", *argv], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=120)
    assert done.returncode == status and expected in getattr(done, stream), done


@pytest.mark.gpu
def test_two_nccl_ranks_each_on_its_gpu(tmp_path, worker_path):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    out = tmp_path / "world.json"
    assert launch.relaunch(["world", str(out), "cuda"], 2, "cfg", module="parallel_worker") == 0
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["seen"] == [{"rank": r, "size": 2, "local_rank": r, "device": f"cuda:{r}", "current": r}
                           for r in range(2)]
    described = doc["described"]
    assert doc["sum"] == 3 and described["world_size"] == 2 and described["split"] == "cfg"
    assert described["gpus"] == [torch.cuda.get_device_name(i) for i in range(2)] and "backend" not in described
    assert described["interconnect"] is None or "GPU1" in described["interconnect"]
    assert described["nccl"].count(".") == 2 and described["allocator"] == os.environ.get("PYTORCH_CUDA_ALLOC_CONF")


@pytest.mark.parametrize(("args", "how"), [(["exit", "7", "1"], "rank 1 of 2 failed (exit 7)"),
                                           (["kill", "0"], "rank 0 of 2 failed (signal SIGKILL)")])
def test_a_rank_that_dies_otherwise_gives_4_and_one_line(args, how, worker_path, capfd):
    assert launch.relaunch(args, 2, "cfg", module="parallel_worker") == 4
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if "failed (" in line]
    assert lines == [f"error: {how}: see the lines above"], err
    assert "ChildFailedError" not in err and "Root Cause" not in err and "closing signal" not in err


# --- the commands: refused before any process starts, or re-launched as typed ------------------------

@pytest.fixture
def no_relaunch(monkeypatch):
    calls: list = []
    monkeypatch.setattr(launch, "relaunch", lambda argv, gpus, split=None: calls.append((argv, gpus, split)) or 3)
    for name in launch.LAUNCHER_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LTXBENCH_CPU_RANKS", "1")  # --gpus N on --device cpu: N gloo processes
    return calls


TINY = ["--model", "ltx-tiny", "--weights", "random", "--device", "cpu", "--num-frames", "9", "--height", "64",
        "--width", "64", "--steps", "2"]
COMMANDS = {"generate": ["generate", "--prompt", "a fox"], "bench e2e": ["bench", "e2e"], "profile": ["profile"]}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(("extra", "needle"), [
    (["--parallel", "cfg"], "--parallel"),
    (["--gpus", "3", "--parallel", "cfg"], "--parallel cfg"),
    (["--gpus", "0"], "--gpus 0"),
    (["--gpus", "2", "--parallel", "hybrid"], "--parallel hybrid: the LTX-Video family splits as cfg, ulysses"),
])
def test_bad_splits_are_usage_errors_before_any_process(command, extra, needle, no_relaunch, tmp_path):
    result = runner.invoke(app, [*COMMANDS[command], *TINY, "--output", _output(command, tmp_path), *extra])
    assert result.exit_code == 2, result.output
    assert needle in result.output and no_relaunch == []


def test_ltx2_refuses_cfg_ring(no_relaunch, tmp_path):
    """cfg+ring is LTX-Video's (our ring attention serves its self-attention); LTX-2 refuses it in one line."""
    tiny = [*TINY[:1], "ltx2-tiny", *TINY[2:]]
    result = runner.invoke(app, ["bench", "e2e", *tiny, "--output", _output("bench e2e", tmp_path), "--gpus", "4",
                                 "--parallel", "cfg+ring"])
    assert result.exit_code == 2, result.output
    assert "--parallel cfg+ring: the LTX-2 family splits as" in result.output and no_relaunch == []


@pytest.mark.parametrize("command", ["bench e2e", "profile"])
def test_a_family_on_one_gpu_refuses_gpus(command, no_relaunch, tmp_path):
    result = runner.invoke(app, [*COMMANDS[command], "--model", "llama-tiny", "--device", "cpu", "--gpus", "2",
                                 "--output", _output(command, tmp_path)])
    assert result.exit_code == 2, result.output
    assert "--gpus 2: the LLM family runs on one GPU" in result.output and no_relaunch == []


def test_more_gpus_than_visible_is_exit_4_in_one_line(no_relaunch, tmp_path):
    import torch

    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has 2 GPUs")
    result = runner.invoke(app, [*COMMANDS["bench e2e"], "--model", "ltx-tiny", "--weights", "random", "--device",
                                 "cuda", "--gpus", "2", "--output", str(tmp_path / "r.json")])
    assert result.exit_code == 4, result.output
    assert result.output.count("error:") == 1 and "--gpus 2" in result.output and no_relaunch == []


@pytest.mark.parametrize("command", COMMANDS)
def test_gpus_relaunches_the_original_command_line_and_exits_with_its_code(command, no_relaunch, tmp_path,
                                                                            monkeypatch):
    argv = [*COMMANDS[command], *TINY, "--output", _output(command, tmp_path), "--gpus", "2"]
    monkeypatch.setattr(sys, "argv", ["ltxbench", *argv])
    result = runner.invoke(app, argv)
    assert result.exit_code == 3, result.output  # the launched processes' code
    assert no_relaunch == [(argv, 2, "cfg")]
    assert not list(tmp_path.iterdir())  # the parent writes nothing


def test_under_a_launcher_of_another_size_gpus_is_a_usage_error(no_relaunch, tmp_path, monkeypatch):
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    result = runner.invoke(app, [*COMMANDS["bench e2e"], *TINY, "--output", str(tmp_path / "r.json"), "--gpus", "2"])
    assert result.exit_code == 2, result.output
    assert "--gpus 2, but the launcher started 4 processes" in result.output and no_relaunch == []


def _output(command: str, tmp_path: Path) -> str:
    return str(tmp_path / ("out.mp4" if command == "generate" else "r.json"))


# --- rank 0 alone prints and writes ---------------------------------------------------------------

class FakeFamily:
    """Just enough of a video family for the commands' run functions."""

    title, name = "Fake", "fake"

    def __init__(self):
        self.parallelized = []

    def build(self, settings):
        return SimpleNamespace(transformer=None)

    def bench(self, target, settings, log):
        log("measuring")
        return {"baseline": {"injection": {"applied": False}}}

    def records(self, results, params, settings):
        from ltxbench.results.schema import make_record, stats_from_samples

        return [make_record("total", "baseline", "fp32", params, "time", "ms", "lower", stats_from_samples([1.0]))]

    def plot_parts(self, records):
        return []

    def parallelize(self, pipe, settings):
        self.parallelized.append(pipe)

    def set_attention(self, pipe, settings, log=None):
        return None

    def generate(self, pipe, settings, on_step):
        on_step()
        return [], {"step_ms": [1.0], "text_encode_ms": 1.0, "total_ms": 2.0}, None


DESCRIBED = {"world_size": 2, "split": "cfg", "cfg_degree": 2, "cp_degree": 1, "gpus": [], "interconnect": None,
             "backend": "gloo"}


def _world(rank: int) -> launch.World:
    return launch.World(rank=rank, size=2, local_rank=rank, device="cpu", split="cfg", cfg_degree=2, cp_degree=1)


@pytest.fixture
def settled(monkeypatch):
    """Every rank finished (no process group here): finished() returns what describe would."""
    from ltxbench.cli import _parallel

    monkeypatch.setattr(_parallel, "finished", lambda world: None if world is None else DESCRIBED)


def _e2e_settings(gpus: int):
    from ltxbench.models.family import RunSettings

    return RunSettings(model="fake", weights="random", configs=["baseline"], device="cpu", dtype="fp32",
                       kernel_provider="reference", warmup=1, repeats=1, rounds=1, compile_cache="shared",
                       gpus=gpus, parallel="cfg" if gpus > 1 else None)


@pytest.mark.parametrize("rank", [0, 1])
def test_bench_e2e_writes_on_rank_0_only_and_records_the_world(rank, settled, tmp_path, monkeypatch, capfd):
    from ltxbench.bench import e2e_report
    from ltxbench.cli import bench_e2e
    from ltxbench.results.io import load_result

    monkeypatch.setattr(e2e_report, "render_table", lambda records: "the table")
    monkeypatch.setattr(bench_e2e, "terminate_as_interrupt", lambda cause: pytest.fail("SIGTERM handler installed"))
    monkeypatch.setattr(launch, "_world", _world(rank))
    out = tmp_path / "r.json"
    bench_e2e._run(FakeFamily(), _e2e_settings(2), str(out), False, None, _world(rank))
    printed = capfd.readouterr()
    if rank:
        assert not list(tmp_path.iterdir()) and printed.out == printed.err == ""
        return
    doc = load_result(out)
    assert doc["run"]["config"]["parallel"] == DESCRIBED
    assert doc["records"][0]["params"]["gpus"] == 2 and doc["records"][0]["params"]["parallel"] == "cfg"
    assert "wrote" in printed.out


def test_one_gpu_records_keep_their_old_params():
    from ltxbench.bench.e2e import record_params

    assert record_params(_e2e_settings(1).as_args(), ()).keys().isdisjoint({"gpus", "parallel"})
    assert record_params(_e2e_settings(2).as_args(), ())["gpus"] == 2


def test_generate_on_rank_1_parallelizes_and_writes_nothing(settled, tmp_path, monkeypatch, capfd):
    from ltxbench.cli import generate

    family, world = FakeFamily(), _world(1)
    monkeypatch.setattr(launch, "_world", world)
    values = {"use_optimized_kernels": False, "attention_backend": None, "compile": False, "cpu_offload": False,
              "gemm_search": False, "force": False}
    settings = SimpleNamespace(model="fake", weights="random", dtype="fp32", device="cpu", steps=1,
                               memory_budget_gib=None)
    generate._run(family, settings, values, tmp_path / "out.mp4", world)
    printed = capfd.readouterr()
    assert family.parallelized and not list(tmp_path.iterdir()) and printed.out == printed.err == ""


def test_report_reads_a_multi_gpu_result(tmp_path):
    pytest.importorskip("matplotlib")
    doc = json.loads((REPO / "tests" / "fixtures" / "e2e-ltx-2b-49f-cold-compile.json").read_text(encoding="utf-8"))
    doc["run"]["config"]["parallel"] = {**DESCRIBED, "gpus": ["NVIDIA H100 80GB HBM3"] * 2, "backend": None,
                                        "interconnect": "\tGPU0\tGPU1\nGPU0\t X \tNV18\nGPU1\tNV18\t X "}
    for rec in doc["records"]:
        rec["params"].update(gpus=2, parallel="cfg")
    folder = tmp_path / "h100"
    folder.mkdir()
    (folder / "e2e-2gpu.json").write_text(json.dumps(doc), encoding="utf-8")
    result = runner.invoke(app, ["report", str(folder)])
    assert result.exit_code == 0, result.output
    readme = (folder / "README.md").read_text(encoding="utf-8")
    assert "## e2e-2gpu.json" in readme
    assert f"| 2× {doc['env']['gpus'][0]['name']}, cfg |" in readme  # the run's GPU count and split by its file
    shutil.rmtree(folder)


# --- profile over several processes: every rank's trace and summary ---------------------------------------

@pytest.mark.slow  # 2 processes, each profiling a generation
def test_profile_over_two_processes_keeps_every_ranks_trace_and_summary(tmp_path):
    """`profile --gpus 2` (2 gloo processes on the CPU, the tiny LTX-Video): each rank keeps its chrome trace and
    rank 0's result records every rank's time per family, so a rank that waits for the other at the collectives
    shows."""
    import subprocess

    out = tmp_path / "p.json"
    command = [sys.executable, "-m", "ltxbench", "profile", *TINY, "--configs", "baseline", "--gpus", "2",
               "--parallel", "cfg", "--output", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LTXBENCH_CPU_RANKS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    config = json.loads(out.read_text())["run"]["config"]
    traces = config["rank_traces"]["baseline"]
    assert traces == [str(tmp_path / "p-baseline.trace.json"), str(tmp_path / "p-baseline-rank1.trace.json")]
    assert all(Path(path).is_file() for path in traces)
    assert len(config["ranks"]) == 2
    for summary in config["ranks"]:
        row = summary["baseline"]
        assert row["total_ms"] > 0 and row["families_ms"]["communication"] > 0  # the guidance pair's gather
    assert "per rank" in done.stdout


def test_profile_refuses_an_existing_trace_of_another_rank(tmp_path, no_relaunch):
    (tmp_path / "r-baseline-rank1.trace.json").write_text("{}")
    result = runner.invoke(app, ["profile", *TINY, "--configs", "baseline", "--gpus", "2", "--output",
                                 str(tmp_path / "r.json")])
    assert result.exit_code == 2 and "r-baseline-rank1.trace.json" in result.output, result.output
    assert no_relaunch == []


@pytest.mark.slow  # 2 processes, each timing a tiny Wan generation
def test_wan_bench_e2e_over_two_processes_splits_the_tokens(tmp_path):
    """`bench e2e --model wan-tiny --gpus 2 --parallel ulysses` as a user types it (2 gloo processes on the CPU):
    both configurations run with the video tokens split and rank 0 records the split."""
    import subprocess

    out = tmp_path / "wan.json"
    command = [sys.executable, "-m", "ltxbench", "bench", "e2e", "--model", "wan-tiny", "--weights", "random",
               "--device", "cpu", "--steps", "2", "--configs", "baseline,optimized", "--warmup-iterations", "1",
               "--repeats", "1", "--gpus", "2", "--parallel", "ulysses", "--output", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LTXBENCH_CPU_RANKS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    config = json.loads(out.read_text())["run"]["config"]
    assert config["parallel"]["split"] == "ulysses" and config["parallel"]["cp_degree"] == 2, config["parallel"]
