"""The figures of `ltxbench report`: one per result document, and the headline across GPUs.

Each figure carries, under its plot, the result file(s) it was drawn from and the commit each recorded.
matplotlib is a dependency of ltxbench; where it is missing anyway the report refuses to start (exit 4).
"""

from __future__ import annotations

from ltxbench.errors import EnvironmentProblem
from ltxbench.results.report_documents import OURS, Document, main_measure, measure_label
from ltxbench.results.report_tables import micro_cases


def require_matplotlib() -> None:
    try:
        import matplotlib
    except ImportError:
        raise EnvironmentProblem("ltxbench report draws its figures with matplotlib, which is not installed",
                                 hint="pip install matplotlib (a dependency of ltxbench: reinstall it)") from None
    matplotlib.use("Agg")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _caption(fig, lines: list[str]) -> None:
    """The sources under the plot, in the figure itself, so that a copied image still says where it came from.
    The figure grows by the caption's height; the axes keep their size."""
    height, extra = fig.get_figheight(), 0.08 + 0.12 * len(lines)
    pars = fig.subplotpars
    bottom, top = pars.bottom * height + extra, (1 - pars.top) * height
    fig.set_figheight(height + extra)
    fig.subplots_adjust(bottom=bottom / (height + extra), top=1 - top / (height + extra))
    fig.text(0.01, 0.02 / (height + extra), "\n".join(lines), fontsize=7, ha="left", va="bottom", color="0.3")


def _run_title(d: Document) -> str:
    params = next((r["params"] for r in d.doc["records"]), {})
    size = f"{params['num_frames']} frames {params.get('height')}x{params.get('width')}" if "num_frames" in params \
        else ""
    return " · ".join(str(x) for x in (params.get("model"), size, params.get("phase")) if x)


def e2e_figure(d: Document):
    plt = _pyplot()
    # a configuration that ran out of memory under its budget has no bar (the README's table says so)
    records = [r for r in d.doc["records"] if r["metric"] == "time" and r["name"] != "compile"
               and r["stats"]["median"] is not None]
    measures = list(dict.fromkeys(measure_label(r) for r in records))
    main = main_measure(records)
    measures.sort(key=lambda m: m != main)  # the measure the speedups are read from first
    configs = list(dict.fromkeys(r["provider"] for r in records))
    fig, axes = plt.subplots(1, len(measures), figsize=(3.2 * len(measures) + 1.5, 3.8), squeeze=False)
    for ax, measure in zip(axes[0], measures, strict=True):
        recs = {r["provider"]: r for r in records if measure_label(r) == measure}
        names = [c for c in configs if c in recs]
        medians = [recs[c]["stats"]["median"] for c in names]
        spread = [[m - (recs[c]["stats"].get("p20") or m) for c, m in zip(names, medians, strict=True)],
                  [(recs[c]["stats"].get("p80") or m) - m for c, m in zip(names, medians, strict=True)]]
        bars = ax.bar(range(len(names)), medians, yerr=spread, capsize=3, color=[f"C{configs.index(c)}" for c in names])
        ax.bar_label(bars, labels=[f"{m:.2f}" for m in medians], fontsize=7, padding=2)
        ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
        ax.set_title(f"{measure} (ms, median; bars p20–p80)", fontsize=9)
    fig.suptitle(_run_title(d), fontsize=10)
    fig.tight_layout()
    _caption(fig, [d.provenance])
    return fig


def micro_figure(d: Document):
    """Achieved bandwidth of ltxbench's kernel and of the fastest baseline, in % of the run's copy peak."""
    plt = _pyplot()
    rows = []
    for (kernel, variant, shape_name, dtype), recs in micro_cases(d.doc).items():
        ours = recs.get(OURS)
        if ours is None or ours["stats"]["median"] is None:
            continue
        timed = [r for p, r in recs.items() if p != OURS and r["stats"]["median"] is not None]
        best = min(timed, key=lambda r: r["stats"]["median"], default=None)
        label = f"{kernel}{f' ({variant})' if variant else ''} {shape_name} {dtype}"
        rows.append((label, ours["derived"].get("pct_of_copy_peak"),
                     None if best is None else best["derived"].get("pct_of_copy_peak"),
                     None if best is None else best["provider"]))
    rows = [r for r in rows if r[1] is not None]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.28 * len(rows) + 1.6))
    ys = list(range(len(rows)))[::-1]
    ax.barh([y + 0.2 for y in ys], [r[1] for r in rows], height=0.4, color="C0", label="ltxbench")
    ax.barh([y - 0.2 for y in ys], [r[2] or 0 for r in rows], height=0.4, color="C1", label="fastest baseline")
    for y, (_, _, pct, provider) in zip(ys, rows, strict=True):
        if provider is not None and pct is not None:
            ax.text(pct + 1, y - 0.2, provider, fontsize=6, va="center")
    ax.set_yticks(ys, [r[0] for r in rows], fontsize=7)
    ax.axvline(100, color="black", linestyle="--", linewidth=1)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_xlabel("% of the copy peak measured in the run (median)")
    ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2)
    fig.tight_layout()
    _caption(fig, [d.provenance])
    return fig


def profile_figure(d: Document):
    """Kernel time per step by family, stacked, one bar per configuration."""
    plt = _pyplot()
    records = [r for r in d.doc["records"] if not r["name"].startswith(("kernel:", "timeline:"))]
    configs = list(dict.fromkeys(r["provider"] for r in records))
    families = list(dict.fromkeys(r["name"] for r in records))
    fig, ax = plt.subplots(figsize=(1.4 * len(configs) + 4, 4))
    bottoms = [0.0] * len(configs)
    for i, family in enumerate(families):
        heights = [next((r["stats"]["median"] / (r["params"].get("steps") or 1) for r in records
                         if r["name"] == family and r["provider"] == c), 0.0) for c in configs]
        if any(heights):
            ax.bar(configs, heights, bottom=bottoms, label=family, color=f"C{i}")
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_ylabel("kernel time per step, ms")
    ax.set_title(_run_title(d), fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    _caption(fig, [d.provenance])
    return fig


FIGURES = {"e2e": e2e_figure, "micro": micro_figure, "profile": profile_figure}


def figure_for(d: Document):
    """The figure of a document, or None for a kind (or content) with nothing to plot."""
    draw = FIGURES.get(d.doc["kind"])
    return None if draw is None or not d.doc["records"] else draw(d)


def headline_figure(documents: list[Document]):
    """The main step time of the same benchmark on several GPUs, configurations side by side."""
    plt = _pyplot()
    per_doc = []
    for d in documents:
        records = [r for r in d.doc["records"] if r["metric"] == "time" and r["name"] != "compile"
                   and r["stats"]["median"] is not None]
        main = main_measure(records)
        per_doc.append({r["provider"]: r["stats"]["median"] for r in records if measure_label(r) == main})
    configs = list(dict.fromkeys(c for medians in per_doc for c in medians))
    width = 0.8 / len(documents)
    fig, ax = plt.subplots(figsize=(2.0 * len(configs) + 2, 4.2))
    for i, (d, medians) in enumerate(zip(documents, per_doc, strict=True)):
        xs = [j + (i - (len(documents) - 1) / 2) * width for j, c in enumerate(configs) if c in medians]
        values = [medians[c] for c in configs if c in medians]
        bars = ax.bar(xs, values, width=width, label=d.gpu, color=f"C{i}")
        ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], fontsize=7, padding=2)
    ax.set_xticks(range(len(configs)), configs)
    ax.set_ylabel(f"{main} ms (median, lower is better)")
    ax.set_title(_run_title(documents[0]), fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    _caption(fig, [d.provenance for d in documents])
    return fig


# A tEXt chunk in every figure `report` draws: how a later report tells its own stale figures from a user's PNG.
FIGURE_TAG = "ltxbench report"


def save(fig, path) -> None:
    plt = _pyplot()
    # No software/date metadata: the same documents give the same bytes.
    fig.savefig(path, dpi=110, metadata={"Software": None, "Source": FIGURE_TAG})
    plt.close(fig)


def drawn_by_report(path) -> bool:
    """`path` is a figure some `ltxbench report` drew (its tag in the PNG's first chunks)."""
    with open(path, "rb") as f:
        return f"Source\0{FIGURE_TAG}".encode() in f.read(4096)
