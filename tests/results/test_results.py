"""Result documents: statistics, schema validation, atomic no-clobber writes, CSV flattening (CPU only)."""

from __future__ import annotations

import copy
import csv
import json
import math
import os
import re

import pytest

from ltxbench.errors import IncomparableResults, UsageError
from ltxbench.results import io
from ltxbench.results.schema import (
    SCHEMA,
    SCHEMA_VERSION,
    make_record,
    make_result,
    record_key,
    stats_from_samples,
    utc_now,
    validate,
)

FAKE_ENV = {"gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "capability": "9.0"}], "versions": {}}
FAKE_BUILD = {"built": False, "arch": None}


def _record(provider="ltxbench", tokens=4096, median=1.0, **kw):
    stats = stats_from_samples([median * 0.9, median, median * 1.1])
    return make_record("rmsnorm", provider, "bf16", {"tokens": tokens, "hidden": 2048}, "latency", "ms",
                       "lower", stats, **kw)


def _doc(records=None, env=FAKE_ENV):
    records = records if records is not None else [
        _record("ltxbench", derived={"gbps": 812.5}, check={"passed": True, "max_abs_err": 0.0078}),
        _record("torch", median=2.0),
    ]
    return make_result("micro", ["bench", "micro", "rmsnorm"], {"shapes": "ltx"}, 0, utc_now(), utc_now(),
                       records, env=env, build=FAKE_BUILD)


# --- statistics -------------------------------------------------------------------------------------

def test_stats_known_values_and_interpolation():
    s = stats_from_samples([5.0, 1.0, 4.0, 2.0, 3.0])  # unsorted on purpose
    assert s == pytest.approx({"median": 3.0, "p20": 1.8, "p80": 4.2, "min": 1.0, "max": 5.0, "n": 5})
    assert isinstance(s["n"], int)
    # Even count: median is the mean of the middle two; p20 of [10,20,30,40] lies 0.6 of the way 10->20.
    s = stats_from_samples([40, 10, 30, 20])
    assert s["median"] == pytest.approx(25.0)
    assert s["p20"] == pytest.approx(16.0)
    assert s["p80"] == pytest.approx(34.0)
    single = stats_from_samples([7.5])
    assert single == {"median": 7.5, "p20": 7.5, "p80": 7.5, "min": 7.5, "max": 7.5, "n": 1}


def test_stats_rejects_empty():
    with pytest.raises(ValueError):
        stats_from_samples([])


def test_make_record_validates():
    stats = stats_from_samples([1.0])
    with pytest.raises(ValueError, match="better"):
        make_record("x", "p", "bf16", {}, "latency", "ms", "faster", stats)
    with pytest.raises(ValueError, match="p80"):
        make_record("x", "p", "bf16", {}, "latency", "ms", "lower", {k: 1 for k in ("median", "p20", "n")})


def test_record_key_ignores_param_order_and_separates_providers():
    a = make_record("x", "p", "bf16", {"a": 1, "b": 2}, "latency", "ms", "lower", stats_from_samples([1]))
    b = make_record("x", "p", "bf16", {"b": 2, "a": 1}, "latency", "ms", "lower", stats_from_samples([9]))
    c = make_record("x", "q", "bf16", {"a": 1, "b": 2}, "latency", "ms", "lower", stats_from_samples([1]))
    assert record_key(a) == record_key(b)
    assert record_key(a) != record_key(c)


def test_utc_now_is_iso_utc():
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?\+00:00", utc_now())


# --- validation ------------------------------------------------------------------------------------

def test_validate_accepts_good_doc():
    doc = _doc()
    assert validate(doc) is doc
    assert doc["schema"] == SCHEMA and doc["schema_version"] == SCHEMA_VERSION
    assert set(doc["run"]) == {"argv", "config", "seed", "started_at", "finished_at"}


def test_validate_rejects_wrong_schema():
    doc = _doc()
    doc["schema"] = "something.else"
    with pytest.raises(IncomparableResults) as info:
        validate(doc)
    assert info.value.exit_code == 3


@pytest.mark.parametrize("version", [999, "1", 1.0, None, True])
def test_validate_rejects_unknown_schema_version(version):
    doc = _doc()
    doc["schema_version"] = version
    with pytest.raises(IncomparableResults) as info:
        validate(doc)
    assert info.value.exit_code == 3
    assert repr(version) in info.value.message and str(SCHEMA_VERSION) in info.value.message


@pytest.mark.parametrize("path", [("records",), ("run",), ("run", "seed"), ("records", 1, "stats"),
                                  ("records", 0, "stats", "median"), ("records", 1, "better")])
def test_validate_rejects_missing_keys(path):
    doc = _doc()
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    del parent[path[-1]]
    with pytest.raises(IncomparableResults) as info:
        validate(doc)
    assert str(path[-1]) in info.value.message
    if path[0] == "records" and len(path) > 2:
        assert f"record {path[1]}" in info.value.message


def test_validate_rejects_malformed_record():
    doc = _doc()
    doc["records"][1]["better"] = "sideways"
    with pytest.raises(IncomparableResults, match="record 1"):
        validate(doc)
    doc = _doc()
    doc["records"].append("not a record")
    with pytest.raises(IncomparableResults, match="record 2"):
        validate(doc)


# --- writing and loading ---------------------------------------------------------------------------

def test_round_trip(tmp_path):
    doc = _doc()
    json_path, csv_path = io.write_result(doc, tmp_path / "run.json")
    assert json_path == tmp_path / "run.json" and csv_path == tmp_path / "run.csv"
    assert io.load_result(json_path) == doc
    text = json_path.read_text()
    assert text.endswith("}\n")
    assert text == json.dumps(doc, sort_keys=True, indent=2) + "\n"  # canonical form


def test_make_result_captures_env_and_build_by_default():
    doc = make_result("micro", [], {}, None, utc_now(), utc_now(), [])
    validate(doc)
    assert isinstance(doc["env"]["gpus"], list) and "versions" in doc["env"]
    assert "built" in doc["build"]


def test_atomic_write_leaves_no_temp_files(tmp_path):
    io.write_result(_doc(), tmp_path / "out" / "a.json")
    io.write_result(_doc(), runs_dir=tmp_path / "out")
    with pytest.raises(UsageError):
        io.write_result(_doc(), tmp_path / "out" / "a.json")  # a failed publish must clean up too
    names = sorted(os.listdir(tmp_path / "out"))
    assert len(names) == 4, names
    assert all(n.endswith((".json", ".csv")) and not n.startswith(".") for n in names), names


def test_no_clobber_then_force(tmp_path):
    target = tmp_path / "r.json"
    io.write_result(_doc(records=[_record(median=1.0)]), target)
    with pytest.raises(UsageError) as info:
        io.write_result(_doc(records=[_record(median=5.0)]), target)
    assert info.value.exit_code == 2
    assert str(target) in info.value.message and "--force" in (info.value.hint or "")
    assert io.load_result(target)["records"][0]["stats"]["median"] == 1.0  # untouched
    io.write_result(_doc(records=[_record(median=5.0)]), target, force=True)
    assert io.load_result(target)["records"][0]["stats"]["median"] == 5.0


def test_existing_csv_alone_blocks_write(tmp_path):
    (tmp_path / "r.csv").write_text("precious\n")
    with pytest.raises(UsageError, match="r.csv"):
        io.write_result(_doc(), tmp_path / "r.json")
    assert not (tmp_path / "r.json").exists()
    assert (tmp_path / "r.csv").read_text() == "precious\n"


def test_default_names_unique_within_a_second(tmp_path):
    paths = {io.write_result(_doc(), runs_dir=tmp_path)[0] for _ in range(5)}
    assert len(paths) == 5
    for p in paths:
        assert re.fullmatch(r"micro-\d{8}-\d{6}-[0-9a-f]{4}\.json", p.name), p.name


def test_publish_never_clobbers_a_file_created_after_the_check(tmp_path):
    # Simulates the race: the target appears between the exists() check and the publish.
    target = tmp_path / "race.json"
    target.write_text("other run\n")
    with pytest.raises(UsageError):
        io._publish("mine\n", target, force=False)
    assert target.read_text() == "other run\n"
    assert os.listdir(tmp_path) == ["race.json"]  # the failed publish removed its temp file


def test_write_rejects_invalid_doc_before_touching_disk(tmp_path):
    doc = _doc()
    doc["schema_version"] = 999
    with pytest.raises(IncomparableResults):
        io.write_result(doc, tmp_path / "bad.json")
    assert list(tmp_path.iterdir()) == []


def test_load_result_errors_name_the_file(tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text('{"schema": "ltxbench.result", ')
    with pytest.raises(IncomparableResults, match="broken.json") as info:
        io.load_result(bad)
    assert info.value.exit_code == 3
    with pytest.raises(IncomparableResults, match="missing.json"):
        io.load_result(tmp_path / "missing.json")
    future = _doc()
    future["schema_version"] = 999
    (tmp_path / "future.json").write_text(json.dumps(future))
    with pytest.raises(IncomparableResults, match=r"future\.json.*999"):
        io.load_result(tmp_path / "future.json")


def test_csv_one_row_per_record_with_flat_columns(tmp_path):
    doc = _doc()
    _, csv_path = io.write_result(doc, tmp_path / "r.json")
    with open(csv_path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(doc["records"]) == 2
    cols = set(rows[0])
    assert {"kind", "name", "provider", "dtype", "metric", "unit", "better", "gpu", "started_at"} <= cols
    assert {"params.tokens", "params.hidden", "stats.median", "stats.p20", "stats.p80", "stats.n"} <= cols
    assert {"derived.gbps", "check.passed", "check.max_abs_err"} <= cols
    assert rows[0]["params.tokens"] == "4096" and rows[1]["provider"] == "torch"
    assert rows[0]["gpu"] == "NVIDIA H100 80GB HBM3" and rows[0]["kind"] == "micro"
    assert float(rows[1]["stats.median"]) == pytest.approx(2.0)


def test_frame_gpu_falls_back_to_cpu():
    frame = io.to_frame(_doc(env={"gpus": [], "cuda_note": "no CUDA device"}))
    assert list(frame["gpu"]) == ["cpu", "cpu"]
    assert len(io.to_frame(_doc(records=[]))) == 0


def test_nan_and_inf_become_null(tmp_path):
    rec = _record(derived={"speedup": math.nan, "gbps": math.inf})
    rec["stats"]["p80"] = -math.inf
    doc = _doc(records=[rec])
    original = copy.deepcopy(doc)
    json_path, _ = io.write_result(doc, tmp_path / "nan.json")
    text = json_path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    loaded = io.load_result(json_path)
    assert loaded["records"][0]["derived"] == {"speedup": None, "gbps": None}
    assert loaded["records"][0]["stats"]["p80"] is None
    assert math.isnan(doc["records"][0]["derived"]["speedup"])  # caller's document not mutated
    assert json.dumps(doc, sort_keys=True) == json.dumps(original, sort_keys=True)


def test_unserialisable_value_fails_clearly(tmp_path):
    doc = _doc()
    doc["run"]["config"]["callback"] = object()
    with pytest.raises(ValueError, match="JSON"):
        io.write_result(doc, tmp_path / "x.json")
    assert list(tmp_path.iterdir()) == []


def test_results_get_the_users_usual_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        json_path, csv_path = io.write_result(_doc(), tmp_path / "r.json")
    finally:
        os.umask(old)
    assert (json_path.stat().st_mode & 0o777, csv_path.stat().st_mode & 0o777) == (0o644, 0o644)
