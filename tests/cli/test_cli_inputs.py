"""What a new user mistypes, refused at once in one line (exit 2, or 4 for a missing package) before torch loads:
sizes beyond the models' bounds, a near miss of a preset, options of another family, --gpus on the CPU, outputs
that are folders or plots of no known format, a missing mp4 writer; and Ctrl-C in one line (exit 130)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ltxbench.cli import app
from ltxbench.models import ltx

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()
TINY = ["--model", "ltx-tiny", "--weights", "random", "--device", "cpu", "--num-frames", "9", "--height", "64",
        "--width", "64", "--steps", "2"]
COMMANDS = {"generate": ["generate", "--prompt", "a fox"], "bench e2e": ["bench", "e2e"], "profile": ["profile"]}


def _out(command: str, tmp_path: Path) -> str:
    return str(tmp_path / ("v.mp4" if command == "generate" else "r.json"))


def _refused(result, code: int, *fragments: str) -> str:
    """The one-line error (and its hint) of a refused command: the exit code, every fragment in the error line."""
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == code, result.output
    assert lines and lines[0].startswith("error: ") and len(lines) <= 2, lines
    assert all(f in lines[0] for f in fragments), lines
    assert "Traceback" not in result.output
    return lines[0]


@pytest.fixture
def never_built(monkeypatch):
    """A command that gets as far as building its model fails the test."""
    from ltxbench.models import families

    for family in families():
        monkeypatch.setattr(type(family), "build", lambda *a, **k: pytest.fail("built a model"))


# --- 1. sizes beyond the bounds the video families declare ------------------------------------------------

@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(("flag", "value", "allowed"), [
    ("--num-frames", "100001", "allowed: 1 to 1025"), ("--height", "100000", "allowed: 32 to 4096"),
    ("--width", "4128", "allowed: 32 to 4096")])
def test_a_size_beyond_the_bounds_is_one_line_exit_2(command, flag, value, allowed, tmp_path, never_built):
    result = runner.invoke(app, [*COMMANDS[command], *TINY, flag, value, "--output", _out(command, tmp_path)])
    _refused(result, 2, f"{flag} {value} is above LTX-Video's maximum", allowed)
    assert not list(tmp_path.iterdir())


def test_the_bounds_are_declared_on_the_options_and_shown_in_the_help():
    from ltxbench.models import family_of

    for model, low in (("ltx-tiny", 32), ("ltx2-tiny", 64)):
        bounds = {o.name: o.bounds for o in family_of(model).options if o.bounds}
        assert bounds == {"num_frames": (1, 1025), "height": (low, 4096), "width": (low, 4096), "steps": (1, 10_000)}
    text = " ".join(runner.invoke(app, ["bench", "e2e", "--help"]).output.split())
    assert "Frames: 8k+1, at most 1025 (LTX-2, LTX-Video); Frames: 4k+1, at most 1025 (Wan)" in text
    assert "a multiple of 32, at most 4096 (LTX-2, LTX-Video)" in text
    assert "a multiple of 16, at most 4096 (Wan)" in text


def test_the_largest_allowed_sizes_pass_the_bounds():
    from ltxbench.models import family_of

    settings = family_of("ltx-tiny").settings("bench e2e", model="ltx-tiny", weights="random", num_frames=1025,
                                              height=4096, width=4096)
    assert (settings.num_frames, settings.height, settings.width) == (1025, 4096, 4096)


# --- 2. a mistyped preset --------------------------------------------------------------------------------

@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(("model", "weights"), [("ltx-tiy", []), ("ltx_tiny", ["--weights", "random"]),
                                                ("LTX-Tiny", ["--weights", "pretrained"])])
def test_a_near_miss_of_a_preset_is_named_with_the_preset(command, model, weights, tmp_path, never_built):
    args = [*COMMANDS[command], "--model", model, *weights, "--device", "cpu", "--output", _out(command, tmp_path)]
    line = _refused(runner.invoke(app, args), 2, f"unknown model {model!r}; did you mean ltx-tiny?")
    assert "--weights random" not in line


def test_random_weights_of_a_name_that_is_no_preset_are_refused(tmp_path, never_built):
    args = ["bench", "e2e", "--model", "foo", "--weights", "random", "--device", "cpu", "--output",
            str(tmp_path / "r.json")]
    _refused(runner.invoke(app, args), 2, "unknown model 'foo'", "--weights random")


def test_hub_ids_paths_and_far_names_are_not_taken_for_typos(tmp_path, monkeypatch):
    from ltxbench.cli._validate import known_model

    for model in ("ltx-tiny", "Lightricks/LTX-Video", "owner/ltx-tiy", "gpt2", "./ltx-tiy.json"):
        known_model(model, None)  # a preset, hub ids (even close ones), a legacy hub id, a path (checked later)
    known_model("Lightricks/LTX-Video", "random")  # random weights from a hub id's config
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ltx-tiy").mkdir()
    known_model("ltx-tiy", "random")  # an existing directory of that name


# --- 3. --gpus on the CPU, and options of another family --------------------------------------------------

@pytest.mark.parametrize("command", COMMANDS)
def test_gpus_on_the_cpu_is_refused_before_any_process(command, tmp_path, monkeypatch):
    from ltxbench.parallel import launch

    monkeypatch.delenv("LTXBENCH_CPU_RANKS", raising=False)
    monkeypatch.setattr(launch, "relaunch", lambda *a, **k: pytest.fail("started processes"))
    result = runner.invoke(app, [*COMMANDS[command], *TINY, "--gpus", "2", "--output", _out(command, tmp_path)])
    _refused(result, 2, "--gpus 2 needs --device cuda", "--device cpu")


@pytest.mark.parametrize(("command", "args", "words"), [
    ("bench e2e", ["--model", "llama-tiny", "--num-frames", "9"], "--num-frames does not apply to LLM (llama-tiny)"),
    ("profile", ["--model", "llama-tiny", "--image", "first.png"], "--image does not apply to LLM (llama-tiny)"),
    ("bench e2e", ["--model", "llama-tiny", "--fps", "24"], "--frame-rate/--fps does not apply to LLM"),
    ("generate", [*TINY, "--stg-scale", "1.0"], "--stg-scale does not apply to LTX-Video (ltx-tiny)"),
    ("bench e2e", ["--model", "ltx-2b", "--audio-guidance-scale", "5"],
     "--audio-guidance-scale does not apply to LTX-Video (ltx-2b)"),
    ("bench e2e", [*TINY, "--prompt-lengths", "64"], "--prompt-lengths does not apply to LTX-Video (ltx-tiny)"),
    ("bench e2e", ["--model", "ltx2-tiny", "--no-cross-kv-cache"],
     "--no-cross-kv-cache does not apply to LTX-2 (ltx2-tiny)"),
])
def test_an_option_of_another_family_is_refused_naming_it(command, args, words, tmp_path, never_built):
    result = runner.invoke(app, [*COMMANDS[command], "--device", "cpu", *args, "--output", _out(command, tmp_path)])
    _refused(result, 2, words)


def test_the_options_a_family_does_not_take_are_not_refused_when_left_out(tmp_path, monkeypatch):
    """Every command takes the union of the families' options: their defaults reach every family, unrefused."""
    from ltxbench.models import family_of

    class Built(Exception):
        pass

    def build(self, settings):
        raise Built

    monkeypatch.setattr(type(family_of("llama-tiny")), "build", build)
    result = runner.invoke(app, ["bench", "e2e", "--model", "llama-tiny", "--device", "cpu", "--output",
                                 str(tmp_path / "r.json")])
    assert isinstance(result.exception, Built), result.output


# --- 4. outputs: folders, plot formats, the mp4 writer ---------------------------------------------------

@pytest.mark.parametrize(("argv", "flag"), [
    (["generate", "--prompt", "a fox", *TINY, "--output", "{dir}"], "--output"),
    (["bench", "e2e", *TINY, "--output", "{dir}"], "--output"),
    (["bench", "micro", "rms_norm", "--shapes", "seed", "--output", "{dir}"], "--output"),
    (["profile", *TINY, "--output", "{dir}"], "--output"),
    (["bench", "e2e", *TINY, "--plot", "{dir}"], "--plot"),
    (["bench", "micro", "rms_norm", "--shapes", "seed", "--plot", "{dir}"], "--plot"),
])
def test_an_output_that_is_a_folder_is_refused(argv, flag, tmp_path, never_built):
    folder = tmp_path / "results"
    folder.mkdir()
    result = runner.invoke(app, [a.replace("{dir}", str(folder)) for a in argv])
    _refused(result, 2, f"{flag} {folder} is a directory; give a file path")
    assert list(tmp_path.iterdir()) == [folder] and not list(folder.iterdir())


@pytest.mark.parametrize("argv", [["bench", "e2e", *TINY], ["bench", "micro", "rms_norm", "--shapes", "seed"]])
def test_a_plot_of_no_known_format_is_refused_before_the_run(argv, tmp_path, never_built):
    result = runner.invoke(app, [*argv, "--output", str(tmp_path / "r.json"), "--plot", str(tmp_path / "plot.txt")])
    _refused(result, 2, "plot.txt must end in .png, .svg or .pdf")
    assert not list(tmp_path.iterdir())


def test_the_plot_formats_matplotlib_writes_are_accepted():
    from ltxbench.cli._validate import check_plot

    for name in ("p.png", "p.SVG", "p.pdf"):
        check_plot(name)


def test_a_plot_without_matplotlib_is_exit_4_before_the_run(tmp_path, monkeypatch, never_built):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    result = runner.invoke(app, ["bench", "e2e", *TINY, "--output", str(tmp_path / "r.json"), "--plot",
                                 str(tmp_path / "p.png")])
    _refused(result, 4, "--plot needs matplotlib")
    assert "pip install matplotlib" in result.output


@pytest.mark.parametrize("model", ["ltx-tiny", "ltx2-tiny"])
def test_a_missing_mp4_writer_is_exit_4_before_the_model_is_built(model, tmp_path, monkeypatch, never_built):
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # import imageio_ffmpeg raises ImportError
    out = tmp_path / "v.mp4"
    result = runner.invoke(app, ["generate", "--prompt", "a fox", *TINY[:1], model, *TINY[2:], "--output", str(out)])
    _refused(result, 4, f"cannot write the mp4 {out}: imageio-ffmpeg is not installed")
    assert "pip install imageio-ffmpeg" in result.output and not list(tmp_path.iterdir())


def test_matplotlib_is_a_dependency_and_the_plot_extra_still_installs():
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert "matplotlib" in project["dependencies"]
    assert project["optional-dependencies"]["plot"] == []  # `pip install ltxbench[plot]` keeps working


# --- all of them before torch, in one process --------------------------------------------------------------

def test_every_refusal_comes_before_torch_is_imported(tmp_path):
    """The refusals above in one fresh interpreter: each exits 2 and none of them imports torch, diffusers or
    transformers (no model, no hub lookup: instant)."""
    folder = tmp_path / "results"
    folder.mkdir()
    argvs = [["generate", "--prompt", "x", *TINY, "--num-frames", "100001"],
             ["bench", "e2e", *TINY, "--height", "100000"],
             ["profile", "--model", "ltx-tiy", "--device", "cpu"],
             ["bench", "e2e", "--model", "ltx_tiny", "--weights", "random", "--device", "cpu"],
             ["bench", "e2e", *TINY, "--gpus", "2"],
             ["bench", "e2e", "--model", "llama-tiny", "--device", "cpu", "--num-frames", "9"],
             ["bench", "e2e", "--model", "ltx-2b", "--stg-scale", "2"],
             ["generate", "--prompt", "x", *TINY, "--output", str(folder)],
             ["bench", "e2e", *TINY, "--plot", "plot.txt"]]
    code = ("import sys; from typer.testing import CliRunner; from ltxbench.cli import app\n"
            f"codes = [CliRunner().invoke(app, argv).exit_code for argv in {argvs!r}]\n"
            "print(*codes, *(m in sys.modules for m in ('torch', 'diffusers', 'transformers')))")
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**{k: v for k, v in os.environ.items() if k != "LTXBENCH_CPU_RANKS"}, "PYTHONPATH": path}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout.split() == ["2"] * len(argvs) + ["False"] * 3, proc.stdout + proc.stderr


# --- 6. Ctrl-C: one line, exit 130 -----------------------------------------------------------------------------

def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def _generate_interrupted_writes_nothing(tmp_path) -> None:
    """`generate` of the tiny model into tmp_path, interrupted somewhere: one line, exit 130, nothing left there."""
    result = runner.invoke(app, ["generate", "--prompt", "a fox", *TINY, "--no-optimized-kernels", "--output",
                                 str(tmp_path / "v.mp4")])
    assert result.exit_code == 130, result.output
    assert [ln for ln in result.output.splitlines() if ln.strip()] == ["interrupted: nothing written"]
    assert not list(tmp_path.iterdir())


def test_ctrl_c_during_generate_says_nothing_was_written(tmp_path, monkeypatch):
    monkeypatch.setattr(ltx.LTXVideoFamily, "build", lambda self, settings: object())
    monkeypatch.setattr(ltx.LTXVideoFamily, "generate", _interrupt)
    _generate_interrupted_writes_nothing(tmp_path)


@pytest.mark.parametrize(("flag", "value", "words"), [
    ("--steps", "100000000000", "--steps 100000000000 is above LTX-Video's maximum of 10000"),
    ("--seed", "99999999999999999999", "--seed 99999999999999999999 is above the maximum of 18446744073709551615"),
])
def test_numbers_past_what_the_run_can_take_are_refused_in_one_line(flag, value, words, tmp_path):
    """They ended in a numpy memory error or an overflow traceback, exit 1."""
    result = runner.invoke(app, ["bench", "e2e", *TINY, flag, value, "--output", str(tmp_path / "r.json")])
    assert result.exit_code == 2, result.output
    assert words in " ".join(result.output.split()) and not list(tmp_path.iterdir())


def test_host_memory_running_out_is_an_environment_problem():
    from ltxbench.cli import _classify

    for error in (MemoryError(), type("_ArrayMemoryError", (MemoryError,), {})("Unable to allocate 80 GiB")):
        problem = _classify(error)
        assert problem is not None and problem.exit_code == 4 and "out of host memory" in problem.message


@pytest.mark.parametrize(("command", "model", "flag"), [
    ("generate", "ltx-tiny", "--guidance-scale"), ("bench e2e", "ltx-tiny", "--guidance-scale"),
    ("bench e2e", "ltx-tiny", "--memory-budget"), ("bench e2e", "ltx2-tiny", "--audio-guidance-scale"),
    ("profile", "wan-tiny", "--guidance-scale"),
])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_float_that_is_not_finite_is_refused_naming_the_flag(command, model, flag, value, tmp_path):
    """typer parses nan and inf as floats, which pass every `< 0` check: a video of NaN frames, exit 0."""
    argv = [*COMMANDS[command], "--model", model, "--weights", "random", "--device", "cpu", flag, value]
    result = runner.invoke(app, [*argv, "--output", _out(command, tmp_path)])
    assert result.exit_code == 2, result.output
    assert f"{flag} {value} must be a finite number" in " ".join(result.output.split())
    assert not list(tmp_path.iterdir())


def test_ctrl_c_while_the_mp4_is_written_leaves_no_part_of_it(tmp_path, monkeypatch):
    """The mp4 is written under another name and renamed when whole: interrupted half way, nothing is left."""
    import diffusers.utils

    def half_written(frames, path, fps=None, **kwargs):
        Path(path).write_bytes(b"\x00\x00\x00\x18ftypmp42")
        raise KeyboardInterrupt

    monkeypatch.setattr(diffusers.utils, "export_to_video", half_written)
    _generate_interrupted_writes_nothing(tmp_path)


@pytest.mark.parametrize("command", ["bench e2e", "profile"])
def test_ctrl_c_while_the_model_is_built_says_nothing_was_written(command, tmp_path, monkeypatch):
    monkeypatch.setattr(ltx.LTXVideoFamily, "build", _interrupt)
    result = runner.invoke(app, [*COMMANDS[command], *TINY, "--output", _out(command, tmp_path)])
    assert result.exit_code == 130, result.output
    assert [ln for ln in result.output.splitlines() if ln.strip()] == ["interrupted: nothing written"]
    assert not list(tmp_path.iterdir())


# --- choices declared on the options ---------------------------------------------------------------------

@pytest.mark.parametrize(("command", "flag", "value"), [
    (["bench", "e2e"], "--compile-mode", "fast"), (["profile"], "--compile-mode", "fast"),
    (["bench", "e2e"], "--compile-scope", "block"), (["profile"], "--compile-scope", "block"),
    (["bench", "e2e"], "--compile-cache", "warm"), (["bench", "e2e"], "--phase", "decode"),
    (["profile"], "--phase", "decode"),
])
def test_a_value_outside_the_declared_choices_is_refused_naming_the_flag(command, flag, value, tmp_path):
    result = runner.invoke(app, [*command, *TINY, flag, value, "--output", str(tmp_path / "x.json")])
    assert result.exit_code == 2, result.output
    assert f"{flag} '{value}' is not one of" in result.output and not list(tmp_path.iterdir())


def test_every_declared_choice_is_checked_before_the_command_runs():
    from ltxbench.cli.options import check_choices, declared
    from ltxbench.errors import UsageError

    for command in ("generate", "bench e2e", "profile"):
        for option in declared(command):
            if option.choices:
                check_choices(command, {option.name: option.choices[0]})
                with pytest.raises(UsageError, match=f"{option.flags[0]} 'nope' is not one of"):
                    check_choices(command, {option.name: "nope"})


def test_an_output_naming_a_folder_is_refused_before_the_run(tmp_path):
    """A trailing slash names a folder (Path() would drop it: ./name.json), and a folder in the way of the JSON or
    CSV is found before the run, --force or not (it was found after the whole run)."""
    argv = ["bench", "e2e", *TINY]
    result = runner.invoke(app, [*argv, "--output", f"{tmp_path}/new/"])
    assert result.exit_code == 2 and "names a folder" in result.output, result.output
    assert not (tmp_path / "new").exists() and not (tmp_path / "new.json").exists()
    (tmp_path / "r.csv").mkdir()
    result = runner.invoke(app, [*argv, "--output", str(tmp_path / "r.json"), "--force"])
    assert result.exit_code == 2 and "r.csv: it is a folder" in " ".join(result.output.split()), result.output
    assert not (tmp_path / "r.json").exists()
