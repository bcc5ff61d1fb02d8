"""The error of the FP8 configuration, measured in the run that times it: one transformer call on the inputs of a
generation's first step (the same seed as the timed runs), by the model as it comes (bf16), by our bf16 kernels, by
our FP8 projections, and by an fp32 copy of the model (the reference, where the GPU has room for it and no
--memory-budget placement streams its blocks). Cosine and
relative L2 of each against the reference and of FP8 against bf16; the gate is FP8's cosine to our bf16 output.
Then the whole generation, decoded: PSNR and SSIM of the FP8 video against the bf16 one (same seed). The
transformer's weight memory with and without the FP8 weights goes beside it.
"""

from __future__ import annotations

import copy
import math

from ltxbench.configurations import Configuration

FP8_COSINE_GATE = 0.995  # FP8 output against our bf16 kernels' output, one transformer step


class _Captured(Exception):
    """Stops the generation once the transformer's first call is captured."""


def first_call_inputs(pipe, run_generation) -> tuple[tuple, dict]:
    """(args, kwargs) of the transformer's first call in `run_generation()` (tensors cloned); the generation stops
    there."""
    import torch

    captured = {}

    def hook(_module, args, kwargs):
        clone = lambda v: v.clone() if torch.is_tensor(v) else v  # noqa: E731
        captured["call"] = (tuple(clone(a) for a in args), {k: clone(v) for k, v in kwargs.items()})
        raise _Captured

    handle = pipe.transformer.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        run_generation()
    except _Captured:
        pass
    finally:
        handle.remove()
    if "call" not in captured:
        raise RuntimeError("the generation never called the transformer")
    return captured["call"]


def compare(got, expected) -> dict:
    """cosine and relative L2 (‖got − expected‖ / ‖expected‖) over every element, in float64."""
    import torch

    g, e = got.flatten().double(), expected.flatten().double()
    return {"cosine": torch.nn.functional.cosine_similarity(g, e, dim=0).item(),
            "rel_l2": ((g - e).norm() / e.norm()).item()}


def _output(transformer, args, kwargs):
    import torch

    with torch.no_grad():
        out = transformer(*args, **{**kwargs, "return_dict": False})
    return (out[0] if isinstance(out, tuple) else out).float()


def _fp32_reference(transformer, args, kwargs, log) -> tuple:
    """The fp32 copy's output, or (None, why not) where the device lacks room for it."""
    import torch

    params = sum(p.numel() for p in transformer.parameters())
    device = next(transformer.parameters()).device
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if params * 4 * 1.3 > free:
            return None, f"an fp32 copy needs {params * 4 / 2**30:.1f} GiB; {free / 2**30:.1f} GiB free"
    log("precision error: fp32 reference (a float32 copy of the transformer)")
    reference = copy.deepcopy(transformer).float()
    widen = lambda v: v.float() if torch.is_tensor(v) and v.is_floating_point() else v  # noqa: E731
    try:
        return _output(reference, tuple(widen(a) for a in args), {k: widen(v) for k, v in kwargs.items()}), None
    finally:
        del reference
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _pixels(pipe, video):
    """The decoded video as (frames, channels, height, width) in [0, 1], as users get it (the pipeline's own
    postprocessing), float32 on the video's device."""
    frames = pipe.video_processor.postprocess_video(video.float(), output_type="pt")
    return frames.flatten(0, 1).float().to(video.device)


def psnr(got, expected) -> float | None:
    """Peak signal-to-noise ratio in dB for [0, 1] data (None where the two are identical)."""
    mse = (got.double() - expected.double()).pow(2).mean().item()
    return None if mse == 0 else 10.0 * math.log10(1.0 / mse)


def ssim(got, expected, chunk: int = 16) -> float:
    """Mean structural similarity of (N, C, H, W) images in [0, 1]: Wang et al.'s 11x11 Gaussian window (sigma 1.5),
    C1 = 0.01², C2 = 0.03², per channel, valid positions only, averaged over all of them."""
    import torch

    coords = torch.arange(11, dtype=torch.float64, device=got.device) - 5
    g = torch.exp(-coords.pow(2) / (2 * 1.5**2))
    g = g / g.sum()
    channels = got.shape[1]
    window = (g[:, None] * g[None, :]).expand(channels, 1, 11, 11).contiguous()
    blur = lambda x: torch.nn.functional.conv2d(x, window, groups=channels)  # noqa: E731
    c1, c2, total, count = 0.01**2, 0.03**2, 0.0, 0
    for start in range(0, got.shape[0], chunk):
        x, y = got[start:start + chunk].double(), expected[start:start + chunk].double()
        mx, my = blur(x), blur(y)
        vx, vy, cov = blur(x * x) - mx * mx, blur(y * y) - my * my, blur(x * y) - mx * my
        value = ((2 * mx * my + c1) * (2 * cov + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))
        total, count = total + value.sum().item(), count + value.numel()
    return total / count


def video_error(pipe, inject, run_full, precision: str = "fp8") -> dict:
    """PSNR and SSIM of the decoded video in `precision` against the bf16 one (our kernels both, the same seed): a
    full generation each (`run_full()` -> (timings, outputs with "vae_decode"))."""
    frames = {}
    for name in ("bf16", precision):
        report = inject(name)
        try:
            frames[name] = _pixels(pipe, run_full()[1]["vae_decode"])
        finally:
            report.revert()
    return {"psnr_db": psnr(frames[precision], frames["bf16"]), "ssim": ssim(frames[precision], frames["bf16"]),
            "frames": frames["bf16"].shape[0]}


def measure(pipe, inject, run_generation, log, run_full=None, precision: str = "fp8") -> dict:
    """The record of an FP8 precision's error (fp8, fp8-attention): `inject(precision)` patches the pipeline (a
    report with revert()), `run_generation()` runs one generation of the benchmark's workload; `run_full()`
    (optional) one generation through the VAE, for the decoded video's PSNR / SSIM."""
    from ltxbench.inject.fp8 import weight_bytes

    transformer = pipe.transformer
    args, kwargs = first_call_inputs(pipe, run_generation)
    outputs = {"baseline": _output(transformer, args, kwargs)}
    weights = {"bf16": weight_bytes(transformer)["total"]}
    measured = Configuration.of("ours", precision)
    for name, config in (("bf16", "optimized"), (precision, measured)):
        report = inject(name)
        try:
            outputs[config] = _output(transformer, args, kwargs)
            if name == precision:
                weights["fp8"] = weight_bytes(transformer)["total"]
        finally:
            report.revert()
    from ltxbench.memory.apply import placement_of

    if placement_of(pipe) is not None:  # a copy of streamed blocks would share their device slots and host slabs
        reference, skipped = None, "the pipeline is placed by --memory-budget: its blocks cannot be copied as they run"
    else:
        reference, skipped = _fp32_reference(transformer, args, kwargs, log)
    result = {"precision": precision, "fp8_vs_bf16": compare(outputs[measured], outputs["optimized"]),
              "gate_cosine": FP8_COSINE_GATE,
              "weight_bytes": weights, "weight_ratio": weights["fp8"] / weights["bf16"],
              "input_shape": list(args[0].shape if args else kwargs["hidden_states"].shape)}
    result["passed"] = result["fp8_vs_bf16"]["cosine"] >= FP8_COSINE_GATE
    if reference is None:
        result["fp32_reference"] = f"skipped: {skipped}"
    else:
        result["vs_fp32"] = {name: compare(out, reference) for name, out in outputs.items()}
    if run_full is not None:
        log(f"precision error: the decoded video, bf16 and {precision} (a full generation each)")
        result["video"] = video_error(pipe, inject, run_full, precision)
    return result


def summary(error: dict) -> str:
    """One line for the log."""
    line = (f"{error.get('precision', 'fp8')} step error: cosine {error['fp8_vs_bf16']['cosine']:.5f} to bf16 "
            f"(gate {error['gate_cosine']}: "
            f"{'passed' if error['passed'] else 'FAILED'}), rel L2 {error['fp8_vs_bf16']['rel_l2']:.4f}")
    if "vs_fp32" in error:
        line += "; vs fp32: " + ", ".join(f"{k} cos {v['cosine']:.5f} rel L2 {v['rel_l2']:.4f}"
                                          for k, v in error["vs_fp32"].items())
    if "video" in error:
        video = error["video"]
        line += (f"; decoded video vs bf16: PSNR {video['psnr_db']:.2f} dB, SSIM {video['ssim']:.4f}"
                 if video["psnr_db"] is not None else "; decoded video identical to bf16")
    return line + f"; transformer weights {error['weight_ratio']:.2f}x of bf16"


def error_records(results: dict, params: dict) -> list[dict]:
    """The FP8 configurations' step error as result records: cosine to bf16 (higher is better, so `compare` flags a
    drop) with the rest of the measurement in derived."""
    from ltxbench.results.schema import make_record, stats_from_samples

    records = []
    for name, res in results.items():
        error = res.get("precision_error")
        if error is None:
            continue
        derived = {"rel_l2_vs_bf16": error["fp8_vs_bf16"]["rel_l2"], "weight_bytes_bf16": error["weight_bytes"]["bf16"],
                   "weight_bytes_fp8": error["weight_bytes"]["fp8"], "weight_ratio": error["weight_ratio"]}
        if "video" in error:
            derived.update({f"video_{k}": v for k, v in error["video"].items()})
        for config, values in error.get("vs_fp32", {}).items():
            derived[f"{config}_cosine_vs_fp32"] = values["cosine"]
            derived[f"{config}_rel_l2_vs_fp32"] = values["rel_l2"]
        records.append(make_record("step_error", name, error.get("precision", "fp8"), params, "cosine_vs_bf16", "1",
                                   "higher",
                                   stats_from_samples([error["fp8_vs_bf16"]["cosine"]]), derived=derived,
                                   check={"passed": error["passed"], "min_cosine": error["gate_cosine"],
                                          "weights": "random" if params.get("weights") == "random" else "given"}))
    return records


def failed_gates(records) -> list[str]:
    """The step_error records below their gate (bench e2e then exits 1, after writing the result)."""
    return [f"{r['provider']}: cosine {r['stats']['median']:.5f} to bf16 < {r['check']['min_cosine']}"
            for r in records if r["name"] == "step_error" and r.get("check") and not r["check"]["passed"]]
