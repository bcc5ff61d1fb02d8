"""The CLI surface: help, `env --json`, the exit-code policy, and a light, fast --help (CPU only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from ltxbench.cli import PolicyGroup, app
from ltxbench.errors import CheckFailed, EnvironmentProblem, IncomparableResults, UsageError

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _python(*args: str) -> subprocess.CompletedProcess:
    # Run from the checkout whether or not ltxbench is pip-installed into the interpreter.
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)


# --- help and commands -----------------------------------------------------------------------------

def test_help_lists_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0, result.output
    commands = result.output.split("Commands:", 1)[1]
    listed = [line.split()[0] for line in commands.split("\n\n")[0].splitlines() if line.startswith("  ")]
    # every command, each built on demand (cli.LazyGroup) and listed in the declared order
    assert listed == ["env", "kernels", "generate", "compare", "profile", "report", "bench"], result.output
    assert "Exit codes" in result.output


def test_bench_help():
    result = runner.invoke(app, ["bench", "--help"])
    assert result.exit_code == 0, result.output
    commands = result.output.split("Commands:", 1)[1]
    assert "Usage:" in result.output and commands.index("\n  micro ") < commands.index("\n  e2e ")


def test_generate_help_offers_the_video_presets_only():
    """generate refuses LLMs (exit 2), so its --model help lists the video presets; bench e2e's lists every one."""
    from ltxbench.models import presets

    generate = " ".join(runner.invoke(app, ["generate", "--help"], terminal_width=400).output.split())
    bench = " ".join(runner.invoke(app, ["bench", "e2e", "--help"], terminal_width=400).output.split())
    for name, family in presets().items():
        assert (f" {name}," in generate or f"({name}," in generate or f" {name})" in generate) == family.makes_video
        assert f" {name}," in bench or f"({name}," in bench or f" {name})" in bench, name


def test_env_help_has_examples():
    result = runner.invoke(app, ["env", "--help"])
    assert result.exit_code == 0, result.output
    assert "--json" in result.output and "ltxbench env --json > env.json" in result.output


def test_env_json_is_parseable_and_complete():
    result = runner.invoke(app, ["env", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert set(doc) == {"env", "build"}
    env, build = doc["env"], doc["build"]
    assert isinstance(env["gpus"], list)
    if not env["gpus"]:
        assert env["cuda_note"]
    for gpu in env["gpus"]:
        assert {"index", "name", "capability", "sm_count", "memory_gib"} <= set(gpu)
    assert {"hostname", "platform", "python"} <= set(env["host"])
    versions = env["versions"]
    for key in ("torch", "cuda", "cudnn", "triton", "diffusers", "transformers", "accelerate", "ltxbench",
                "liger-kernel", "ltx-core", "fa3-fwd", "flash_attn_3", "nvidia-cudnn-frontend"):
        assert key in versions
    import torch

    assert versions["torch"] == torch.__version__.split("+")[0] or versions["torch"] == torch.__version__
    assert versions["ltxbench"] == "0.1.0"
    assert set(env["nvcc"]) == {"path", "version"}
    assert "cuda_home" in env and "driver" in env
    assert env["git"] is None or set(env["git"]) == {"sha", "dirty", "diff_sha256", "code", "source", "executed",
                                                     "executed_kernels", "executed_code"}
    assert isinstance(build["built"], bool)


def test_env_table_exits_zero():
    result = runner.invoke(app, ["env"])
    assert result.exit_code == 0, result.output
    for label in ("driver", "torch", "nvcc", "CUDA_HOME", "kernels", "git"):
        assert label in result.output


def test_unknown_option_is_usage_error():
    result = runner.invoke(app, ["env", "--no-such-option"])
    assert result.exit_code == 2
    assert "--no-such-option" in result.output


def test_unknown_command_is_usage_error():
    assert runner.invoke(app, ["no-such-command"]).exit_code == 2


# --- exit-code policy ------------------------------------------------------------------------------

def _policy_app() -> typer.Typer:
    demo = typer.Typer(cls=PolicyGroup, pretty_exceptions_enable=False, add_completion=False)

    @demo.command()
    def usage():
        raise UsageError("--shapes must be one of ltx, llm", hint="see `ltxbench bench micro --help`")

    @demo.command()
    def incomparable():
        raise IncomparableResults("a.json was measured on H100, b.json on H200", hint="compare like")

    @demo.command()
    def environment():
        raise EnvironmentProblem("nvcc not found", hint="set CUDA_HOME")

    @demo.command()
    def check():
        raise CheckFailed("rmsnorm differs from reference by 0.5", hint="rerun with --verbose")

    @demo.command()
    def oom():
        raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB\nmore allocator details")

    @demo.command()
    def host_oom():
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 28000000000 bytes. Error code 12 (Cannot allocate memory)")

    @demo.command()
    def bug():
        raise ZeroDivisionError("a real bug")

    return demo


@pytest.mark.parametrize(
    ("command", "code", "fragment"),
    [("usage", 2, "--shapes must be one of"), ("incomparable", 3, "measured on H100"),
     ("environment", 4, "nvcc not found"), ("check", 1, "differs from reference"),
     ("oom", 4, "out of GPU memory"), ("host-oom", 4, "out of host memory")],
)
def test_exit_code_policy(command, code, fragment, monkeypatch):
    monkeypatch.delenv("LTXBENCH_DEBUG", raising=False)
    result = runner.invoke(_policy_app(), [command])
    assert result.exit_code == code, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 2, lines
    assert lines[0].startswith("error: ") and fragment in lines[0]
    assert lines[1].startswith("hint: ")
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("command", "offload"), [("generate", True), ("bench", False), ("profile", False)])
def test_the_oom_hint_names_only_options_the_command_has(command, offload):
    from ltxbench.cli import _classify

    hint = _classify(RuntimeError("CUDA out of memory. Tried to allocate 2.92 GiB"), command).hint
    assert ("--cpu-offload" in hint) == offload and "--num-frames" in hint and "--memory-budget GIB" in hint


def test_unclassified_exception_is_not_swallowed(monkeypatch):
    monkeypatch.delenv("LTXBENCH_DEBUG", raising=False)
    result = runner.invoke(_policy_app(), ["bug"])
    assert isinstance(result.exception, ZeroDivisionError)


@pytest.mark.parametrize(("command", "code", "exc"), [("usage", 2, "UsageError"), ("check", 1, "CheckFailed"),
                                                      ("environment", 4, "EnvironmentProblem"),
                                                      ("oom", 4, "RuntimeError")])
def test_debug_env_adds_the_traceback_and_keeps_the_exit_code(command, code, exc, monkeypatch):
    monkeypatch.setenv("LTXBENCH_DEBUG", "1")
    result = runner.invoke(_policy_app(), [command])
    assert result.exit_code == code, result.output
    assert "Traceback (most recent call last)" in result.output and f"{exc}: " in result.output
    assert result.output.rstrip().splitlines()[-2].startswith("error: ")  # the usual report follows it


def test_debug_env_leaves_a_bug_a_bug(monkeypatch):
    monkeypatch.setenv("LTXBENCH_DEBUG", "1")
    assert isinstance(runner.invoke(_policy_app(), ["bug"]).exception, ZeroDivisionError)


# --- start-up cost ---------------------------------------------------------------------------------

def test_module_help_runs():
    proc = _python("-m", "ltxbench", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "env" in proc.stdout and "bench" in proc.stdout


def test_help_does_not_import_heavy_modules():
    code = (
        "import sys\n"
        "from ltxbench.cli import app\n"
        "for argv in (['--help'], ['bench', '--help'], ['env', '--help'], ['kernels', '--help']):\n"
        "    try:\n"
        "        app(argv)\n"
        "    except SystemExit as e:\n"
        "        assert e.code in (0, None), (argv, e.code)\n"
        "heavy = sorted(m for m in ('torch', 'pandas', 'numpy', 'diffusers', 'transformers')"
        " if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    proc = _python("-c", code)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("argv", [["kernels", "--help"], ["bench", "micro", "--help"], ["report", "--help"]])
def test_a_command_imports_its_own_module_and_no_other_commands(argv):
    """A run records the package modules it imported as the code it executed (results.provenance): editing one
    command's module must leave the stored results of the others current, so no command imports another's."""
    code = (
        "import sys\n"
        "from ltxbench.cli import COMMANDS, BENCH_COMMANDS, app\n"
        f"argv = {argv!r}\n"
        "try:\n"
        "    app(argv)\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), e.code\n"
        "modules = {m for m, _ in [*COMMANDS.values(), *BENCH_COMMANDS.values()]}\n"
        "print(sorted(m for m in modules if 'ltxbench.cli.' + m in sys.modules))\n"
    )
    proc = _python("-c", code)
    assert proc.returncode == 0, proc.stderr
    own = {"kernels": "kernels", "micro": "bench_micro", "report": "report"}[argv[-2]]
    assert proc.stdout.strip().splitlines()[-1] == repr([own])


def test_help_is_fast():
    timings = []
    for _ in range(3):
        start = time.perf_counter()
        proc = _python("-m", "ltxbench", "--help")
        timings.append(time.perf_counter() - start)
        assert proc.returncode == 0, proc.stderr
    assert min(timings) < 0.5, f"`ltxbench --help` took {min(timings):.2f}s at best of 3 ({timings})"


# --- outputs are checked before any work ---------------------------------------------------------

TINY_LTX = ["--model", "ltx-tiny", "--weights", "random", "--device", "cpu", "--num-frames", "9", "--height", "64",
            "--width", "64", "--steps", "2"]


def _command(kind: str, out: Path) -> list[str]:
    """A command that would run for a while on the CPU (bench micro: exit 4 at the CUDA check) if its outputs
    were not checked first."""
    return {"micro": ["bench", "micro", "rms_norm", "--shapes", "seed", "--output", str(out)],
            "e2e": ["bench", "e2e", *TINY_LTX, "--kernel-provider", "reference", "--output", str(out)],
            "generate": ["generate", "--prompt", "x", *TINY_LTX, "--output", str(out.with_suffix(".mp4"))],
            "profile": ["profile", *TINY_LTX, "--output", str(out)]}[kind]


@pytest.mark.parametrize("kind", ["micro", "e2e", "generate", "profile"])
def test_an_output_under_a_file_is_a_usage_error_before_any_work(kind, tmp_path):
    blocker = tmp_path / "results"
    blocker.write_text("a file where a folder should be")
    result = runner.invoke(app, _command(kind, blocker / "run.json"))
    assert result.exit_code == 2, result.output
    assert f"{blocker} is a file, not a folder" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
@pytest.mark.parametrize("kind", ["micro", "e2e", "generate", "profile"])
def test_an_output_folder_that_refuses_files_is_a_usage_error_before_any_work(kind):
    """/proc passes os.access(W_OK) for root, but no file can be created there: found up front, not after the run."""
    result = runner.invoke(app, _command(kind, Path("/proc/ltxbench-run.json")))
    assert result.exit_code == 2, result.output
    assert "the folder /proc is not writable" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("kind", ["micro", "e2e"])
def test_an_existing_plot_is_refused_before_any_work_unless_forced(kind, tmp_path):
    plot = tmp_path / "p.png"
    plot.write_bytes(b"old plot")
    result = runner.invoke(app, [*_command(kind, tmp_path / "run.json"), "--plot", str(plot)])
    assert result.exit_code == 2, result.output
    assert f"{plot} already exists" in result.output
    assert plot.read_bytes() == b"old plot" and not (tmp_path / "run.json").exists()


def test_generate_refuses_an_existing_csv_before_generating(tmp_path):
    (tmp_path / "v.csv").write_text("old")
    result = runner.invoke(app, _command("generate", tmp_path / "v.json"))
    assert result.exit_code == 2, result.output
    assert "v.csv already exists" in result.output
    assert not (tmp_path / "v.mp4").exists() and (tmp_path / "v.csv").read_text() == "old"


@pytest.mark.parametrize("kind", ["micro", "e2e", "profile"])
def test_an_existing_result_is_refused_before_any_work(kind, tmp_path):
    out = tmp_path / "run.json"
    out.write_text("old result")
    result = runner.invoke(app, _command(kind, out))
    assert result.exit_code == 2, result.output
    assert f"{out} already exists" in result.output and "--force" in result.output
    assert out.read_text() == "old result" and not out.with_suffix(".csv").exists()


@pytest.mark.parametrize("as_json", [True, False])
def test_kernels_lists_every_op_and_never_compiles(as_json, tmp_path, monkeypatch):
    from ltxbench.ops import build
    from ltxbench.ops.registry import SPECS

    monkeypatch.setenv("LTXBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "_loaded", None)  # as in a fresh process, whatever test loaded it before
    monkeypatch.setattr(build, "load", lambda *a, **k: pytest.fail("`kernels` must not build the extension"))
    result = runner.invoke(app, ["kernels", *(["--json"] if as_json else [])], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    if as_json:
        doc = json.loads(result.output)
        assert sorted(k["name"] for k in doc["kernels"]) == sorted(SPECS)
        assert all(k["dtypes"] and k["variants"] for k in doc["kernels"]) and doc["build"]["built"] is False
        by_name = {k["name"]: k for k in doc["kernels"]}  # a variant's widest 16-bit row, where it has one
        assert by_name["gated_residual"]["max_width"] == {"wan-f32": 8192, "wan-f32-per-token": 8192}
    else:
        assert all(name in result.output for name in SPECS) and "not built" in result.output
    assert not (tmp_path / "cache").exists()


# --- build status and wide tables -----------------------------------------------------------------

def _fake_build(home: Path, tag: str, arch: str | None) -> Path:
    """A library in the build cache as a build for `tag` would leave it (BUILD_INFO only where `arch` is given)."""
    import torch

    from ltxbench.ops import build

    version = f"{torch.__version__.split('+')[0]}-cu{(torch.version.cuda or 'none').replace('.', '')}"
    folder = home / ".cache" / "ltxbench" / f"{version}-{tag}"
    folder.mkdir(parents=True)
    (folder / f"{build.EXTENSION_NAME}.so").write_bytes(b"")
    if arch is not None:
        (folder / build.BUILD_INFO).write_text(json.dumps({"arch": arch}))
    return folder


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU report")
@pytest.mark.parametrize("recorded", [True, False])
def test_env_reports_the_test_suites_build_in_its_own_cache_key(recorded, tmp_path, monkeypatch):
    """After `make test-all` (TORCH_CUDA_ARCH_LIST=7.5;8.0;9.0) the library sits under sm75-80-90: `env` without the
    variable must say it is built, and for which archs (from the build's record, or else from the folder's name)."""
    from ltxbench.ops import build

    monkeypatch.setattr(build, "_loaded", None)  # as in a fresh process, whatever test loaded it before
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("LTXBENCH_CACHE", raising=False)
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    folder = _fake_build(tmp_path, "sm75-80-90", "7.5;8.0;9.0" if recorded else None)
    result = runner.invoke(app, ["env"])
    assert result.exit_code == 0, result.output
    line = next(ln for ln in result.output.splitlines() if ln.startswith("kernels"))
    assert f"built for 7.5;8.0;9.0 in {folder}" in line and "not built" not in line
    doc = json.loads(runner.invoke(app, ["env", "--json"]).stdout)["build"]
    assert doc["built"] is True and [b["arch"] for b in doc["builds"]] == ["7.5;8.0;9.0"]


def test_env_says_which_archs_are_built_when_this_arch_is_not(tmp_path, monkeypatch):
    from ltxbench.ops import build

    monkeypatch.setattr(build, "_loaded", None)  # as in a fresh process, whatever test loaded it before
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("LTXBENCH_CACHE", raising=False)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.6")
    _fake_build(tmp_path, "sm75-80-90", "7.5;8.0;9.0")
    result = runner.invoke(app, ["kernels"])
    assert result.exit_code == 0, result.output
    assert "not built for 8.6 yet" in result.output and "built for 7.5;8.0;9.0" in result.output


def test_arch_lists_read_back_from_cache_folder_names():
    from ltxbench.ops import build

    for archs in ("7.5;8.0;9.0", "9.0a", "10.0;12.0"):
        assert build._arch_list_of(build._arch_tag(archs).removeprefix("sm")) == archs


def test_tables_are_wide_where_the_output_is_not_a_terminal(monkeypatch):
    """CI logs and pipes: Rich would render at 80 columns and cut the names (`base…`); COLUMNS still decides."""
    from rich.table import Table

    from ltxbench.cli import _console

    monkeypatch.delenv("COLUMNS", raising=False)
    out = _console.console()
    table = Table()
    for name in ("config", "text_encode ms", "denoise_step ms", "vae_decode ms", "total ms", "it/s", "vs baseline",
                 "vs compile", "compile s", "peak GiB"):
        table.add_column(name)
    table.add_row("optimized+compile", *["1234.5"] * 9)
    with out.capture() as captured:
        out.print(table)
    assert out.width == _console.PIPE_WIDTH and "optimized+compile" in captured.get() and "…" not in captured.get()
    monkeypatch.setenv("COLUMNS", "100")
    assert _console.console().width == 100
