"""`ltxbench compare`: regression/improvement detection, noise gating, env checks, formats (CPU only)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ltxbench.cli import app
from ltxbench.results import io
from ltxbench.results.compare import compare, parse_threshold
from ltxbench.results.schema import make_record, make_result, validate

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "compare-base.json"
MICRO = REPO / "results" / "h100" / "micro-2026-11-22.json"
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
    assert doc["unchanged"] > 0 and len(doc["skipped"]) > 0


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


def test_markdown_has_a_github_table(tmp_path, base):
    new = copy.deepcopy(base)
    _scale(_find(new, "cuda"), 1.2)
    _scale(_find(new, "cuda", "bandwidth"), 1.2)
    result = _invoke(str(FIXTURE), _write(tmp_path, new), "--format", "markdown")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| name |"))
    assert lines[header + 1].startswith("|---")
    rows = [line for line in lines[header + 2:] if line.startswith("|")]
    assert len(rows) == 2
    assert all(line.count("|") == lines[header].count("|") for line in rows)
    assert "regression" in rows[0] and "+20.0%" in rows[0] and "| time |" in rows[0]
    assert "improvement" in rows[1] and "| bandwidth |" in rows[1]
    assert "**Summary:** 1 regression(s), 1 improvement(s)" in result.stdout


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
