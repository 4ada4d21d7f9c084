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


def plot(results: dict[str, Any], path: str) -> str | None:
    """Saves examples/s per configuration as a PNG; None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(pip install matplotlib for a PNG plot of these results)", file=sys.stderr)
        return None
    rows = results["results"]
    labels = [
        f"{r['replicas']}r x {r['workers']}w" + (" raw" if r.get("launcher") == "raw" else "")
        for r in rows
    ]
    figure, axis = plt.subplots(figsize=(6, 3.5))
    axis.bar(labels, [r["examples_per_sec"] for r in rows])
    for i, r in enumerate(rows):
        if r["scaling_efficiency"] is not None:
            axis.annotate(f"{r['scaling_efficiency']:.2f}", (i, r["examples_per_sec"]), ha="center")
    axis.set(ylabel="examples/s", title=f"mirrorkit bench: {results['model']}")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path
