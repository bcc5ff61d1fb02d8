"""`ltxbench compare`: regression/improvement detection, noise gating, per-metric rules, inductor cache states, the
repeated-run fixtures a CI relies on, env checks, formats; bench e2e's --compile-cache (CPU only)."""

from __future__ import annotations

import copy
import itertools
import json
import os
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ltxbench.cli import app
from ltxbench.cli.compare import parse_threshold, parse_thresholds
from ltxbench.results import io
from ltxbench.results.compare import DEFAULT_THRESHOLDS, compare, inductor_cache_state
from ltxbench.results.schema import make_record, make_result, validate

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "compare-base.json"
MICRO = REPO / "tests" / "fixtures" / "repeats" / "h200-micro-row-ops" / "keep-1.json"
COLD = REPO / "tests" / "fixtures" / "e2e-ltx-2b-49f-cold-compile.json"  # a real H200 run: both compiles cold
REPEATS = REPO / "tests" / "fixtures" / "repeats"
runner = CliRunner()
WIDE = {"COLUMNS": "250"}  # keep Rich from folding names inside the table

SHAPE = {"bytes": 8388608, "shape": [1, 1024, 2048], "shape_name": "seed-1x1024x2048", "variant": "no-weight"}


def _stats(median, p20, p80, n=50):
    return {"median": median, "p20": p20, "p80": p80, "min": p20 * 0.95, "max": p80 * 1.05, "n": n}


def fixture_doc() -> dict:
    """The stored fixture, rebuilt: tight spreads, three lower-is-better times, one higher-is-better, one n/a."""
    records = [
        make_record("copy", "torch", "uint8", {"bytes": 2147483648}, "time", "ms", "lower",
                    _stats(0.7159, 0.7150, 0.7165)),
        make_record("rms_norm", "cuda", "bf16", SHAPE, "time", "ms", "lower", _stats(0.00912, 0.00890, 0.00930)),
        make_record("rms_norm", "eager", "bf16", SHAPE, "time", "ms", "lower", _stats(0.0414, 0.0410, 0.0418)),
        make_record("rms_norm", "cuda", "bf16", SHAPE, "bandwidth", "GB/s", "higher", _stats(920.0, 910.0, 930.0)),
        make_record("rms_norm", "liger", "bf16", SHAPE, "time", "ms", "lower",
                    {"median": None, "p20": None, "p80": None, "min": None, "max": None, "n": 0},
                    derived={"status": "n/a", "reason": "Liger's RMSNorm needs a weight"}),
    ]
    env = {"gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "sm_count": 132,
                     "memory_gib": 79.18}], "versions": {"torch": "2.11.0", "ltxbench": "0.1.0"}}
    return make_result("micro", ["ltxbench", "bench", "micro", "rms_norm"], {"kernels": ["rms_norm"]}, 0,
                       "2026-01-01T00:00:00+00:00", "2026-01-01T00:01:00+00:00", records, env=env,
                       build={"built": True, "arch": "9.0"})


def _write(tmp_path: Path, doc: dict, name: str = "new.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc), encoding="utf-8")
    return str(path)


def _scale(rec: dict, factor: float) -> None:
    for k in ("median", "p20", "p80", "min", "max"):
        rec["stats"][k] *= factor


def _find(doc: dict, provider: str, metric: str = "time", name: str = "rms_norm") -> dict:
    return next(r for r in doc["records"] if (r["name"], r["provider"], r["metric"]) == (name, provider, metric))


def _invoke(*args: str):
    return runner.invoke(app, ["compare", *args], env=WIDE)


def _json(*args: str) -> tuple[int, dict]:
    result = _invoke(*args, "--format", "json")
    return result.exit_code, json.loads(result.stdout)


@pytest.fixture
def base() -> dict:
    return io.load_result(FIXTURE)


def test_stored_fixture_is_valid_and_reproducible(base):
    assert validate(base) is base
    assert base == json.loads(io.dumps(fixture_doc()))


def test_same_file_is_clean():
    result = _invoke(str(FIXTURE), str(FIXTURE))
    assert result.exit_code == 0, result.output
    assert "0 regression(s)" in result.output and "1 skipped" in result.output
    assert "no median" in result.output  # the n/a record is skipped with a note


def test_real_micro_result_against_itself():
    code, doc = _json(str(MICRO), str(MICRO))
    assert code == 0
    assert doc["regressions"] == [] and doc["improvements"] == [] and doc["added"] == doc["removed"] == []
    assert doc["unchanged"] == sum(r["stats"]["median"] is not None for r in io.load_result(MICRO)["records"])
    assert doc["unchanged"] > 0 and doc["not_comparable"] == []


def test_ten_percent_slowdown_is_a_regression(tmp_path, base):
    new = copy.deepcopy(base)
    slowed = [r for r in new["records"] if r["better"] == "lower" and r["stats"]["median"] is not None]
    for rec in slowed:
        _scale(rec, 1.10)
    path = _write(tmp_path, new)
    result = _invoke(str(FIXTURE), path)
    assert result.exit_code == 1, result.output
    assert "regression" in result.output and "3 regression(s)" in result.output
    for rec in slowed:
        assert rec["provider"] in result.output and rec["name"] in result.output
    assert "+10.0%" in result.output
    code, doc = _json(str(FIXTURE), path)
    assert code == 1 and doc["exit_code"] == 1
    names = {(r["name"], r["provider"], r["metric"]) for r in doc["regressions"]}
    assert names == {(r["name"], r["provider"], r["metric"]) for r in slowed}
    assert all(r["change_pct"] == pytest.approx(10.0) for r in doc["regressions"])
    assert doc["unchanged"] == 1  # the higher-is-better bandwidth record was untouched


def test_slowdown_inside_base_spread_is_not_a_regression(tmp_path, base):
    wide = copy.deepcopy(base)
    rec = _find(wide, "eager")
    rec["stats"].update(p20=0.030, p80=0.050, min=0.025, max=0.060)  # a jittery baseline
    base_path = _write(tmp_path, wide, "base.json")
    new = copy.deepcopy(wide)
    _find(new, "eager")["stats"]["median"] *= 1.10  # 0.04554 < p80 0.050
    code, doc = _json(base_path, _write(tmp_path, new))
    assert code == 0, doc
    assert doc["regressions"] == []
    assert [r["provider"] for r in doc["within_noise"]] == ["eager"]
    # The same slowdown against the fixture's tight spread is a regression: the spread is what saved it.
    code, doc = _json(str(FIXTURE), _write(tmp_path, new, "new2.json"))
    assert code == 1 and [r["provider"] for r in doc["regressions"]] == ["eager"]


def test_improvements_detected(tmp_path, base):
    new = copy.deepcopy(base)
    _scale(_find(new, "cuda"), 0.8)  # time down 20%
    _scale(_find(new, "cuda", "bandwidth"), 1.25)  # bandwidth up 25%
    _scale(_find(new, "eager"), 1.02)  # inside the threshold
    code, doc = _json(str(FIXTURE), _write(tmp_path, new))
    assert code == 0
    assert {(r["provider"], r["metric"]) for r in doc["improvements"]} == {("cuda", "time"), ("cuda", "bandwidth")}
    assert doc["regressions"] == [] and doc["unchanged"] == 2
    result = _invoke(str(FIXTURE), str(tmp_path / "new.json"))
    assert result.exit_code == 0 and "improvement" in result.output and "-20.0%" in result.output


def test_higher_is_better_drop_is_a_regression(tmp_path, base):
    new = copy.deepcopy(base)
    _scale(_find(new, "cuda", "bandwidth"), 0.9)
    code, doc = _json(str(FIXTURE), _write(tmp_path, new))
    assert code == 1 and [(r["provider"], r["metric"]) for r in doc["regressions"]] == [("cuda", "bandwidth")]


@pytest.mark.parametrize(("text", "value"), [("5%", 0.05), ("0.05", 0.05), (" 12.5% ", 0.125), ("0", 0.0)])
def test_threshold_parsing(text, value):
    assert parse_threshold(text) == pytest.approx(value)


def test_threshold_changes_the_verdict(tmp_path, base):
    new = copy.deepcopy(base)
    _scale(_find(new, "eager"), 1.10)
    path = _write(tmp_path, new)
    assert _invoke(str(FIXTURE), path, "--threshold", "5%").exit_code == 1
    assert _invoke(str(FIXTURE), path, "--threshold", "0.05").exit_code == 1
    assert _invoke(str(FIXTURE), path, "--threshold", "15%").exit_code == 0


@pytest.mark.parametrize("bad", ["abc", "5", "-1%", "150%", "nan"])
def test_bad_threshold_is_usage_error(bad):
    result = _invoke(str(FIXTURE), str(FIXTURE), "--threshold", bad)
    assert result.exit_code == 2, result.output
    assert repr(bad) in result.output


def test_bad_format_is_usage_error():
    result = _invoke(str(FIXTURE), str(FIXTURE), "--format", "xml")
    assert result.exit_code == 2 and "xml" in result.output


def test_different_gpu_is_incomparable_unless_allowed(tmp_path, base):
    new = copy.deepcopy(base)
    new["env"]["gpus"][0]["name"] = "NVIDIA H200"
    path = _write(tmp_path, new)
    result = _invoke(str(FIXTURE), path)
    assert result.exit_code == 3, result.output
    assert "NVIDIA H200" in result.output and "--allow-env-mismatch" in result.output
    code, doc = _json(str(FIXTURE), path, "--allow-env-mismatch")
    assert code == 0 and doc["unchanged"] == 4
    assert any("different GPUs" in w for w in doc["warnings"])


def test_no_gpu_counts_as_cpu(tmp_path, base):
    new = copy.deepcopy(base)
    new["env"]["gpus"] = []
    result = _invoke(str(FIXTURE), _write(tmp_path, new))
    assert result.exit_code == 3 and "'cpu'" in result.output


def test_kind_mismatch_is_always_incomparable(tmp_path, base):
    new = copy.deepcopy(base)
    new["kind"] = "e2e"
    result = _invoke(str(FIXTURE), _write(tmp_path, new), "--allow-env-mismatch")
    assert result.exit_code == 3, result.output
    assert "e2e" in result.output


def _run_of(doc: dict, **settings) -> dict:
    """doc as a run with other settings wrote it: in run.config, and in every record's params where they are."""
    doc = copy.deepcopy(doc)
    doc["run"]["config"].update(settings)
    for rec in doc["records"]:
        rec["params"].update({k: v for k, v in settings.items() if k in rec["params"]})
    return doc


@pytest.mark.parametrize(("settings", "words"), [
    ({"model": "llama-3-8b", "family": "llm"}, "not comparable: model ltx-2b vs llama-3-8b"),
    ({"num_frames": 97, "height": 768}, "not comparable: height 512 vs 768; num_frames 49 vs 97"),
    ({"precision": "fp8", "fp8_accumulation": "fast"}, "not comparable: precision bf16 vs fp8"),
    ({"dtype": "fp16"}, "not comparable: dtype bf16 vs fp16"),
])
def test_runs_of_another_model_shape_or_precision_are_not_comparable(tmp_path, settings, words):
    """Not "N measurements missing" (exit 1): the setting that differs, exit 3, whichever file is the base."""
    cold = io.load_result(COLD)
    for pair, expected in (((cold, _run_of(cold, **settings)), words),
                           ((_run_of(cold, **settings), cold), None)):
        result = _invoke(*(_write(tmp_path, doc, f"{i}.json") for i, doc in enumerate(pair)), "--allow-env-mismatch")
        assert result.exit_code == 3, result.output
        line = " ".join(result.output.split())
        assert "not comparable: " in line and "missing" not in line and "family" not in line
        assert expected is None or expected in line, line


def test_records_from_before_precision_was_recorded_match_bf16_ones(tmp_path):
    """Files from before --precision carry no `precision` in their records: they ran bf16, so a new run's bf16
    records are the same measurements (it matched none: every baseline of a stored file counted as lost)."""
    cold = io.load_result(COLD)
    old = copy.deepcopy(cold)
    for rec in old["records"]:
        rec["params"].pop("precision", None)
    old["run"]["config"].pop("precision", None)
    new = copy.deepcopy(cold)
    for rec in new["records"]:
        rec["params"]["precision"] = "bf16"
    code, report = _json(_write(tmp_path, old, "base.json"), _write(tmp_path, new))
    assert code == 0 and report["unchanged"] > 0 and not report["removed"] and not report["added"]
    fp8 = _run_of(new, precision="fp8", fp8_accumulation="fast")  # an FP8 run stays another measurement
    assert _invoke(_write(tmp_path, old, "base.json"), _write(tmp_path, fp8)).exit_code == 3


def test_a_run_under_a_memory_budget_is_not_comparable_with_one_without(tmp_path):
    """Only the budgeted file's records carry memory_budget_gib: no budget is a setting too (exit 3, not "missing")."""
    from ltxbench.configurations import MEMORY_BUDGET

    cold = io.load_result(COLD)
    budgeted = copy.deepcopy(cold)
    for rec in budgeted["records"]:
        rec["params"][MEMORY_BUDGET] = 8.0
    for pair in ((cold, budgeted), (budgeted, cold)):
        result = _invoke(*(_write(tmp_path, doc, f"{i}.json") for i, doc in enumerate(pair)))
        assert result.exit_code == 3, result.output
        assert "memory_budget_gib" in " ".join(result.output.split())


def test_a_profiles_top_kernels_are_listed_not_judged(tmp_path):
    """Which kernels make a profile's top N changes between runs of the same code (ties near the cut): those records
    are not judged or counted as lost; the kernel families are."""
    doc = io.load_result(REPO / "results" / "h200" / "profile-ltx-2b-161f.json")
    new = copy.deepcopy(doc)
    kernels = [r for r in new["records"] if r["name"].startswith("kernel:")]
    new["records"].remove(kernels[0])
    kernels[1]["name"] = "kernel:another_one_now_in_the_top"
    code, report = _json(_write(tmp_path, doc, "base.json"), _write(tmp_path, new))
    assert code == 0 and not report["removed"] and not report["added"] and report["unchanged"] > 0
    assert any("top-kernel record(s) listed" in w for w in report["warnings"])
    slower = copy.deepcopy(doc)
    next(r for r in slower["records"] if r["name"] == "GEMM")["stats"]["median"] *= 1.1
    assert _json(_write(tmp_path, doc, "base.json"), _write(tmp_path, slower))[0] == 1


def test_runs_that_differ_only_in_their_configurations_still_compare(tmp_path):
    """Another --configs, --output or seed is no other workload: the records both runs have are compared."""
    cold = io.load_result(COLD)
    new = _run_of(cold, configs=["baseline"], output="other.json", seed=7)
    new["records"] = [r for r in new["records"] if r["provider"] == "baseline"]
    code, report = _json(_write(tmp_path, cold, "base.json"), _write(tmp_path, new), "--allow-missing")
    assert code == 0 and report["unchanged"] > 0 and report["removed"]


def _on_gpus(doc: dict, world: tuple[int, str] | None) -> dict:
    """doc as a run over world = (GPUs, split) wrote it (None: one process, no `parallel` entry)."""
    doc = copy.deepcopy(doc)
    if world is not None:
        doc["run"]["config"]["parallel"] = {"world_size": world[0], "split": world[1], "gpus": [], "interconnect": None}
    return doc


@pytest.mark.parametrize(("base_world", "new_world", "words"), [
    (None, (2, "cfg"), "base ran on 1 GPU, new on 2 GPUs (split cfg): not comparable"),
    ((2, "cfg"), (2, "ulysses"), "base ran on 2 GPUs (split cfg), new on 2 GPUs (split ulysses): not comparable"),
    ((4, "cfg+ulysses"), None, "base ran on 4 GPUs (split cfg+ulysses), new on 1 GPU: not comparable"),
])
def test_a_different_gpu_count_or_split_is_incomparable(tmp_path, base, base_world, new_world, words):
    paths = [_write(tmp_path, _on_gpus(base, w), f"{i}.json") for i, w in enumerate((base_world, new_world))]
    result = _invoke(*paths, "--allow-env-mismatch")
    assert result.exit_code == 3, result.output
    assert words in result.output and "--parallel" in result.output


def test_runs_over_the_same_gpus_and_split_compare(tmp_path, base):
    doc = _on_gpus(base, (2, "cfg"))
    code, report = _json(_write(tmp_path, doc, "base.json"), _write(tmp_path, doc))
    assert code == 0 and report["unchanged"] == 4


def _fp8(doc: dict, accumulation: str | None) -> dict:
    """doc as an FP8 run with that --fp8-accumulation wrote it (None: a file from before the option)."""
    doc = copy.deepcopy(doc)
    doc["run"]["config"]["precision"] = "fp8"
    if accumulation is not None:
        doc["run"]["config"]["fp8_accumulation"] = accumulation
    return doc


@pytest.mark.parametrize(("base_sum", "new_sum", "code"), [
    (None, "fast", 3), ("fast", "fp32", 3), (None, "fp32", 0), ("fast", "fast", 0)])
def test_fp8_runs_of_another_accumulation_are_incomparable(tmp_path, base, base_sum, new_sum, code):
    """Files from before the option promoted their sums to fp32: they compare with fp32 runs only."""
    paths = [_write(tmp_path, _fp8(base, s), f"{i}.json") for i, s in enumerate((base_sum, new_sum))]
    result = _invoke(*paths, "--allow-env-mismatch")
    assert result.exit_code == code, result.output
    if code == 3:
        words = f"base's FP8 GEMMs accumulated {base_sum or 'fp32'}, new's {new_sum}: not comparable"
        assert words in " ".join(result.output.split()) and "--fp8-accumulation" in result.output


def test_torch_version_difference_is_only_a_warning(tmp_path, base):
    new = copy.deepcopy(base)
    new["env"]["versions"]["torch"] = "2.12.0"
    result = _invoke(str(FIXTURE), _write(tmp_path, new))
    assert result.exit_code == 0, result.output
    assert "torch versions differ" in result.output and "2.12.0" in result.output


@pytest.mark.parametrize("which", ["base", "new"])
def test_unsupported_schema_version_is_incomparable(tmp_path, base, which):
    bad = copy.deepcopy(base)
    bad["schema_version"] = 999
    path = _write(tmp_path, bad)
    args = (path, str(FIXTURE)) if which == "base" else (str(FIXTURE), path)
    result = _invoke(*args)
    assert result.exit_code == 3, result.output
    assert "999" in result.output


def test_missing_or_malformed_file_is_incomparable(tmp_path):
    assert _invoke(str(tmp_path / "nope.json"), str(FIXTURE)).exit_code == 3
    broken = tmp_path / "broken.json"
    broken.write_text("{not json", encoding="utf-8")
    assert _invoke(str(FIXTURE), str(broken)).exit_code == 3


def test_added_and_removed_records_are_listed_and_a_removed_one_fails_unless_allowed(tmp_path, base):
    new = copy.deepcopy(base)
    new["records"] = [r for r in new["records"] if r["provider"] != "eager"]
    extra = copy.deepcopy(_find(new, "cuda"))
    extra["provider"] = "compile"
    new["records"].append(extra)
    path = _write(tmp_path, new)
    code, doc = _json(str(FIXTURE), path)
    assert code == 1 and doc["regressions"] == [] and doc["lost"] == 1
    assert [(r["name"], r["provider"]) for r in doc["removed"]] == [("rms_norm", "eager")]
    assert [(r["name"], r["provider"]) for r in doc["added"]] == [("rms_norm", "compile")]
    result = _invoke(str(FIXTURE), path)
    assert result.exit_code == 1
    assert "removed: rms_norm eager" in result.output and "added: rms_norm compile" in result.output
    assert "1 added, 1 removed" in result.output and "1 measurement(s)" in result.output
    assert "--allow-missing" in result.output
    assert _invoke(str(FIXTURE), path, "--allow-missing").exit_code == 0
    added_only = copy.deepcopy(base)
    added_only["records"].append(extra)
    assert _invoke(str(FIXTURE), _write(tmp_path, added_only, "added.json")).exit_code == 0


def test_a_measurement_that_became_n_a_fails_unless_allowed(tmp_path, base):
    new = copy.deepcopy(base)
    gone = _find(new, "cuda")
    gone["stats"] = {k: None for k in gone["stats"]}
    path = _write(tmp_path, new)
    code, doc = _json(str(FIXTURE), path)
    assert code == 1 and doc["lost"] == 1 and doc["regressions"] == []
    assert _invoke(str(FIXTURE), path, "--allow-missing").exit_code == 0
    # n/a in both files (the fixture's own n/a record) is not a loss: the same file against itself passes
    assert _invoke(str(FIXTURE), str(FIXTURE)).exit_code == 0


@pytest.mark.parametrize("corrupt", ["int-name", "nan-median", "string-median", "inf-p80"])
def test_records_of_the_wrong_type_are_incomparable(tmp_path, base, corrupt):
    new = copy.deepcopy(base)
    rec = _find(new, "cuda")
    field, value = {"int-name": ("name", 7), "nan-median": ("median", float("nan")),
                    "string-median": ("median", "fast"), "inf-p80": ("p80", float("inf"))}[corrupt]
    (rec if field == "name" else rec["stats"])[field] = value
    path = tmp_path / "new.json"
    path.write_text(json.dumps(new), encoding="utf-8")  # json.dumps writes NaN / Infinity, as a hand edit might
    result = _invoke(str(FIXTURE), str(path))
    assert result.exit_code == 3, result.output
    assert ("'name' must be a string" if field == "name" else f"stats.{field}") in result.output


def test_a_file_that_is_not_text_is_incomparable(tmp_path):
    video = tmp_path / "v.mp4"
    video.write_bytes(b"\x00\x00\x00\x18ftypmp42\xff\xfe\x80")
    result = _invoke(str(video), str(FIXTURE))
    assert result.exit_code == 3 and "not UTF-8" in result.output and "Traceback" not in result.output


def test_duplicate_record_keys_are_incomparable(tmp_path, base):
    new = copy.deepcopy(base)
    new["records"].append(copy.deepcopy(new["records"][0]))
    assert _invoke(str(FIXTURE), _write(tmp_path, new)).exit_code == 3


def test_markdown_has_github_tables_regressions_first(tmp_path, base):
    new = copy.deepcopy(base)
    _scale(_find(new, "cuda"), 1.2)
    _scale(_find(new, "cuda", "bandwidth"), 1.2)
    result = _invoke(str(FIXTURE), _write(tmp_path, new), "--format", "markdown")
    assert result.exit_code == 1
    text = result.stdout
    tables = _markdown_tables(text)
    assert [len(rows) for rows in tables] == [1, 3]  # the regression; then improvement + 2 unchanged, collapsed
    assert "+20.0%" in tables[0][0] and "| time |" in tables[0][0] and "5% + base p20-p80" in tables[0][0]
    assert "improvement" in tables[1][0] and "| bandwidth |" in tables[1][0]
    assert text.index(":red_circle:") < text.index("<details>")
    assert "**Summary:** 1 regression(s), 1 improvement(s)" in text


def _markdown_tables(text: str) -> list[list[str]]:
    """The data rows of each GitHub table in `text`, checking every row has the header's column count."""
    lines, tables = text.splitlines(), []
    for i, line in enumerate(lines):
        if line.startswith("| name |"):
            assert lines[i + 1].startswith("|---")
            rows = list(itertools.takewhile(lambda row: row.startswith("|"), lines[i + 2:]))
            assert all(row.count("|") - row.count("\\|") == line.count("|") for row in rows)
            tables.append(rows)
    return tables


def test_json_is_machine_readable(tmp_path):
    code, doc = _json(str(FIXTURE), str(FIXTURE))
    assert code == 0
    assert {"regressions", "improvements", "unchanged", "added", "removed", "threshold", "exit_code"} <= set(doc)
    assert doc["threshold"] == pytest.approx(0.05) and doc["unchanged"] == 4 and doc["exit_code"] == 0
    assert [s["provider"] for s in doc["skipped"]] == ["liger"]


def test_compare_function_directly(base):
    new = copy.deepcopy(base)
    _scale(_find(new, "eager"), 1.5)
    report = compare(base, new, 0.05)
    assert report.exit_code == 1 and [r.provider for r in report.regressions] == ["eager"]
    assert report.regressions[0].change == pytest.approx(0.5)
    assert compare(base, base, 0.05).exit_code == 0


def test_help_has_examples():
    result = runner.invoke(app, ["compare", "--help"])
    assert result.exit_code == 0
    assert "--threshold" in result.output and "--allow-env-mismatch" in result.output
    assert "Examples" in result.output


def test_a_change_at_another_sm_clock_is_flagged_not_excused(base):
    """bench e2e records carry the SM clock of their timed repeats: a regression measured at a clearly lower clock
    still fails (exit 1), with a warning naming both clocks; within 2% or without clocks, no warning."""
    def with_clock(doc, mhz):
        doc = copy.deepcopy(doc)
        for rec in doc["records"]:
            rec.setdefault("derived", {})["gpu_sm_mhz_median"] = mhz
        return doc

    slower = with_clock(base, 1650.0)
    _scale(_find(slower, "eager"), 1.2)
    report = compare(with_clock(base, 1980.0), slower, 0.05)
    assert report.exit_code == 1 and [r.provider for r in report.regressions] == ["eager"]
    clock = [w for w in report.warnings if "SM clock" in w]
    assert len(clock) == 1 and "rms_norm/eager" in clock[0] and "1980 MHz" in clock[0] and "1650 MHz" in clock[0]
    assert report.regressions[0].to_dict()["new_sm_mhz"] == 1650.0
    near = with_clock(base, 1960.0)
    _scale(_find(near, "eager"), 1.2)
    assert not [w for w in compare(with_clock(base, 1980.0), near, 0.05).warnings if "SM clock" in w]
    unclocked = copy.deepcopy(base)
    _scale(_find(unclocked, "eager"), 1.2)
    assert not [w for w in compare(base, unclocked, 0.05).warnings if "SM clock" in w]


# --- repeated runs of the same code: what a CI compares ---------------------------------------------------------

def _groups() -> list[Path]:
    return sorted(p for p in REPEATS.iterdir() if p.is_dir())


def _pairs():
    for group in _groups():
        for a, b in itertools.permutations(sorted(group.glob("*.json")), 2):
            yield pytest.param(a, b, id=f"{group.name}:{a.stem}->{b.stem}")


def _repeat_files():
    for group in _groups():
        for path in sorted(group.glob("*.json")):
            yield pytest.param(path, id=f"{group.name}:{path.stem}")


def _command(doc: dict) -> list[str]:
    argv = doc["run"]["argv"]
    if "--output" in argv:
        argv = argv[:argv.index("--output")] + argv[argv.index("--output") + 2:]
    return [a for a in argv if a != "--force"]


def test_each_fixture_group_holds_runs_of_one_command_on_one_gpu():
    assert len(_groups()) >= 4
    for group in _groups():
        docs = [io.load_result(p) for p in sorted(group.glob("*.json"))]
        assert len(docs) >= 2, group
        assert len({json.dumps(_command(d)) for d in docs}) == 1, group
        assert len({d["env"]["gpus"][0]["name"] for d in docs}) == 1, group


@pytest.mark.parametrize(("base_path", "new_path"), list(_pairs()))
def test_repeated_runs_of_the_same_code_have_no_regression(base_path, new_path):
    code, doc = _json(str(base_path), str(new_path))
    assert code == 0 and doc["regressions"] == [], [
        (r["name"], r["provider"], r["metric"], r["change_pct"], r["rule"]) for r in doc["regressions"]]
    assert doc["lost"] == 0 and doc["added"] == []
    # compile time and first iteration of a compile whose cache state differs or is unrecorded: listed, not counted
    new = {r["provider"]: r for r in _compile_records(io.load_result(new_path))}
    states = [(inductor_cache_state(r), inductor_cache_state(new[r["provider"]]))
              for r in _compile_records(io.load_result(base_path))]
    assert len(doc["not_comparable"]) == 2 * sum(b != n or b == "unknown" for b, n in states)
    assert all(r["rule"].startswith("not comparable: inductor cache") for r in doc["not_comparable"])


@pytest.mark.parametrize("path", list(_repeat_files()))
def test_a_ten_percent_slowdown_of_a_repeated_run_is_caught(tmp_path, path):
    """The same file with every sampled time 10% slower: each record whose base spread lies below its slowed median
    is a regression, and the CLI exits 1; a record whose own spread reaches past +10% (one jittery e2e run) is named
    in a warning instead."""
    doc = io.load_result(path)
    slowed, expected, sampled = copy.deepcopy(doc), set(), 0
    for rec in slowed["records"]:
        if rec["name"] == "compile" or rec["stats"]["median"] is None:
            continue
        assert rec["better"] == "lower" and rec["metric"] == "time"
        sampled += 1
        if rec["stats"]["median"] * 1.10 > rec["stats"]["p80"]:
            expected.add((rec["name"], rec["provider"], rec["dtype"], json.dumps(rec["params"], sort_keys=True)))
        _scale(rec, 1.10)
    report = compare(doc, slowed)
    caught = {(r.name, r.provider, r.dtype, json.dumps(r.params, sort_keys=True)) for r in report.regressions}
    assert caught == expected and caught
    assert all(r.rule == "5% + base p20-p80" and r.change == pytest.approx(0.10) for r in report.regressions)
    spread_warnings = [w for w in report.warnings if "spread wider than the 5% threshold" in w]
    if len(caught) < sampled:
        assert len(spread_warnings) == 1 and int(spread_warnings[0].split()[0]) >= sampled - len(caught)
    assert _invoke(str(path), _write(tmp_path, slowed)).exit_code == 1


# --- inductor cache states and the single-sample rules ----------------------------------------------------------

def _compile_records(doc: dict) -> list[dict]:
    return [r for r in doc["records"] if r["name"] == "compile"]


def _warm_copy(doc: dict, factor: float = 0.25) -> dict:
    """doc with every compile served from inductor's cache: one hit, no miss, a quarter of the time."""
    warm = copy.deepcopy(doc)
    for rec in _compile_records(warm):
        rec["derived"].update(inductor_fxgraph_cache_hit=1, inductor_fxgraph_cache_miss=0)
        rec["derived"]["first_iteration_ms"] *= factor
        _scale(rec, factor)
    return warm


@pytest.mark.parametrize(("hit", "miss", "state"), [(0, 1, "cold"), (0, 3, "cold"), (1, 0, "warm"),
                                                   (2, 1, "partly warm"), (0, 0, "unknown"), (None, None, "unknown")])
def test_inductor_cache_state_comes_from_the_recorded_hits_and_misses(hit, miss, state):
    derived = {} if hit is None else {"inductor_fxgraph_cache_hit": hit, "inductor_fxgraph_cache_miss": miss}
    assert inductor_cache_state({"derived": derived}) == state


@pytest.mark.parametrize("order", ["cold-warm", "warm-cold"])
def test_compiles_in_a_cold_and_a_warm_cache_are_not_comparable(tmp_path, order):
    warm = _write(tmp_path, _warm_copy(io.load_result(COLD)), "warm.json")
    paths = (str(COLD), warm) if order == "cold-warm" else (warm, str(COLD))
    code, doc = _json(*paths)
    assert code == 0 and doc["regressions"] == [] and doc["improvements"] == []
    assert sorted((r["provider"], r["metric"]) for r in doc["not_comparable"]) == [
        ("compile", "first_iteration"), ("compile", "time"), ("optimized+compile", "first_iteration"),
        ("optimized+compile", "time")]
    states = "cold vs warm" if order == "cold-warm" else "warm vs cold"
    assert {r["rule"] for r in doc["not_comparable"]} == {f"not comparable: inductor cache {states}"}
    result = _invoke(*paths)
    assert result.exit_code == 0 and "4 not comparable (not counted)" in result.output
    # the same change between two cold compiles is judged
    slower = copy.deepcopy(io.load_result(COLD))
    for rec in _compile_records(slower):
        _scale(rec, 4.0)
        rec["derived"]["first_iteration_ms"] *= 4.0
    assert len(compare(io.load_result(COLD), slower).regressions) == 4


def test_a_compile_of_unrecorded_cache_state_is_not_comparable():
    cold = io.load_result(COLD)
    old = copy.deepcopy(cold)
    for rec in _compile_records(old):
        del rec["derived"]["inductor_fxgraph_cache_hit"], rec["derived"]["inductor_fxgraph_cache_miss"]
    for base, new, side in ((old, cold, "base"), (cold, old, "new"), (old, old, "base and new")):
        rows = compare(base, new).not_comparable
        assert len(rows) == 4 and {r.rule for r in rows} == {f"not comparable: inductor cache state not recorded in "
                                                             f"{side}"}


@pytest.mark.parametrize(("factor", "verdict"), [(1.185, "unchanged"), (1.30, "regression"), (0.70, "improvement")])
def test_cold_compile_times_are_judged_by_their_own_threshold(factor, verdict):
    """51.25 -> 60.75 s (+18.5%) between two cold compiles is no regression at compile's 25%; +30% is one."""
    cold = io.load_result(COLD)
    new = copy.deepcopy(cold)
    _scale(next(r for r in _compile_records(new) if r["provider"] == "compile"), factor)
    row = next(r for r in compare(cold, new).ordered() if (r.provider, r.metric) == ("compile", "time")
               and r.name == "compile")
    assert (row.verdict, row.rule) == (verdict, "single sample, 25%")


def test_the_compile_threshold_can_be_set(tmp_path):
    cold = io.load_result(COLD)
    new = copy.deepcopy(cold)
    _scale(next(r for r in _compile_records(new) if r["provider"] == "compile"), 1.30)
    path = _write(tmp_path, new)
    result = _invoke(str(COLD), path)
    assert result.exit_code == 1 and "single sample, 25%" in result.output
    code, doc = _json(str(COLD), path, "--threshold", "compile=40%")
    assert code == 0 and doc["thresholds"]["compile"] == pytest.approx(0.40)
    assert {r["rule"] for r in doc["not_comparable"] + doc["improvements"]} <= {"single sample, 40%"}


def test_peak_memory_and_energy_have_their_own_thresholds(tmp_path):
    cold = io.load_result(COLD)
    new = copy.deepcopy(cold)
    total = next(r for r in new["records"] if (r["name"], r["provider"]) == ("total", "optimized"))
    total["derived"]["peak_memory_bytes"] *= 1.03
    total["derived"]["gpu_energy_j_per_iteration"] *= 1.10
    report = compare(cold, new)
    assert [(r.provider, r.metric, r.rule) for r in report.regressions] == [
        ("optimized", "peak_memory", "single sample, 2%")]
    assert report.regressions[0].unit == "GiB" and report.regressions[0].base == pytest.approx(13.63, abs=0.01)
    energy = next(r for r in report.unchanged if (r.provider, r.metric) == ("optimized", "energy"))
    assert energy.rule == "single sample, 15%" and energy.change == pytest.approx(0.10)
    assert not compare(cold, new, {"peak_memory": 0.05}).regressions
    assert [r.metric for r in compare(cold, new, {"peak_memory": 0.05, "energy": 0.05}).regressions] == ["energy"]
    assert _invoke(str(COLD), _write(tmp_path, new), "--threshold", "peak_memory=5%").exit_code == 0


def test_a_figure_only_the_base_has_is_a_warning_not_a_loss(tmp_path):
    cold = io.load_result(COLD)
    new = copy.deepcopy(cold)
    for rec in new["records"]:
        rec["derived"].pop("gpu_energy_j_per_iteration", None)  # e.g. a machine whose NVML has no energy counter
    code, doc = _json(str(COLD), _write(tmp_path, new))
    assert code == 0 and doc["lost"] == 0
    assert sum("energy is in base only" in w for w in doc["warnings"]) == 4


def test_thresholds_per_metric():
    assert parse_thresholds(None) == DEFAULT_THRESHOLDS
    assert parse_thresholds(["3%", "compile=40%", "energy=0.1"]) == {
        **DEFAULT_THRESHOLDS, "time": pytest.approx(0.03), "compile": pytest.approx(0.40), "energy": 0.1}


@pytest.mark.parametrize(("entries", "needle"), [
    (["latency=5%"], "unknown metric 'latency'"), (["compile=abc"], "--threshold compile: 'abc'"),
    (["5%", "time=3%"], "time is given twice"), (["peak_memory=120%"], "'120%' must be between")])
def test_bad_metric_thresholds_are_usage_errors(entries, needle):
    result = _invoke(str(FIXTURE), str(FIXTURE), *[arg for entry in entries for arg in ("--threshold", entry)])
    assert result.exit_code == 2, result.output
    assert needle in result.output


def test_json_rows_name_their_rule(tmp_path, base):
    new = copy.deepcopy(base)
    _scale(_find(new, "eager"), 1.5)
    code, doc = _json(str(FIXTURE), _write(tmp_path, new), "--threshold", "8%")
    assert code == 1 and [r["rule"] for r in doc["regressions"]] == ["8% + base p20-p80"]
    assert doc["thresholds"] == {**DEFAULT_THRESHOLDS, "time": pytest.approx(0.08)}


# --- layouts ----------------------------------------------------------------------------------------------------

def test_markdown_shows_regressions_then_not_comparable_then_the_rest_collapsed(tmp_path):
    cold = io.load_result(COLD)
    new = _warm_copy(cold)
    _scale(next(r for r in new["records"] if (r["name"], r["provider"]) == ("denoise_step", "optimized")), 1.10)
    result = _invoke(str(COLD), _write(tmp_path, new), "--format", "markdown")
    assert result.exit_code == 1
    text = result.stdout
    regressions, not_comparable, rest = _markdown_tables(text)
    assert len(regressions) == 1 and "| denoise_step | optimized |" in regressions[0]
    assert "5% + base p20-p80" in regressions[0] and "+10.0%" in regressions[0]
    assert len(not_comparable) == 4 and all("inductor cache cold vs warm" in row for row in not_comparable)
    assert text.index("regression(s)\n") < text.index("not comparable (not counted)\n") < text.index("<details>")
    assert text.index("<details>") < text.index(rest[0]) < text.index("</details>")
    assert all("batch_size" not in row for row in regressions + not_comparable + rest)  # said once, above
    assert text.count("batch_size=1") == 1


def test_the_human_table_keeps_a_row_on_one_line_in_an_80_column_log(tmp_path):
    base_path = REPEATS / "h100-e2e-ltx-2b-49f-compile" / "ab-base-1.json"
    new = io.load_result(base_path)
    for rec in new["records"]:
        if rec["name"] == "denoise_step":
            _scale(rec, 1.10)
    result = runner.invoke(app, ["compare", str(base_path), _write(tmp_path, new)], env={"COLUMNS": "80"})
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    for provider in ("compile", "optimized+compile"):
        row = [line for line in lines if "denoise_step" in line and f" {provider} " in line]
        assert len(row) == 1 and "+10.0%" in row[0] and "regression" in row[0] and "5% + base p20-p80" in row[0]
    assert sum("batch_size=1" in line for line in lines) == 1


# --- bench e2e --compile-cache and make bench-check -------------------------------------------------------------

def test_a_cold_compile_cache_is_private_to_the_run_and_removed_after(monkeypatch):
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    from ltxbench.bench import e2e

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/ltxbench-shared-inductor-cache")
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    with e2e.inductor_cache("cold") as directory:
        assert Path(directory).is_dir() and not any(Path(directory).iterdir())
        assert cache_dir() == directory  # where inductor looks now
        assert os.environ["TRITON_CACHE_DIR"] == str(Path(directory) / "triton")
        (Path(directory) / "entry").write_text("compiled", encoding="utf-8")
    assert not Path(directory).exists()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/tmp/ltxbench-shared-inductor-cache"
    assert "TRITON_CACHE_DIR" not in os.environ
    with pytest.raises(RuntimeError), e2e.inductor_cache("cold") as directory:
        raise RuntimeError("a compile failed")
    assert not Path(directory).exists()
    with e2e.inductor_cache("shared") as directory:
        assert directory is None and os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/tmp/ltxbench-shared-inductor-cache"


def test_bench_e2e_compile_cache_cold_runs_in_a_private_cache_and_records_it(tmp_path, monkeypatch):
    import ltxbench.models.ltx as ltx_models

    seen = {}

    def fake_bench(self, pipe, settings, log):
        seen["dir"] = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        seen["existed"] = Path(seen["dir"]).is_dir()
        return {"compile": {"step_ms": [1.0, 1.1], "total_ms": [2.0], "compile_s": 3.0, "first_iteration_ms": 3002.0,
                            "compile_cache": {"fxgraph_cache_hit": 0, "fxgraph_cache_miss": 1},
                            "peak_memory_bytes": None, "injection": {"applied": False}}}

    monkeypatch.setattr(ltx_models.LTXVideoFamily, "build", lambda self, settings: object())
    monkeypatch.setattr(ltx_models.LTXVideoFamily, "bench", fake_bench)
    out = tmp_path / "cold.json"
    result = runner.invoke(app, ["bench", "e2e", "--model", "ltx-tiny", "--weights", "random", "--device", "cpu",
                                 "--num-frames", "9", "--height", "64", "--width", "64", "--steps", "2",
                                 "--configs", "compile", "--compile-cache", "cold", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert seen["existed"] and seen["dir"] != os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    assert not Path(seen["dir"]).exists()
    doc = io.load_result(out)
    argv = doc["run"]["argv"]
    assert doc["run"]["config"]["compile_cache"] == "cold" and argv[argv.index("--compile-cache") + 1] == "cold"
    assert all("compile_cache" not in r["params"] for r in doc["records"])  # records still match a shared-cache run
    assert inductor_cache_state(_compile_records(doc)[0]) == "cold"
    bad = runner.invoke(app, ["bench", "e2e", "--model", "ltx-tiny", "--device", "cpu", "--compile-cache", "warm"])
    assert bad.exit_code == 2 and "--compile-cache 'warm'" in bad.output


def _make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", *args], cwd=REPO, capture_output=True, text=True,
                          check=False)


def test_make_bench_check_runs_the_pinned_benchmarks_and_compares_with_the_stored_baselines():
    plan = _make("-n", "bench-check", "GPU=h100", "PYTHON=py")
    assert plan.returncode == 0, plan.stderr
    commands = plan.stdout
    assert ("py -m ltxbench bench e2e --model ltx-2b --weights random --num-frames 49 --steps 10 --phase transformer "
            "--configs optimized,compile --compile-cache cold --output results/runs/bench-check/e2e.json") in commands
    assert "py -m ltxbench bench micro " in commands and "--output results/runs/bench-check/micro.json" in commands
    assert "base=results/h100/bench-check-$part.json; new=results/runs/bench-check/$part.json" in commands
    assert "py -m ltxbench compare $base $new" in commands
    baseline = _make("-n", "bench-check-baseline", "GPU=h200", "PYTHON=py").stdout
    assert "results/h200/bench-check-$part.$ext" in baseline and "--compile-cache cold" in baseline


@pytest.mark.parametrize(("gpu", "needle"), [("", "set GPU"),
                                             ("h999", "no baseline results/h999/bench-check-e2e.json")])
def test_make_bench_check_stops_before_running_anything_without_its_baselines(gpu, needle):
    result = _make("bench-check", f"GPU={gpu}", "PYTHON=false")
    assert result.returncode != 0 and needle in result.stderr
    assert "ltxbench bench" not in result.stdout


@pytest.mark.parametrize(("cosine", "passed", "verdict"), [
    (0.99960, True, "unchanged"),     # error 4.0e-4 against 3.7e-4: within 25%
    (0.99950, True, "regression"),    # error 5.0e-4: 35% more
    (0.99990, True, "improvement"),
    (0.99962, False, "regression"),   # the new run failed its own gate
])
def test_the_fp8_error_is_judged_on_one_minus_cosine_and_the_runs_gate(cosine, passed, verdict):
    def doc(value, ok):
        record = make_record("step_error", "optimized-fp8", "fp8", {"model": "ltx-2b"}, "cosine_vs_bf16", "1",
                             "higher", _stats(value, value, value, n=1), check={"passed": ok, "min_cosine": 0.995})
        return make_result("e2e", ["ltxbench"], {}, 0, "2026-01-01T00:00:00+00:00", "2026-01-01T00:01:00+00:00",
                           [record], env=fixture_doc()["env"])

    report = compare(doc(0.99963, True), doc(cosine, passed))
    assert [row.verdict for row in report.ordered()] == [verdict]
