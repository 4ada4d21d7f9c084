"""`mirrorkit bench`'s results as people read them: the scaling table and the PNG plot."""

from __future__ import annotations

import sys
from typing import Any

from mirrorkit import tables


def format_table(rows: list[dict[str, Any]]) -> str:
    """The scaling table: replicas, workers, global and per-replica examples/s, efficiency."""
    headers = ["replicas", "workers", "pinned", "examples/s", "per replica", "efficiency"]
    raw = any(r.get("launcher") == "raw" for r in rows)
    body = [
        ([r.get("launcher", "mirrorkit")] if raw else [])
        + [
            str(r["replicas"]),
            str(r["workers"]),
            "yes" if r["pinned"] else "no",
            f"{r['examples_per_sec']:,.1f}",
            f"{r['examples_per_sec_per_replica']:,.1f}",
            "-" if r["scaling_efficiency"] is None else f"{r['scaling_efficiency']:.3f}",
        ]
        for r in rows
    ]
    return tables.columns((["launcher"] if raw else []) + headers, body)


def format_verdicts(rows: list[dict[str, Any]]) -> str:
    """Each configuration's throughput verdict (its last timed epoch), one line each."""
    lines = ["verdicts (ThroughputCallback, the last timed epoch of each):"]
    for row in rows:
        if row.get("verdict"):
            where = f"{row['replicas']} replica(s) x {row['workers']} worker(s)"
            lines.append(f"  {where}: {row['verdict']}")
    return "\n".join(lines)


#: The series a plot draws: (name, marker, line style, color), in legend order.
SERIES = (
    ("1 worker, N replicas", "o", "-", "tab:blue"),
    ("N workers, 1 replica each", "s", "-", "tab:orange"),
    ("raw tf.distribute (--compare-raw)", "^", "-.", "tab:green"),
)


def _devices(row: dict[str, Any]) -> int:
    return row["replicas"] * row["workers"]


def _series(rows: list[dict[str, Any]]) -> list[tuple[tuple[str, str, str, str], list]]:
    """Each series with its rows by device count; the 1-device row starts both of ours."""
    raw = [r for r in rows if r.get("launcher") == "raw"]
    ours = [r for r in rows if r.get("launcher") != "raw"]
    one = [r for r in ours if r["workers"] == 1]
    several = [r for r in ours if r["workers"] > 1]
    if several:
        several = [r for r in one if _devices(r) == 1] + several
        one = one if len(one) > 1 else []
    groups = (one, several, raw)
    return [(s, sorted(g, key=_devices)) for s, g in zip(SERIES, groups, strict=True) if g]


def figure(results: dict[str, Any]) -> Any:
    """The scaling plot as a matplotlib ``Figure`` (on an Agg canvas, no pyplot).

    Examples/s against devices (replicas across all workers) for each series, the
    ideal linear-scaling line (1 device's examples/s x devices), and each
    configuration's scaling efficiency (its table's figure) as a percentage.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import StrMethodFormatter

    rows = results["results"]
    fig = Figure(figsize=(8, 4.2), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    axis = fig.add_subplot()
    labelled = []
    for (name, marker, style, color), group in _series(rows):
        xs, ys = [_devices(r) for r in group], [r["examples_per_sec"] for r in group]
        axis.plot(xs, ys, marker=marker, ls=style, color=color, ms=7, label=name, zorder=3)
        labelled += [
            (r, color) for r in group if _devices(r) > 1 and r.get("scaling_efficiency") is not None
        ]
    for launcher, style, color in (("mirrorkit", "--", "black"), ("raw", ":", "tab:green")):
        own = [r for r in rows if r.get("launcher", "mirrorkit") == launcher]
        base = [r["examples_per_sec"] for r in own if _devices(r) == 1]
        xs = sorted({_devices(r) for r in own})
        if base and len(xs) > 1:
            what = "1 device x N" if launcher == "mirrorkit" else "raw's 1 worker x N"
            axis.plot(xs, [base[0] * n for n in xs], ls=style, color=color, lw=1.2,
                      label=f"ideal linear scaling: {what}")  # fmt: skip
    counts = sorted({_devices(r) for r in rows})
    if max(counts) > 8:
        axis.set_xscale("log", base=2)
    axis.set_xticks(counts, [str(n) for n in counts])
    axis.set_xticks([], minor=True)
    axis.margins(x=0.08)
    top = max(line.get_ydata().max() for line in axis.get_lines())
    axis.set_ylim(0, top * 1.15)
    axis.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    axis.grid(alpha=0.3)
    batch = results.get("per_replica_batch_size")
    axis.set(
        xlabel="devices (replicas across all workers)",
        ylabel="examples per second",
        title=f"mirrorkit bench: {results['model']} training throughput"
        + (f", per-replica batch {batch}" if batch else ""),
    )
    axis.legend(
        loc="upper left", bbox_to_anchor=(1.02, 1), borderaxespad=0, fontsize=9,
        title="% by a point: measured / ideal", title_fontsize=9,
    )  # fmt: skip
    _label_efficiencies(fig, axis, labelled)
    return fig


def _label_efficiencies(fig: Any, axis: Any, labelled: list) -> None:
    """Each efficiency above-left of its point, stacked upward where points are close."""
    fig.canvas.draw()
    to_points = 72 / fig.dpi
    line = 12  # points between stacked labels (9-point text)
    for x in sorted({_devices(r) for r, _ in labelled}):
        here = sorted(
            (r for r in labelled if _devices(r[0]) == x), key=lambda p: p[0]["examples_per_sec"]
        )
        floor = None
        for row, color in here:
            y = axis.transData.transform((x, row["examples_per_sec"]))[1] * to_points
            at = y + 3 if floor is None else max(y + 3, floor + line)
            axis.annotate(
                f"{row['scaling_efficiency']:.0%}", (x, row["examples_per_sec"]),
                xytext=(-6, at - y), textcoords="offset points", ha="right", va="bottom",
                fontsize=9, color=color, fontweight="bold",
                bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8},
            )  # fmt: skip
            floor = at


def plot(results: dict[str, Any], path: str) -> str | None:
    """Saves the scaling plot (`figure`) as a PNG; None when matplotlib is not installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("(pip install matplotlib for a PNG plot of these results)", file=sys.stderr)
        return None
    figure(results).savefig(path)
    return path
