"""`--stop-check deferred`: transformers' generate() reading its stop flag one step late on CUDA (its DeferredStopCheck,
which it enables on Apple GPUs only), and the records that say so.

The deferral itself needs CUDA events, so the CPU tests check the switch (on inside, restored after, refused where it
cannot apply) and the GPU test checks that it gives the same tokens as the per-token check, also when a sequence
ends early (the one extra step generate() then drops)."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from ltxbench.cli import app
from ltxbench.models import llm_run
from tests.helpers import llm_build, llm_prompt

runner = CliRunner()


def _is_supported(device: str, is_assistant: bool = False) -> bool:
    from transformers.generation.utils import DeferredStopCheck

    return DeferredStopCheck.is_supported(torch.device(device), None, False, is_assistant=is_assistant)


def test_defers_on_cuda_inside_and_restores_after():
    assert not _is_supported("cuda")  # transformers' own rule: Apple GPUs only
    with llm_run.deferred_stop_check() as decisions:
        assert _is_supported("cuda")
        assert not _is_supported("cuda", is_assistant=True)  # transformers' other conditions still hold
        assert not _is_supported("cpu")  # no CUDA events on the CPU: left as it is
    assert decisions == [True, False, False]
    assert not _is_supported("cuda")


def test_restored_after_an_error():
    with pytest.raises(RuntimeError), llm_run.deferred_stop_check():
        raise RuntimeError("interrupted")
    assert not _is_supported("cuda")


def test_a_transformers_without_the_deferral_is_an_environment_problem(monkeypatch):
    from transformers.generation import utils

    from ltxbench.errors import EnvironmentProblem

    monkeypatch.delattr(utils, "DeferredStopCheck")
    with pytest.raises(EnvironmentProblem, match="DeferredStopCheck"), llm_run.deferred_stop_check():
        pass


def test_deferred_on_the_cpu_is_refused_naming_the_flag(tmp_path):
    out = tmp_path / "r.json"
    result = runner.invoke(app, ["bench", "e2e", "--model", "llama-tiny", "--weights", "random", "--device", "cpu",
                                 "--stop-check", "deferred", "--output", str(out)])
    assert result.exit_code == 2, result.output
    assert "--stop-check deferred" in result.output and not out.exists()


def test_profile_refuses_it_on_the_cpu_and_an_unknown_value_everywhere(tmp_path):
    base = ["--model", "llama-tiny", "--weights", "random", "--device", "cpu", "--output", str(tmp_path / "p.json")]
    result = runner.invoke(app, ["profile", *base, "--stop-check", "deferred"])
    assert result.exit_code == 2 and "--stop-check deferred" in result.output, result.output
    result = runner.invoke(app, ["bench", "e2e", *base, "--stop-check", "later"])
    assert result.exit_code == 2 and "--stop-check" in result.output, result.output


def test_video_models_do_not_take_it(tmp_path):
    result = runner.invoke(app, ["bench", "e2e", "--model", "ltx-tiny", "--weights", "random", "--device", "cpu",
                                 "--stop-check", "deferred", "--output", str(tmp_path / "r.json")])
    assert result.exit_code == 2, result.output
    assert "--stop-check" in result.output


def test_records_name_a_deferred_stop_check_only():
    """A deferred run is another measurement: its records carry stop_check (and compare keys on it); the default
    leaves the records' params as they were, so that stored per-token results stay comparable."""
    from ltxbench.bench.e2e import record_params

    assert record_params({"model": "llama-3-8b", "stop_check": "deferred"}, ()) == {"model": "llama-3-8b",
                                                                                    "stop_check": "deferred"}
    assert record_params({"model": "llama-3-8b", "stop_check": "per-token"}, ()) == {"model": "llama-3-8b"}


@pytest.mark.gpu
@pytest.mark.parametrize("stop_at", [None, 3])
def test_deferred_gives_the_same_tokens_on_cuda(stop_at):
    """Greedy tokens with the deferred check equal the per-token check's: to the last token, and when the sequence
    ends early on EOS (forced at step `stop_at`), where the deferral runs one step more and drops it."""
    from transformers import LogitsProcessor, LogitsProcessorList

    model = llm_build("llama", torch.bfloat16, "cuda")
    ids = llm_prompt(batch=1).to("cuda")
    eos = 7

    class ForceEos(LogitsProcessor):  # EOS at step stop_at and never before
        def __call__(self, input_ids, scores):
            scores = scores.clone()
            if stop_at is not None and input_ids.shape[1] - ids.shape[1] == stop_at:
                scores.fill_(-1e4)
                scores[:, eos] = 0
            else:
                scores[:, eos] = -1e4
            return scores

    def run(deferred: bool):
        kwargs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), cache_implementation="static",
                      max_new_tokens=12, do_sample=False, eos_token_id=eos, pad_token_id=0, disable_compile=True,
                      logits_processor=LogitsProcessorList([ForceEos()]))
        if not deferred:
            return model.generate(**kwargs), None
        with llm_run.deferred_stop_check() as decisions:
            return model.generate(**kwargs), decisions

    expected, _ = run(False)
    got, decisions = run(True)
    assert decisions == [True]
    assert torch.equal(got, expected)
    assert got.shape[1] == ids.shape[1] + (12 if stop_at is None else stop_at + 1)
