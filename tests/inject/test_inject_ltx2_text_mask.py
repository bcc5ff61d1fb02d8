"""LTX-2's text masks of all ones left out (TextKVCache.without_ones_masks, the transformer's patched call): the text
attentions then attend unmasked, with the model's output unchanged; a mask with any zero is kept, a mask written in
place is read again, and nothing is left out outside a generation. CPU, ltx2-tiny's transformer, reference
provider, fused blocks (their text attention is the call that sees the mask)."""

from __future__ import annotations

import pytest
import torch

from ltxbench.inject import ltx2 as inject_ltx2
from ltxbench.inject.ltx2 import attention as ltx2_attention
from tests.helpers import ltx2_inputs, ltx2_transformer


@pytest.fixture
def seen(monkeypatch):
    """The masks the fused blocks' text attentions attend with (None: unmasked)."""
    masks = []
    attend = ltx2_attention._attend

    def spy(attn, query, key, value, mask=None):
        if key.shape[1] == 16:  # a text attention: 16 prompt tokens (video 12, audio 5)
            masks.append(mask)
        return attend(attn, query, key, value, mask)

    monkeypatch.setattr(ltx2_attention, "_attend", spy)
    return masks


def _call(model, **overrides):
    with torch.no_grad():
        return model(**{**ltx2_inputs(model), **overrides})[0]


def _patched(model):
    return inject_ltx2.apply_kernels(model, "reference", reuse_stg_pass=False, text_encoder=False)


def test_all_ones_masks_are_left_out_in_a_generation_with_the_same_output(seen):
    model = ltx2_transformer(2)
    mask = torch.ones(2, 16)
    expected = _call(model, encoder_attention_mask=mask, audio_encoder_attention_mask=mask)
    with _patched(model) as report, inject_ltx2.generation(model):
        assert report.rules[inject_ltx2.TEXT_MASK_RULE] == 1
        first = _call(model, encoder_attention_mask=mask, audio_encoder_attention_mask=mask)
        second = _call(model, encoder_attention_mask=mask, audio_encoder_attention_mask=mask)
        cache = vars(model)[inject_ltx2.CACHE_ATTR]
        assert cache.mask_checks == 1  # one view, read once for the generation
    assert seen and all(m is None for m in seen)  # 2 blocks x video and audio x 2 calls, all unmasked
    assert len(seen) == 8
    torch.testing.assert_close(first, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(first, second)


def test_a_mask_with_a_padded_token_is_kept_and_changes_the_output(seen):
    """The mutation check: leaving out a mask that is not all ones would give the unmasked output."""
    model = ltx2_transformer(2)
    padded = torch.ones(2, 16)
    padded[0, -3:] = 0
    expected = _call(model, encoder_attention_mask=padded, audio_encoder_attention_mask=padded)
    unmasked = _call(model, encoder_attention_mask=torch.ones(2, 16), audio_encoder_attention_mask=torch.ones(2, 16))
    assert not torch.allclose(expected, unmasked, atol=1e-3)
    with _patched(model), inject_ltx2.generation(model):
        got = _call(model, encoder_attention_mask=padded, audio_encoder_attention_mask=padded)
    assert seen and all(m is not None for m in seen)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_a_mask_written_in_place_inside_a_generation_is_read_again(seen):
    model = ltx2_transformer(2)
    mask = torch.ones(2, 16)
    with _patched(model), inject_ltx2.generation(model):
        _call(model, encoder_attention_mask=mask, audio_encoder_attention_mask=mask)
        mask[1, -4:] = 0  # same tensor, new version: a stale "all ones" would drop the padding
        got = _call(model, encoder_attention_mask=mask, audio_encoder_attention_mask=mask)
    expected = _call(model, encoder_attention_mask=mask, audio_encoder_attention_mask=mask)
    assert seen[:4] == [None] * 4 and all(m is not None for m in seen[4:])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_outside_a_generation_or_under_autograd_the_masks_stay(seen):
    model = ltx2_transformer(2)
    mask = torch.ones(2, 16)
    with _patched(model):
        _call(model, encoder_attention_mask=mask, audio_encoder_attention_mask=mask)  # no generation scope
        cache = vars(model)[inject_ltx2.CACHE_ATTR]
        assert cache.without_ones_masks({"encoder_attention_mask": mask})["encoder_attention_mask"] is mask
        with inject_ltx2.generation(model), torch.enable_grad():
            assert cache.without_ones_masks({"encoder_attention_mask": mask})["encoder_attention_mask"] is mask
        with inject_ltx2.generation(model), torch.inference_mode():
            frozen = torch.ones(2, 16)  # an inference tensor has no version counter: kept
            assert cache.without_ones_masks({"encoder_attention_mask": frozen})["encoder_attention_mask"] is frozen
    assert seen and all(m is not None for m in seen)


def test_revert_removes_the_rule():
    model = ltx2_transformer(2)
    cls = type(model)
    report = _patched(model)
    report.revert()
    assert type(model) is cls and inject_ltx2.CACHE_ATTR not in vars(model)
