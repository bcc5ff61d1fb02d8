"""`ltxbench report`: README tables and figures from small result documents, and its refusals (CPU only)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ltxbench.cli import app
from ltxbench.results import io
from ltxbench.results.report import MARKER
from ltxbench.results.report_documents import Document, to_markdown
from ltxbench.results.report_tables import e2e_table, micro_table, profile_table
from ltxbench.results.schema import make_record, make_result

pytest.importorskip("matplotlib")
runner = CliRunner()
PNG = b"\x89PNG\r\n\x1a\n"
LTX = {"model": "ltx-2b", "num_frames": 49, "height": 512, "width": 768, "phase": "transformer", "steps": 10}


def _stats(median, p20=None, p80=None, n=10):
    return {"median": median, "p20": p20 if p20 is not None else median, "p80": p80 if p80 is not None else median,
            "min": median, "max": median, "n": n}


def _env(gpu: str, sha: str, dirty: bool = False) -> dict:
    return {"gpus": [{"name": gpu}], "git": {"sha": sha, "dirty": dirty}, "versions": {"torch": "2.11.0"}}


def _doc(kind: str, records: list, gpu="NVIDIA H100 80GB HBM3", sha="a1b2c3d4e5f6", dirty=False, argv=None) -> dict:
    argv = argv or ["ltxbench", "bench", kind, "--output", "/tmp/x.json"]
    return make_result(kind, argv, {"copy_peak_gbps": 3000.0} if kind == "micro" else {}, 42,
                       "2026-11-26T02:20:00+00:00", "2026-11-26T02:30:00+00:00", records,
                       env=_env(gpu, sha, dirty), build={})


def ltx_doc(step_ms: dict, **kw) -> dict:
    records = []
    for config, ms in step_ms.items():
        against_compile = "compile" in step_ms and config != "compile"
        derived = {"speedup_vs_compile": step_ms["compile"] / ms} if against_compile else {}
        derived.update({"gpu_sm_mhz_median": 1650.0, "gpu_power_capped_share": 1.0})
        records.append(make_record("denoise_step", config, "bf16", LTX, "time", "ms", "lower",
                                   _stats(ms, ms - 0.5, ms + 0.5), derived=derived))
        if "compile" in config:
            records.append(make_record("compile", config, "bf16", LTX, "time", "s", "lower", _stats(30.0, n=1)))
    return _doc("e2e", records, argv=["ltxbench", "bench", "e2e", "--model", "ltx-2b", "--output", "/tmp/r.json"], **kw)


def micro_doc() -> dict:
    shape = {"bytes": 8388608, "shape": [1, 1024, 2048], "shape_name": "seed-1x1024x2048", "variant": "no-weight"}
    return _doc("micro", [
        make_record("copy", "torch", "uint8", {"bytes": 1 << 31}, "time", "ms", "lower", _stats(0.7),
                    derived={"gbps": 3000.0}),
        make_record("rms_norm", "cuda", "bf16", shape, "time", "ms", "lower", _stats(0.00694),
                    derived={"pct_of_copy_peak": 40.2, "pct_of_same_size_copy": 102.3, "speedup_vs_best": 0.982},
                    check={"passed": True}),
        make_record("rms_norm", "compile", "bf16", shape, "time", "ms", "lower", _stats(0.00682),
                    derived={"pct_of_copy_peak": 41.0}),
        make_record("rms_norm", "liger", "bf16", shape, "time", "ms", "lower",
                    {"median": None, "p20": None, "p80": None, "min": None, "max": None, "n": 0},
                    derived={"status": "n/a"}),
    ])


def profile_doc() -> dict:
    params = {**LTX, "steps": 2}
    records = [make_record(fam, cfg, "bf16", params, "time", "ms", "lower", _stats(ms, n=1))
               for cfg, fams in {"compile": {"GEMM": 50.0, "normalization/reduction": 18.0},
                                 "optimized+compile": {"GEMM": 49.0, "ltxbench": 8.0}}.items()
               for fam, ms in fams.items()]
    records.append(make_record("timeline:idle", "compile", "bf16", params, "time", "ms", "lower", _stats(3.0, n=1),
                               derived={"gpu_sm_mhz_median": 1755.0}))
    records.append(make_record("kernel:nvjet_gemm", "compile", "bf16", params, "time", "ms", "lower",
                               _stats(40.0, n=1)))
    return _doc("profile", records)


def _store(folder: Path, name: str, doc: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(io.dumps(doc), encoding="utf-8")
    return path


@pytest.fixture
def folders(tmp_path, monkeypatch):
    """results/h100 with an e2e, a micro and a profile document; results/h200 with the e2e only."""
    monkeypatch.chdir(tmp_path)
    h100, h200 = Path("results/h100"), Path("results/h200")
    _store(h100, "e2e-ltx-2b-49f.json", ltx_doc({"baseline": 73.36, "compile": 46.45, "optimized+compile": 38.48},
                                                 dirty=True))
    _store(h100, "micro-all.json", micro_doc())
    _store(h100, "profile-ltx-2b-49f.json", profile_doc())
    _store(h200, "e2e-ltx-2b-49f.json", ltx_doc({"baseline": 68.33, "compile": 46.55, "optimized+compile": 38.12},
                                                 gpu="NVIDIA H200", sha="ffee00112233"))
    return h100, h200


def _report(*args: str):
    return runner.invoke(app, ["report", *args])


# --- tables --------------------------------------------------------------------------------------

def test_e2e_table_has_each_config_its_step_speedup_and_clock():
    table = e2e_table(ltx_doc({"baseline": 73.36, "compile": 46.45, "optimized+compile": 38.48}))
    row = table.set_index("config").loc["optimized+compile"]
    assert row["denoise_step ms"] == "38.48" and row["denoise_step p20–p80"] == "37.98–38.98"
    assert row["vs compile"] == f"{46.45 / 38.48:.3f}×" and row["SM MHz"] == "1650" and row["power-capped"] == "100%"
    assert row["compile s"] == "30.0"
    assert table.set_index("config").loc["compile"]["vs compile"] == "–"
    assert "J/step" not in table.columns  # no configuration carries it: the column is left out


def _attention_table(reference: str, plain: str):
    """The table of a run of `plain` (170 ms), `reference` (its compiled unpatched model on FlashAttention-3, 150 ms)
    and optimized+compile@fa3 (130 ms), whose record holds its speedup over `reference` as bench e2e derives it."""
    doc = ltx_doc({plain: 170.0, reference: 150.0, "optimized+compile@fa3": 130.0})
    for rec in doc["records"]:
        if rec["provider"] == "optimized+compile@fa3" and rec["name"] == "denoise_step":
            rec["derived"][f"speedup_vs_{reference}"] = 150.0 / 130.0
    return e2e_table(doc).set_index("config")


def test_e2e_table_with_configurations_of_their_own_attention_shows_the_kernels_against_the_same_attention():
    """compile, compile@fa3, optimized+compile@fa3 in one run: compile@fa3's row says the attention's gain (vs
    compile), optimized+compile@fa3's the kernels' (vs compile@fa3); a run without @ configurations has no column."""
    table = _attention_table("compile@fa3", "compile")
    assert table.loc["compile@fa3", "vs compile"] == f"{170 / 150:.3f}×"
    assert table.loc["optimized+compile@fa3", "vs compile@fa3"] == f"{150 / 130:.3f}×"
    assert table.loc["compile@fa3", "vs compile@fa3"] == "–" and table.loc["compile", "vs compile@fa3"] == "–"
    assert table.loc["optimized+compile@fa3", "vs compile"] == f"{170 / 130:.3f}×"
    assert not [c for c in e2e_table(ltx_doc({"compile": 1.0, "optimized+compile": 0.9})).columns if "@" in c]
    # LTX-2: the kernels on FlashAttention-3 against the pipeline without its STG pass on it
    table = _attention_table("stg-off+compile@fa3", "stg-off+compile")
    assert table.loc["optimized+compile@fa3", "vs stg-off+compile@fa3"] == f"{150 / 130:.3f}×"


def test_e2e_table_measures_our_kernels_against_each_compiled_peer():
    """LTX-2's stg-off+compile (compile without the redundant STG pass) or Liger's liger+compile: our rows carry the
    speedup over it in a column of its own, the other rows a dash."""
    doc = ltx_doc({"compile": 1337.6, "stg-off+compile": 987.4, "optimized+compile": 907.6, "optimized": 902.5})
    for rec in doc["records"]:
        if rec["provider"] in ("optimized", "optimized+compile") and rec["name"] == "denoise_step":
            rec["derived"]["speedup_vs_stg-off+compile"] = 987.4 / rec["stats"]["median"]
    table = e2e_table(doc).set_index("config")
    assert table.loc["optimized+compile", "vs stg-off+compile"] == f"{987.4 / 907.6:.3f}×"
    assert table.loc["optimized", "vs stg-off+compile"] == f"{987.4 / 902.5:.3f}×"
    assert table.loc[["compile", "stg-off+compile"], "vs stg-off+compile"].tolist() == ["–", "–"]
    assert "vs stg-off+compile" not in e2e_table(ltx_doc({"compile": 1.0, "optimized+compile": 0.9})).columns


def test_e2e_table_measures_our_eager_rows_against_each_eager_peer():
    """An eager peer (Lightricks' ltx-core, Liger, diffusers' group offloading) gets a column filled for our eager
    rows only: a compiled row of ours against an eager peer would mix the kernels' gain with compile's."""
    doc = ltx_doc({"ltx-core": 1227.4, "optimized": 913.4, "optimized+compile": 905.0, "stg-off+compile": 1006.6})
    for rec in doc["records"]:
        if rec["provider"].startswith("optimized") and rec["name"] == "denoise_step":
            rec["derived"]["speedup_vs_ltx-core"] = 1227.4 / rec["stats"]["median"]
            rec["derived"]["speedup_vs_stg-off+compile"] = 1006.6 / rec["stats"]["median"]
    table = e2e_table(doc).set_index("config")
    assert table.loc["optimized", "vs ltx-core"] == f"{1227.4 / 913.4:.3f}×"
    assert table.loc[["optimized+compile", "ltx-core", "stg-off+compile"], "vs ltx-core"].tolist() == ["–"] * 3
    assert table.loc["optimized+compile", "vs stg-off+compile"] == f"{1006.6 / 905.0:.3f}×"  # compiled peer: all ours


def test_e2e_table_under_a_memory_budget_shows_what_each_configuration_held():
    doc = ltx_doc({"compile": 46.45, "optimized": 40.0})
    assert "peak GiB" not in e2e_table(doc).columns  # no budget: the memory is not the point
    for rec in doc["records"]:
        rec["params"]["memory_budget_gib"] = 8.0
        rec["derived"].update(peak_memory_bytes=int(4.5 * 2**30), peak_reserved_bytes=int(6.25 * 2**30))
    row = e2e_table(doc).set_index("config").loc["optimized"]
    assert row["peak GiB"] == "4.50" and row["reserved GiB"] == "6.25"


def test_micro_table_puts_ours_beside_each_baseline_and_marks_na():
    table = micro_table(micro_doc())
    assert len(table) == 1  # the copy is the peak, not a case
    row = table.iloc[0]
    assert row["ltxbench µs"] == "6.94" and row["compile µs"] == "6.82" and row["liger µs"] == "n/a"
    assert row["% of copy peak"] == "40.2" and row["vs fastest baseline"] == "0.983×" and row["check"] == "ok"


def test_micro_table_compares_an_unsteady_baseline_at_its_p20_and_marks_it():
    """The speed-up comes from the stored samples by bench micro's rule, not from the stored derived value: a
    document measured before the rule shows what it says now."""
    doc = micro_doc()
    compile_ = next(r for r in doc["records"] if r["provider"] == "compile")
    compile_["stats"] = _stats(0.0200, p20=0.0050, p80=0.0300)  # median 20 us: slow samples from outside it
    row = micro_table(doc).iloc[0]
    assert row["compile µs"] == "20.0†" and row["ltxbench µs"] == "6.94"
    assert row["vs fastest baseline"] == f"{0.0050 / 0.00694:.3f}×"  # 0.720×, not 2.88× against the median


def test_profile_table_is_per_step_and_skips_single_kernels():
    table = profile_table(profile_doc()).set_index("ms per step")
    assert table.loc["GEMM", "compile"] == "25.00" and table.loc["ltxbench", "optimized+compile"] == "4.00"
    assert table.loc["ltxbench", "compile"] == "–"
    assert table.loc["GPU idle between kernels", "compile"] == "1.50"
    assert table.loc["SM MHz (median)", "compile"] == "1755"
    assert not any(name.startswith("kernel:") for name in table.index)


def test_markdown_escapes_pipes():
    import pandas as pd

    text = to_markdown(pd.DataFrame([{"a": "x|y", "b": "1"}]))
    assert text.splitlines() == ["| a | b |", "| --- | --- |", "| x\\|y | 1 |"]


def test_provenance_names_file_gpu_and_commit_without_output_path(tmp_path):
    d = Document(Path("results/h100/e2e-ltx-2b-49f.json"), ltx_doc({"compile": 46.0}, dirty=True))
    assert d.provenance.startswith("results/h100/e2e-ltx-2b-49f.json · NVIDIA H100 80GB HBM3 · git a1b2c3d + local")
    assert d.command == "ltxbench bench e2e --model ltx-2b"


# --- the command ---------------------------------------------------------------------------------

def test_report_writes_readme_and_one_png_per_document(folders):
    h100, _ = folders
    result = _report(str(h100))
    assert result.exit_code == 0, result.output
    readme = (h100 / "README.md").read_text(encoding="utf-8")
    assert readme.startswith(MARKER) and "# Stored results: NVIDIA H100 80GB HBM3" in readme
    for stem in ("e2e-ltx-2b-49f", "micro-all", "profile-ltx-2b-49f"):
        assert (h100 / f"{stem}.png").read_bytes().startswith(PNG)
        assert f"## {stem}.json" in readme and f"]({stem}.png)" in readme
    assert "| optimized+compile | 38.48 |" in readme
    assert "git a1b2c3d + local changes" in readme and "/tmp/r.json" not in readme
    assert not list(h100.glob(".ltxbench-report-*"))  # the staging folders are gone


def test_every_figure_names_its_file_and_commit(folders):
    from ltxbench.results.report_documents import load_folder
    from ltxbench.results.report_plots import figure_for, headline_figure

    h100, h200 = folders
    for d in load_folder(h100):
        fig = figure_for(d)
        captions = " ".join(t.get_text() for t in fig.texts)
        assert d.path.as_posix() in captions and "git a1b2c3d" in captions, (d.path, captions)
    heads = [load_folder(h100)[0], load_folder(h200)[0]]
    captions = " ".join(t.get_text() for t in headline_figure(heads).texts)
    assert "results/h100/e2e-ltx-2b-49f.json" in captions and "git a1b2c3d" in captions
    assert "results/h200/e2e-ltx-2b-49f.json" in captions and "git ffee001" in captions


def test_headline_compares_the_gpus_step_times(folders):
    from ltxbench.results.report_documents import load_folder
    from ltxbench.results.report_plots import headline_figure

    h100, h200 = folders
    ax = headline_figure([load_folder(h100)[0], load_folder(h200)[0]]).axes[0]
    heights = sorted(round(p.get_height(), 2) for p in ax.patches)
    assert heights == sorted([73.36, 46.45, 38.48, 68.33, 46.55, 38.12])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    result = _report(str(h100), str(h200), "--headline", "docs/headline.png")
    assert result.exit_code == 0, result.output
    assert Path("docs/headline.png").read_bytes().startswith(PNG)


def test_rerun_replaces_its_own_readme_and_is_deterministic(folders):
    h100, _ = folders
    assert _report(str(h100)).exit_code == 0
    first = {p.name: p.read_bytes() for p in h100.iterdir()}
    assert _report(str(h100)).exit_code == 0
    assert {p.name: p.read_bytes() for p in h100.iterdir()} == first


def test_refuses_a_readme_it_did_not_write_unless_forced(folders):
    h100, _ = folders
    (h100 / "README.md").write_text("# notes by hand\n", encoding="utf-8")
    result = _report(str(h100))
    assert result.exit_code == 2 and "not written by `ltxbench report`" in result.output
    assert (h100 / "README.md").read_text(encoding="utf-8") == "# notes by hand\n"
    assert not list(h100.glob("*.png"))
    assert _report(str(h100), "--force").exit_code == 0
    assert (h100 / "README.md").read_text(encoding="utf-8").startswith(MARKER)


def test_unreadable_result_is_exit_3_and_writes_nothing(folders):
    h100, _ = folders
    (h100 / "broken.json").write_text("{not json", encoding="utf-8")
    result = _report(str(h100))
    assert result.exit_code == 3 and "broken.json" in result.output
    assert not (h100 / "README.md").exists() and not list(h100.glob("*.png"))


def test_profile_chrome_traces_beside_the_results_are_not_read(folders):
    """`profile` writes its chrome traces beside its result by default (one per rank with --gpus): not results."""
    h100, _ = folders
    (h100 / "profile-ltx-2b-49f-optimized.trace.json").write_text('{"traceEvents": []}', encoding="utf-8")
    (h100 / "profile-ltx-2b-49f-optimized-rank1.trace.json").write_text('{"traceEvents": []}', encoding="utf-8")
    result = _report(str(h100))
    assert result.exit_code == 0, result.output
    assert "trace.json" not in (h100 / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("args, words", [
    (["missing"], "is not a folder"),
    (["empty"], "holds no result documents"),
    (["results/h100", "--headline", "head.svg"], "must name a .png"),
    (["results/h100", "results/h100"], "named twice"),
])
def test_bad_arguments_are_usage_errors(folders, args, words):
    Path("empty").mkdir()
    result = _report(*args)
    assert result.exit_code == 2 and words in result.output, result.output


def test_headline_needs_the_result_in_every_folder(folders):
    h100, h200 = folders
    (h200 / "e2e-ltx-2b-49f.json").rename(h200 / "e2e-ltx-2b-49f-old.json")
    result = _report(str(h100), str(h200), "--headline", "head.png")
    assert result.exit_code == 2 and "results/h200 has no e2e-ltx-2b-49f.json" in result.output
    assert not Path("head.png").exists() and not (h100 / "README.md").exists()


def test_a_folder_in_the_way_of_an_output_is_found_before_anything_is_written(folders):
    h100, h200 = folders
    Path("head.png").mkdir()
    result = _report(str(h100), str(h200), "--headline", "head.png")
    assert result.exit_code == 2 and "--headline head.png is a folder" in result.output, result.output
    assert not (h100 / "README.md").exists()
    Path("head.png").rmdir()
    (h100 / "README.md").mkdir()  # in the way of a staged file: found before any file moves
    result = _report(str(h100), str(h200), "--headline", "head.png")
    assert result.exit_code == 2 and "is a folder; nothing was written" in result.output, result.output
    assert not Path("head.png").exists() and not (h200 / "README.md").exists()


def test_failure_while_drawing_leaves_nothing_behind(folders, monkeypatch):
    from ltxbench.results import report_plots

    h100, h200 = folders
    (h100 / "README.md").write_text(MARKER + "\nthe previous report\n", encoding="utf-8")

    def broken(documents):
        raise RuntimeError("drawing failed")

    monkeypatch.setattr(report_plots, "headline_figure", broken)
    result = _report(str(h100), str(h200), "--headline", "head.png")
    assert result.exit_code != 0 and isinstance(result.exception, RuntimeError)
    assert (h100 / "README.md").read_text(encoding="utf-8") == MARKER + "\nthe previous report\n"
    assert not list(h100.glob("*.png")) and not (h200 / "README.md").exists() and not Path("head.png").exists()
    assert not list(h100.glob(".ltxbench-report-*")) and not list(Path(".").glob(".ltxbench-report-*"))


def test_without_matplotlib_exit_4_and_nothing_written(folders, monkeypatch):
    h100, _ = folders
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    result = _report(str(h100))
    assert result.exit_code == 4 and "matplotlib" in result.output and "pip install matplotlib" in result.output
    assert not (h100 / "README.md").exists()


def test_stored_results_have_a_generated_readme():
    """results/<gpu>/README.md is the report's output for the documents stored beside it."""
    root = Path(__file__).resolve().parents[2] / "results"
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and p.name != "runs"):
        readme = (folder / "README.md").read_text(encoding="utf-8")
        assert readme.startswith(MARKER), folder
        for result in folder.glob("*.json"):
            assert f"## {result.name}" in readme, (folder, result.name)


def test_an_incomplete_run_is_marked_before_its_figures(tmp_path):
    """A run cut short (Ctrl-C, SIGTERM) is stored as what it is: the README says so above its table."""
    from ltxbench.results.io import write_result
    from ltxbench.results.schema import INCOMPLETE

    doc = ltx_doc({"baseline": 1846.2, "compile": 1500.0})
    doc["records"] = [r for r in doc["records"] if r["provider"] == "baseline"]
    doc["run"]["config"][INCOMPLETE] = {"reason": "interrupted (SIGTERM)", "measured": ["baseline"],
                                        "not_measured": ["compile"]}
    folder = tmp_path / "h100"
    folder.mkdir()
    write_result(doc, folder / "e2e-cut.json")
    assert _report(str(folder)).exit_code == 0
    readme = (folder / "README.md").read_text(encoding="utf-8")
    marked = readme.index("**Incomplete**: interrupted (SIGTERM); measured baseline, not measured compile.")
    assert readme.index("## e2e-cut.json") < marked < readme.index("| baseline |")


def test_report_removes_its_figures_of_documents_no_longer_there(folders):
    h100, _ = folders
    assert _report(str(h100)).exit_code == 0
    foreign = h100 / "my-plot.png"
    foreign.write_bytes(PNG + b"a user's own figure")
    (h100 / "micro-all.json").unlink()
    result = _report(str(h100))
    assert result.exit_code == 0, result.output
    assert not (h100 / "micro-all.png").exists()  # its document is gone: the figure would outlive it
    assert (h100 / "e2e-ltx-2b-49f.png").exists() and foreign.exists()  # current figures and a user's PNG stay
