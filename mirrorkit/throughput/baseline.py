"""The single-replica baseline that turns per-replica throughput into scaling efficiency."""

from __future__ import annotations

import json
import os
from typing import Any

from mirrorkit.number_checks import positive_number


def read_baseline(baseline: float | str | None) -> float | None:
    """A single-replica examples/s figure from a number or a `mirrorkit bench` JSON file."""
    if baseline is None or isinstance(baseline, (int, float)):
        return positive_number(
            baseline, "baseline", or_none=True, what="a positive examples/s figure"
        )
    if not isinstance(baseline, (str, os.PathLike)):
        raise TypeError(
            f"ThroughputCallback(baseline=...) takes single-replica examples/s as a number or the "
            f"path of a `mirrorkit bench` JSON file; got {type(baseline).__name__}"
        )
    try:
        with open(baseline) as f:
            data: Any = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"ThroughputCallback(baseline={str(baseline)!r}): no such file (working directory "
            f"{os.getcwd()}). Pass the JSON file `mirrorkit bench` wrote, or the single-replica "
            "examples/s as a number (baseline=1234.5)."
        ) from None
    except ValueError as err:
        raise ValueError(
            f"ThroughputCallback(baseline={str(baseline)!r}) is not a JSON file ({err}); pass "
            "the JSON file `mirrorkit bench` wrote, or the examples/s as a number"
        ) from None
    for row in data.get("results", []):
        if row.get("replicas") == 1 and row.get("workers", 1) == 1:
            return float(row["examples_per_sec_per_replica"])
    if "examples_per_sec_per_replica" in data:
        return float(data["examples_per_sec_per_replica"])
    raise ValueError(
        f"baseline file {baseline} has no single-replica result (a 'results' row with "
        "replicas 1 and workers 1, as `mirrorkit bench --replicas 1,...` writes)"
    )
