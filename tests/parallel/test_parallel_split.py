"""The parallel splits' mechanics on the CPU: 2 (or 4) gloo processes run a tiny LTX-Video / LTX-2 generation alone,
split over the ranks (ltxbench.parallel: the guidance batch, the video tokens through diffusers' context parallelism)
and alone again after the revert (tests/workers/parallel_latents.py). Unpatched and with our kernels (reference
provider): the split latents equal the one-process latents up to fp32 rounding; the revert leaves the model exactly as
it was; a split whose halves are not gathered back fails the check."""

from __future__ import annotations

import pytest

from tests.helpers import run_ranks

# Each test starts 2 or 4 processes that each build a pipeline: minutes in all (make test-all runs them).
pytestmark = pytest.mark.slow

TOL = 1e-5  # max |split - alone| / max |alone|: fp32, the same math in another grouping (a 2-row GEMM, a shard)


def _run(tmp_path, family, split, config, fails=False, nproc=2, **spec):
    return run_ranks(tmp_path, {"family": family, "split": split, "config": config, **spec}, nproc, fails)


@pytest.mark.parametrize("config", ["baseline", "optimized"])
@pytest.mark.parametrize("split", ["cfg", "ulysses"])
def test_ltx_split_equals_one_process(tmp_path, split, config):
    result = _run(tmp_path, "ltx", split, config)
    assert result["error"] < TOL, result
    assert result["after_revert_equal"] and not result["hooks_left"], result
    batch, tokens = (1, 8) if split == "cfg" else (2, 4)  # 2 x 2 x 2 tokens; the pair on 2 ranks or the tokens
    assert {tuple(shape[:2]) for shape in result["calls"]} == {(batch, tokens)}, result["calls"]
    if config == "optimized":  # the prompt's keys/values built once per generation on each rank, reused by its steps
        assert result["caches"] == {"builds": 1, "hits": 2}, result["caches"]
    # ulysses runs the pair (batch 2) through diffusers' Ulysses attention, ours takes batch-1 calls only: block 0's
    # attn1, which our kernels run once for the pair's two equal halves (inject/ltx/cfg.py), once per step
    assert result["exchanges"] == (3 if (split, config) == ("ulysses", "optimized") else 0), result["exchanges"]
    # each of them sent the buffer our q/k norm + RoPE kernel wrote (ops.qk_rms_norm_rope_pack), none packed again
    assert result["packs"] == result["exchanges"], result


def test_ring_refused_without_gpu(tmp_path):
    """Ring attention merges partial results by their log-sum-exp: torch's cuDNN attention, GPU only (the GPU test
    covers ring); on the CPU the split is refused with one line, not run wrong."""
    assert "--parallel ring / cfg+ring need torch's cuDNN attention" in _run(tmp_path, "ltx", "ring", "baseline",
                                                                            fails=True)


def test_ltx_guidance_off_runs_whole_batch(tmp_path):
    """Without guidance the batch (1) does not split: every rank runs it whole, and the output is the same."""
    result = _run(tmp_path, "ltx", "cfg", "optimized", guidance=1.0)
    assert result["error"] < TOL and {tuple(s[:1]) for s in result["calls"]} == {(1,)}, result


@pytest.mark.parametrize("config", ["baseline", "optimized"])
@pytest.mark.parametrize("split", ["cfg", "ulysses", "hybrid"])
def test_ltx2_split_equals_one_process(tmp_path, split, config):
    """LTX-2: cfg splits the guidance pair (the STG and modality-isolated passes, batch 1, run whole on every rank);
    ulysses splits the video tokens of every pass, the audio stream and the prompt whole on every rank (their
    attentions local), the video-to-audio attention through Ulysses with each rank's copy of the audio queries;
    hybrid splits the pair by batch with context parallelism off, and the batch-1 passes' tokens with it on."""
    result = _run(tmp_path, "ltx2", split, config)
    assert result["error"] < TOL, result
    assert result["after_revert_equal"] and not result["hooks_left"], result
    shapes = {tuple(shape[:2]) for shape in result["calls"]}
    expected = {"cfg": {(1, 8)}, "ulysses": {(2, 4), (1, 4)}, "hybrid": {(1, 8), (1, 4)}}[split]
    assert shapes == expected, result["calls"]
    if config == "optimized":  # the text keys/values kept for the generation on each rank
        assert result["caches"]["hits"] > result["caches"]["builds"] > 0, result["caches"]
    # the batch-1 passes' video self-attentions through our Ulysses attention (one all-to-all for q, k, v)
    assert (result["exchanges"] > 0) == (config == "optimized" and split != "cfg"), result["exchanges"]
    assert result["packs"] == result["exchanges"], result  # each from the q/k kernel's send buffer


def test_ltx2_hybrid_compiled_equals_one_process(tmp_path):
    """hybrid under torch.compile: the context-parallel switch between the pair and the batch-1 pass changes what
    the compiled code must do (the processors' parallel config, diffusers' split and gather hooks); the compiled
    split's latents still equal one process's."""
    result = _run(tmp_path, "ltx2", "hybrid", "optimized+compile")
    assert result["error"] < TOL, result
    assert {tuple(shape[:2]) for shape in result["calls"]} == {(1, 8), (1, 4)}, result["calls"]


@pytest.mark.parametrize("family", ["ltx", "ltx2"])
def test_fp8_split_equals_one_process(tmp_path, family):
    """--precision fp8 over the ranks: the activations are quantized per token, so splitting the tokens changes no
    scale, and the split output equals one process's FP8 output up to the fp32 rounding of a smaller GEMM, which can
    move a value across an e4m3 rounding boundary (3 mantissa bits): a few flipped roundings stay far below FP8's own
    error, a scale taken over other tokens (every value rounded on another grid) is of its size."""
    result = _run(tmp_path, family, "ulysses", "optimized-fp8")
    fp8_error = result["alone_vs_unpatched"]
    assert fp8_error > 1e-3 and result["error"] < 0.1 * fp8_error, result  # the split of a real FP8 run
    assert result["after_revert_equal"] and not result["hooks_left"], result


def test_ltx2_local_video_keys_fail(tmp_path):
    """The check can fail: the video-to-audio attention run locally (this rank's video keys alone) is far off."""
    result = _run(tmp_path, "ltx2", "ulysses", "optimized", mutation="local-keys")
    assert result["error"] > 100 * TOL, result


@pytest.mark.parametrize("model", ["wan-tiny", "wan-tiny-a14b"])
@pytest.mark.parametrize("config", ["baseline", "optimized"])
def test_wan_guidance_split_equals_one_process(tmp_path, config, model):
    """Wan's pipeline makes two batch-1 calls a step: unpatched they cannot split and run whole on both ranks; the
    optimized configurations pair them into one call of batch 2, which gives each rank one sample (both experts of
    A14B split)."""
    result = _run(tmp_path, "wan", "cfg", config, model=model)
    assert result["error"] < TOL and result["self_attention_tokens"] == [48], result  # every token on every rank
    assert result["after_revert_equal"] and not result["hooks_left"], result
    steps = 3
    assert len(result["calls"]) == (steps if config == "optimized" else 2 * steps), result["calls"]
    assert {shape[0] for shape in result["calls"]} == {1}, result["calls"]
    assert result["parallel"]["denoisers"] == (2 if model == "wan-tiny-a14b" else 1), result["parallel"]


@pytest.mark.parametrize(("model", "config", "image"), [
    ("wan-tiny", "baseline", False), ("wan-tiny", "optimized", False), ("wan-tiny-a14b", "optimized", False),
    ("wan-tiny-ti2v", "optimized", False), ("wan-tiny-i2v", "optimized", True)])
def test_wan_token_split_equals_one_process(tmp_path, model, config, image):
    """ulysses on Wan: the root takes latents (B, C, F, H, W), so the tokens split below it (diffusers' Wan plan:
    RoPE's tables, block 0's input, proj_out gathered); the prompt (and I2V's image tokens) stay whole and attn2
    runs locally. Unpatched, the two batch-1 calls a step each split their tokens; optimized, the pair's one call of
    batch 2 does. Wan 2.2 5B's per-token timesteps (wan-tiny-ti2v) split with the tokens at the root."""
    result = _run(tmp_path, "wan", "ulysses", config, model=model, image=image)
    assert result["error"] < TOL, result
    assert result["after_revert_equal"] and not result["hooks_left"], result
    assert result["parallel"]["ulysses_degree"] == 2 and not result["parallel"]["uneven_tokens"], result["parallel"]
    steps = 3
    batch = 2 if config == "optimized" else 1  # the root's batch: the split is below it
    assert [shape[0] for shape in result["calls"]] == [batch] * (steps * (2 // batch)), result["calls"]
    assert result["self_attention_tokens"] == [48 // 2], result  # 9 frames of 64 x 64: 3 x 4 x 4 tokens, halved


def test_wan_local_self_attention_fails(tmp_path):
    """The Wan token split's check can fail: attn1 run on this rank's tokens alone (no exchange) is far off."""
    result = _run(tmp_path, "wan", "ulysses", "optimized", mutation="local-self")
    assert result["error"] > 100 * TOL, result


def test_wan_cfg_ulysses_four_processes(tmp_path):
    """cfg+ulysses on 4 processes: the pair's samples over the guidance ranks, each one's tokens over 2."""
    result = _run(tmp_path, "wan", "cfg+ulysses", "optimized", nproc=4)
    assert result["error"] < TOL and result["after_revert_equal"] and not result["hooks_left"], result
    assert {shape[0] for shape in result["calls"]} == {1}, result["calls"]
    assert result["self_attention_tokens"] == [48 // 2], result


def test_wan_missing_gather_fails(tmp_path):
    """The Wan check can fail too: each rank keeping its own sample of the pair instead of gathering both."""
    result = _run(tmp_path, "wan", "cfg", "optimized", mutation="own-half")
    assert result["error"] > 100 * TOL, result


def test_missing_gather_fails(tmp_path):
    """The check can fail: halves not gathered back (each rank repeats its own half) are far off."""
    result = _run(tmp_path, "ltx", "cfg", "optimized", mutation="own-half")
    assert result["error"] > 100 * TOL, result


def test_swapped_heads_fail(tmp_path):
    """The check can fail: our Ulysses attention handing back the head groups in the wrong order is far off."""
    result = _run(tmp_path, "ltx2", "hybrid", "optimized", mutation="swapped-heads")
    assert result["exchanges"] > 0 and result["error"] > 100 * TOL, result


@pytest.mark.parametrize("family", ["ltx", "ltx2"])
def test_scaled_packed_v_fails(tmp_path, family):
    """The check can fail: the fused send buffer's v 1% too large is caught (on tiny LTX-Video it serves one attention
    a step, block 0's attn1; on LTX-2 the batch-1 passes' video self-attentions)."""
    result = _run(tmp_path, family, "ulysses", "optimized", mutation="scaled-packed-v")
    assert result["packs"] > 0 and result["error"] > 10 * TOL, result


@pytest.mark.parametrize("family", ["ltx", "ltx2"])
def test_cfg_ulysses_four_processes(tmp_path, family):
    """cfg+ulysses on 4 processes: the (cfg, ring, ulysses) mesh's groups, each guidance half's tokens over 2 ranks,
    its batch-1 self-attentions through our Ulysses attention."""
    result = _run(tmp_path, family, "cfg+ulysses", "optimized", nproc=4)
    assert result["error"] < TOL and result["after_revert_equal"], result
    assert result["exchanges"] > 0 and result["packs"] == result["exchanges"], result
    assert {tuple(shape[:2]) for shape in result["calls"] if shape[0] == 1} == {(1, 4)}, result["calls"]


@pytest.mark.parametrize("config", ["optimized", "optimized+compile"])
def test_ltx_cfg_ring_four_processes(tmp_path, config):
    """cfg+ring on 4 processes: each guidance half's tokens over 2 ranks, every batch-1 self-attention through our
    ring attention (k and v from the q/k kernel, one all-gather, one attention over all keys), compiled too."""
    result = _run(tmp_path, "ltx", "cfg+ring", config, nproc=4)
    assert result["error"] < TOL and result["after_revert_equal"] and not result["hooks_left"], result
    assert (result["gathers"] > 0) == (config == "optimized") and result["exchanges"] == 0, result  # eager counts
    assert {tuple(shape[:2]) for shape in result["calls"]} == {(1, 4)}, result["calls"]


def test_ring_own_keys_fail(tmp_path):
    """The check can fail: our ring attention over this rank's own keys and values alone is far off."""
    result = _run(tmp_path, "ltx", "cfg+ring", "optimized", nproc=4, mutation="own-keys")
    assert result["gathers"] > 0 and result["error"] > 100 * TOL, result


@pytest.mark.parametrize("family", ["ltx", "ltx2"])
def test_image_to_video_token_split(tmp_path, family):
    """Image-to-video: the timestep is per token (0 on the first frame's), so it is split with the tokens."""
    result = _run(tmp_path, family, "ulysses", "optimized", image=True)
    assert result["error"] < TOL and result["after_revert_equal"], result
