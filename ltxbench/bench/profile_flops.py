"""The achieved TFLOP/s of `ltxbench profile`'s GEMM and attention kernel families: the model FLOPs of each kind in
the profiled run (ltxbench.bench.flops.by_kind, counted once per run on the unpatched eager model) over that
family's kernel time, and their share of the GPU's dense peak for the configuration's precision.

The FLOPs are counted over the whole profiled run (text encoder and VAE included where the run has them), as the
kernel families' time is. Only the standard library at top level.
"""

from __future__ import annotations

from ltxbench.configurations import Configuration

RATED = ("GEMM", "attention")  # the kernel families with a FLOP kind of their own (flops.KINDS)
RATE_KEYS = ("model_tflop", "tflops", "pct_of_peak")  # what a rated family carries, in its summary and its record


def counting_config(configs: list[str]) -> str | None:
    """The configuration whose warmup counts the FLOPs: the first unpatched eager one (the model as it is); None
    where every configuration patches or compiles (then one more untimed run of the unpatched model counts them)."""
    return next((name for name in configs if Configuration(name).patch == "none"
                 and not Configuration(name).compiled), None)


def precision_of(config: str, dtype: str, family: str) -> str:
    """What a family's work ran in, for its peak: GEMMs in the configuration's projection precision (FP8 for ours
    in fp8 / fp8-attention), attention in FP8 only under fp8-attention; else the run's dtype."""
    ran_in = Configuration(config).precision
    if family == "GEMM":
        return dtype if ran_in == "bf16" else ran_in
    return "fp8" if ran_in == "fp8-attention" else dtype


def family_rates(flop: float | None, ms: float, gpu: str | None, precision: str) -> dict:
    """{model_tflop, tflops, pct_of_peak (a GPU of the peak table)} of `flop` FLOPs run in `ms` of kernel time;
    {} where nothing was counted or the family has no time."""
    from ltxbench.bench.flops import rates

    out = rates(flop, ms, gpu, precision)
    mfu = out.pop("mfu", None)
    if mfu is not None:
        out["pct_of_peak"] = 100 * mfu
    return out


def add_rates(results: dict, dtype: str) -> dict:
    """Every configuration's GEMM and attention family summaries get family_rates' fields, from the run's count
    (res["model_flop"]: {"kinds": {kind: FLOPs}, "gpu": name or None}); a configuration without one gets none.
    `results` is changed in place and returned."""
    for config, res in results.items():
        counted = res.get("model_flop")
        if not counted:
            continue
        for family in RATED:
            fam = res["families"][family]
            fam.update(family_rates(counted["kinds"].get(family), fam["ms"], counted.get("gpu"),
                                    precision_of(config, dtype, family)))
    return results


def rated(results: dict) -> bool:
    """Whether any configuration's GEMM or attention family has a TFLOP/s (the table's rows are shown then)."""
    return any("tflops" in res["families"].get(family, {}) for res in results.values() for family in RATED)


def table_cells(fam: dict) -> list[str]:
    """The two cells of a family's TFLOP/s row in the profile table: TFLOP/s, % of the dense peak ("-": none)."""
    if "tflops" not in fam:
        return ["-", "-"]
    pct, tflops = fam.get("pct_of_peak"), fam["tflops"]
    return [f"{tflops:.1f}" if tflops >= 10 else f"{tflops:.3g}", "-" if pct is None else f"{pct:.1f}"]
