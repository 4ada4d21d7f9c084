"""Median time of a repeated ``evaluate`` and ``predict`` call, one iterator kept or one a call.

The validation set of ``epoch_time.py`` (1,024 examples of its MLP, global batch 128: 8 steps)
through ``mk.distribute(..., for_eval=True)`` on 2 CPU replicas, ``evaluate`` then ``predict``
called ``--calls`` times each, with the ``one_iterator`` repairs on (one iterator kept across
the calls) and off (Keras makes one every call, as mirrorkit did before), each in a fresh
process, alternated ``--rounds`` times. The median leaves out each method's first call (which
traces the step).

Run it as ``python benchmarks/evaluate_time.py``; the Benchmarks page has its table
(docs: benchmarks/).

Example:
```python
import subprocess, sys
subprocess.run([sys.executable, "benchmarks/evaluate_time.py", "--calls", "3", "--rounds", "1"])
```
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from epoch_time import BATCH, _data, _model  # noqa: E402  (the same model and data)

WAYS = {"one iterator kept": "kept", "an iterator per call": "per_call"}


def run_way(way: str, calls: int) -> dict[str, list[float]]:
    """In a fresh process: the seconds of each evaluate and predict call."""
    import time

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=2)
    if way == "per_call":
        from mirrorkit.feeding import one_iterator

        for repair in reversed(one_iterator.REPAIRS):
            repair.remove()
    model = mk.build(_model, strategy)
    _, (xv, yv) = _data()
    data = mk.distribute((xv, yv), strategy, global_batch_size=BATCH, for_eval=True)
    times: dict[str, list[float]] = {"evaluate": [], "predict": []}
    for method in times:
        for _ in range(calls):
            start = time.perf_counter()
            getattr(model, method)(data, verbose=0)
            times[method].append(time.perf_counter() - start)
    return times


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=10, help="calls of each (default 10)")
    parser.add_argument("--rounds", type=int, default=2, help="alternations (default 2)")
    parser.add_argument("--way", choices=sorted(WAYS.values()), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.way:  # one way, in this fresh process
        print(json.dumps(run_way(args.way, args.calls)))
        return {}
    runs: dict[str, dict[str, list[float]]] = {name: {} for name in WAYS}
    for _ in range(args.rounds):
        for name, way in WAYS.items():
            done = subprocess.run(
                [sys.executable, __file__, "--way", way, "--calls", str(args.calls)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            for method, times in json.loads(done.stdout.splitlines()[-1]).items():
                runs[name].setdefault(method, []).extend(times[1:])  # the first call traces
    medians = {
        name: {method: statistics.median(times) for method, times in per.items()}
        for name, per in runs.items()
    }
    print(f"{'':24} {'evaluate':>10} {'predict':>10}   (median seconds a call)")
    for name, per in medians.items():
        print(f"{name:24} {per['evaluate']:10.4f} {per['predict']:10.4f}")
    kept, per_call = medians["one iterator kept"], medians["an iterator per call"]
    print(
        f"kept / per call: evaluate {kept['evaluate'] / per_call['evaluate']:.2f}x, "
        f"predict {kept['predict'] / per_call['predict']:.2f}x"
    )
    return medians


if __name__ == "__main__":
    main()
