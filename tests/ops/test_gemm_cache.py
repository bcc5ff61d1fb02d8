"""ops.gemm_cache on the CPU: where the files go, how records merge, what is refused, and load/save against a
stand-in for the extension's gemm_import/gemm_export (the real ones run in tests/ops/test_ops_gpu.py)."""

from __future__ import annotations

import json

import pytest
import torch

import ltxbench.ops
from ltxbench.ops import gemm_cache

KEY = "ltxgemm2 130100 2 1 16 1 0 5376 8192 2048 2048 2048 8192"


def _record(key: str = KEY, algo: str = "1 2 3 4 5 6 7 8", summary: str = "heuristic 263.7 us, tuned 230.8 us") -> str:
    return f"{key} {algo}\t{summary}"


class FakeLib:
    """gemm_import keeps records whose algorithm words are all digits; gemm_export returns what it is given."""

    def __init__(self, exported=()):
        self.exported, self.imported = list(exported), []

    def gemm_import(self, device, records):
        self.imported.append((device, list(records)))
        return sum(all(w.isdigit() for w in r.split("\t")[0].split()[13:]) for r in records)

    def gemm_export(self, device):
        return list(self.exported)


@pytest.fixture
def fake(monkeypatch, tmp_path):
    lib = FakeLib()
    monkeypatch.setenv("LTXBENCH_GEMM_CACHE", str(tmp_path / "choices"))
    monkeypatch.setattr(gemm_cache, "SHIPPED", tmp_path / "shipped")  # not the package's own files
    monkeypatch.setattr(ltxbench.ops, "_lib", lambda: lib)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    registered = []
    monkeypatch.setattr(gemm_cache.atexit, "register", lambda fn, *args: registered.append((fn, args)))
    monkeypatch.setattr(gemm_cache, "_saving", set())
    lib.registered = registered
    return lib


def test_files_are_per_gpu_model_and_can_be_turned_off(monkeypatch, tmp_path):
    monkeypatch.setenv("LTXBENCH_GEMM_CACHE", str(tmp_path))
    assert gemm_cache.cache_file("NVIDIA H100 80GB HBM3") == tmp_path / "NVIDIA-H100-80GB-HBM3.json"
    monkeypatch.setenv("LTXBENCH_CACHE", str(tmp_path / "build"))
    monkeypatch.delenv("LTXBENCH_GEMM_CACHE")
    assert gemm_cache.directory() == tmp_path / "build" / "gemm-choices"
    monkeypatch.setenv("LTXBENCH_GEMM_CACHE", "off")
    assert gemm_cache.directory() is None and gemm_cache.cache_file("H100") is None


def test_records_merge_by_problem_and_the_newer_one_wins(tmp_path):
    path = tmp_path / "gpu.json"
    other = KEY.replace(" 5376 ", " 16128 ")
    gemm_cache.write_records(path, "gpu", [_record(), _record(other)])
    gemm_cache.write_records(path, "gpu", [_record(algo="9 9 9 9 9 9 9 9")])
    doc = json.loads(path.read_text())
    assert doc["schema"] == gemm_cache.SCHEMA and doc["version"] == gemm_cache.VERSION and doc["device"] == "gpu"
    assert sorted(doc["records"]) == sorted([_record(algo="9 9 9 9 9 9 9 9"), _record(other)])
    assert gemm_cache.record_key(_record()) == KEY
    upgraded = KEY.replace(" 130100 ", " 130200 ")  # a new cuBLASLt: the old version's records go
    gemm_cache.write_records(path, "gpu", [_record(upgraded)])
    assert json.loads(path.read_text())["records"] == [_record(upgraded)]
    residual = upgraded.replace(" 16 1 0 ", " 16 1 1 ")  # the same GEMM with a residual: a problem of its own
    assert gemm_cache.record_key(_record(residual)) != gemm_cache.record_key(_record(upgraded))
    gemm_cache.write_records(path, "gpu", [_record(residual)])
    assert len(json.loads(path.read_text())["records"]) == 2
    reformatted = upgraded.replace("ltxgemm2", "ltxgemm3")  # a new record format: the old format's records go
    gemm_cache.write_records(path, "gpu", [_record(reformatted)])
    assert json.loads(path.read_text())["records"] == [_record(reformatted)]
    assert not list(tmp_path.glob(".*tmp"))  # written through a temporary file, renamed


@pytest.mark.parametrize("content", ["{not json", json.dumps({"schema": "other", "version": 1, "records": []}),
                                     json.dumps([1, 2])])
def test_a_file_that_is_not_ours_is_not_read_and_says_so(tmp_path, content):
    path = tmp_path / "gpu.json"
    path.write_text(content)
    with pytest.warns(UserWarning, match="not read"):
        assert gemm_cache.read_records(path) == []
    assert gemm_cache.read_records(tmp_path / "missing.json") == []


def test_load_hands_the_stored_records_to_the_extension_and_saves_at_exit(fake, tmp_path):
    path = gemm_cache.cache_file("NVIDIA H100 80GB HBM3")
    broken = _record(KEY.replace(" 5376 ", " 16128 "), algo="1 2 3 4 5 6 7 x")
    gemm_cache.write_records(path, "NVIDIA H100 80GB HBM3", [_record(), broken])
    assert ltxbench.ops.load_gemm_choices("cuda:0") == 1  # the extension's count: one of the two kept
    assert fake.imported[0][0] == 0 and len(fake.imported[0][1]) == 2
    assert ltxbench.ops.load_gemm_choices() == 1
    assert len(fake.registered) == 1  # one save at exit per device, however often loaded
    fake.exported = [_record(KEY.replace(" 5376 ", " 2688 "))]
    save, args = fake.registered[0]
    save(*args)
    assert len(json.loads(path.read_text())["records"]) == 3


def test_save_writes_nothing_without_searched_choices_or_when_off(fake, monkeypatch):
    assert ltxbench.ops.save_gemm_choices() is None
    assert not gemm_cache.cache_file("NVIDIA H100 80GB HBM3").exists()
    monkeypatch.setenv("LTXBENCH_GEMM_CACHE", "off")
    fake.exported = [_record()]
    assert ltxbench.ops.save_gemm_choices() is None and ltxbench.ops.load_gemm_choices() == 0
    assert fake.imported == []
    with pytest.raises(ValueError, match="per CUDA device"):
        gemm_cache.load("cpu")


def test_shipped_choices_fill_in_what_the_users_file_lacks(fake, tmp_path, monkeypatch):
    name = "NVIDIA H100 80GB HBM3"
    other = KEY.replace(" 5376 ", " 16128 ")
    gemm_cache.write_records(gemm_cache.SHIPPED / gemm_cache.file_name(name), name,
                             [_record(algo="9 9 9 9 9 9 9 9"), _record(other)])
    assert ltxbench.ops.load_gemm_choices() == 2  # a fresh machine: both shipped records
    assert sorted(fake.imported[-1][1]) == sorted([_record(algo="9 9 9 9 9 9 9 9"), _record(other)])
    gemm_cache.write_records(gemm_cache.cache_file(name), name, [_record()])  # the user's own search of KEY
    ltxbench.ops.load_gemm_choices()
    assert fake.imported[-1][1] == [_record(), _record(other)]  # the user's record wins, the other fills in
    monkeypatch.setenv("LTXBENCH_GEMM_CACHE", "off")
    assert gemm_cache.stored_records(name) == [] and ltxbench.ops.load_gemm_choices() == 0


def test_the_package_ships_its_choice_files_as_package_data():
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert "ops/gemm_choices/*.json" in pyproject["tool"]["setuptools"]["package-data"]["ltxbench"]
    assert gemm_cache.SHIPPED == Path(ltxbench.ops.__file__).parent / "gemm_choices"


def test_every_shipped_choice_file_is_ours_and_named_after_its_gpu():
    files = sorted(gemm_cache.SHIPPED.glob("*.json"))
    assert files, "no shipped GEMM choices"
    for path in files:
        doc = json.loads(path.read_text())
        records = gemm_cache.read_records(path)
        assert doc["schema"] == gemm_cache.SCHEMA and gemm_cache.file_name(doc["device"]) == path.name
        assert records and len({gemm_cache.record_key(r) for r in records}) == len(records)
        assert all(r.startswith("ltxgemm2 ") and len(r.split("\t")[0].split()) > 13 for r in records)
