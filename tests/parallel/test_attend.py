"""The attention dispatch of our processors (ltxbench.parallel.attend), in one process: which strategy each table
picks for which parallel config, mask, shapes and RoPE, what each strategy is called with (the backend, the ring
backend special case, the send buffers), and that the family code reaches the exchanges only through this module."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ltxbench.ops import reference
from ltxbench.parallel import attend, context, ring, ulysses
from tests.helpers import parallel_config as config

INJECT = Path(attend.__file__).resolve().parents[1] / "inject"


ULYSSES, RING = config(ulysses_degree=2), config(ring_degree=2)


def heads(batch=1, tokens=4, count=4, dim=8):
    return torch.zeros(batch, tokens, count, dim)


MASK = torch.zeros(1, 4, 1, 4)

# (case, query, key, mask, parallel config, split RoPE, skip) -> (PLAIN's pick, FUSED's pick or None)
CASES = [
    ("one GPU", heads(), heads(), None, None, False, (), ("diffusers", None)),
    ("no context parallelism", heads(), heads(), None, SimpleNamespace(context_parallel_config=None), False, (),
     ("diffusers", None)),
    ("degree 1", heads(), heads(), None, config(), False, (), ("diffusers", None)),
    ("ulysses", heads(), heads(), None, ULYSSES, False, (), ("ulysses", "ulysses")),
    ("ulysses, split RoPE", heads(), heads(), None, ULYSSES, True, (), ("ulysses", "ulysses")),
    ("ulysses, ring skipped", heads(), heads(), None, ULYSSES, True, ("ring",), ("ulysses", "ulysses")),
    ("ulysses, masked", heads(), heads(), MASK, ULYSSES, False, (), ("diffusers", None)),
    ("ulysses, batch 2", heads(batch=2), heads(batch=2), None, ULYSSES, False, (), ("diffusers", None)),
    ("ulysses, heads not divisible", heads(count=3), heads(count=3), None, ULYSSES, False, (), ("diffusers", None)),
    ("ulysses, keys of another length", heads(), heads(tokens=5), None, ULYSSES, False, (), ("diffusers", None)),
    ("ulysses, uneven tokens", heads(), heads(), None, config(ulysses_degree=2, ulysses_anything=True), False, (),
     ("diffusers", None)),
    ("ulysses, skipped", heads(), heads(), None, ULYSSES, False, ("ulysses",), ("ulysses", None)),
    # ring: diffusers' ring attention for q, k, v as given; ours only where one kernel writes the k|v buffer
    ("ring", heads(), heads(), None, RING, False, (), ("diffusers", "ring")),
    ("ring, split RoPE", heads(), heads(), None, RING, True, (), ("diffusers", None)),
    ("ring, skipped", heads(), heads(), None, RING, False, ("ring",), ("diffusers", None)),
    ("ring, masked", heads(), heads(), MASK, RING, False, (), ("diffusers", None)),
    ("ring, batch 2", heads(batch=2), heads(batch=2), None, RING, False, (), ("diffusers", None)),
    ("ring, keys of another length", heads(), heads(tokens=5), None, RING, False, (), ("diffusers", None)),
    ("ring, uneven tokens", heads(), heads(), None, config(ring_degree=2, ring_anything=True), False, (),
     ("diffusers", None)),
    ("ring, heads not divisible", heads(count=3), heads(count=3), None, RING, False, (), ("diffusers", "ring")),
    ("ring and ulysses", heads(), heads(), None, config(ring_degree=2, ulysses_degree=2), False, (),
     ("diffusers", None)),
]


@pytest.mark.parametrize(("query", "key", "mask", "parallel", "split", "skip", "expected"),
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_strategy_picked(query, key, mask, parallel, split, skip, expected):
    fused = attend.fused_strategy(query, key, mask, parallel, split, skip)
    assert (attend.plain_strategy(query, key, mask, parallel).name, fused and fused.name) == expected


def test_tables_end_as_the_callers_fell_back():
    """PLAIN ends in diffusers' dispatch, which takes every call; FUSED's names are unique (skip names them)."""
    assert attend.PLAIN[-1].name == "diffusers" and attend.PLAIN[-1].applies(heads(2), heads(3), MASK, RING)
    assert len(set(attend.FUSED_NAMES)) == len(attend.FUSED) and attend.FUSED_NAMES == ("ulysses", "ring")


def test_unknown_skip_is_refused_by_name():
    with pytest.raises(ValueError, match=r"^skip: 'rings' is not a fused strategy \(one of ulysses, ring\)$"):
        attend.fused_strategy(heads(), heads(), None, RING, False, ("rings",))


def _record(monkeypatch, module, name, calls):
    monkeypatch.setattr(module, name, lambda *args, **kwargs: calls.append((name, args, kwargs)) or "out")


def test_attend_calls_the_picked_strategy_with_backend_and_config(monkeypatch):
    from diffusers.models import attention_dispatch

    calls = []
    _record(monkeypatch, ulysses, "attention", calls)
    _record(monkeypatch, attention_dispatch, "dispatch_attention_fn", calls)
    q, k, v = heads(), heads(), heads()
    assert attend.attend(q, k, v, None, "flash", ULYSSES) == "out"
    assert calls.pop() == ("attention", (q, k, v, "flash", ULYSSES), {})
    for mask, parallel in ((MASK, ULYSSES), (None, RING), (None, None)):
        attend.attend(q, k, v, mask, "flash", parallel)
        assert calls.pop() == ("dispatch_attention_fn", (q, k, v), {
            "attn_mask": mask, "dropout_p": 0.0, "is_causal": False, "backend": "flash", "parallel_config": parallel})


def _projections(tokens=4, count=4, dim=8):
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, tokens, count * dim, generator=generator) for _ in range(3))
    wq, wk = (torch.rand(count * dim, generator=generator) + 0.5 for _ in range(2))
    return q, k, v, wq, wk


def _cos_sin(tokens=4, width=32):
    angles = torch.arange(tokens * width, dtype=torch.float32).view(1, tokens, width) / 10
    return {"cos": angles.cos(), "sin": angles.sin()}


@pytest.mark.parametrize(("flagged", "expected_backend"), [(True, None), (False, context.RING_BACKEND)])
def test_ring_rope_attention_sends_the_kv_buffer(monkeypatch, flagged, expected_backend):
    """Our ring attention gets q normalized and rotated and the k|v buffer of one kernel, with the processor's backend
    unless context.enable set it for diffusers' ring attention (one attention over all keys needs no log-sum-exp)."""
    calls = []
    _record(monkeypatch, ring, "attention", calls)
    q, k, v, wq, wk = _projections()
    processor = SimpleNamespace(_attention_backend=context.RING_BACKEND, _parallel_config=RING)
    if flagged:
        setattr(processor, context.RING_BACKEND_SET, True)
    rope = _cos_sin()
    assert attend.rope_attention(reference, q, k, v, wq, wk, 1e-5, rope, False, 4, processor) == "out"
    (_, (query, kv, backend, parallel), _), = calls
    want_q, want_k = reference.qk_rms_norm_rope(q, k, wq, wk, 1e-5, **rope)
    assert query.shape == (1, 4, 4, 8) and kv.shape == (1, 4, 2, 4, 8)
    assert torch.equal(query, want_q.unflatten(2, (4, 8))) and torch.equal(kv[:, :, 0], want_k.unflatten(2, (4, 8)))
    assert torch.equal(kv[:, :, 1], v.unflatten(2, (4, 8)))
    assert backend == expected_backend and parallel is RING


def test_ulysses_rope_attention_keeps_the_processors_backend(monkeypatch):
    calls = []
    _record(monkeypatch, ulysses, "rope_attention", calls)
    q, k, v, wq, wk = _projections()
    processor = SimpleNamespace(_attention_backend="flash", _parallel_config=ULYSSES)
    rope = _cos_sin()
    assert attend.rope_attention(reference, q, k, v, wq, wk, 1e-5, rope, True, 4, processor) == "out"
    assert calls == [("rope_attention", (reference, q, k, v, wq, wk, 1e-5, rope, True, 4, "flash", ULYSSES), {})]


@pytest.mark.parametrize("processor", [SimpleNamespace(), SimpleNamespace(_parallel_config=None),
                                       SimpleNamespace(_parallel_config=ULYSSES)])
def test_rope_attention_none_where_no_fused_strategy_applies(monkeypatch, processor):
    """No parallel config (or none on the processor at all), or a mask: None, and nothing sent."""
    for module, name in ((ulysses, "rope_attention"), (ring, "attention")):
        monkeypatch.setattr(module, name, lambda *args: pytest.fail("nothing applies"))
    q, k, v, wq, wk = _projections()
    mask = MASK if getattr(processor, "_parallel_config", None) else None
    assert attend.rope_attention(reference, q, k, v, wq, wk, 1e-5, _cos_sin(), False, 4, processor, mask) is None


def _parallel_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ltxbench.parallel"):
            found |= ({node.module} if node.module != "ltxbench.parallel" else
                      {f"ltxbench.parallel.{alias.name}" for alias in node.names})
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("ltxbench.parallel")}
    return found


def test_family_code_reaches_the_exchanges_only_through_attend():
    """inject/ names no exchange (ulysses, ring, symmetric) nor diffusers' context parallelism (context): a new
    strategy edits parallel/ alone. split: the step's share of a call's batch and tokens, not the attention."""
    imports = {str(p.relative_to(INJECT)): _parallel_imports(p) for p in sorted(INJECT.rglob("*.py"))}
    allowed = {"ltxbench.parallel.attend", "ltxbench.parallel.split"}
    assert {path: names - allowed for path, names in imports.items() if names - allowed} == {}
    assert imports["ltx/attention.py"] == imports["ltx2/attention.py"] == {"ltxbench.parallel.attend"}


def test_the_import_check_sees_each_form(tmp_path):
    source = tmp_path / "a.py"
    source.write_text("from ltxbench.parallel import ring, attend\nimport ltxbench.parallel.ulysses\n"
                      "def f():\n    from ltxbench.parallel.symmetric import usable\n")
    assert _parallel_imports(source) == {"ltxbench.parallel.ring", "ltxbench.parallel.attend",
                                         "ltxbench.parallel.ulysses", "ltxbench.parallel.symmetric"}
