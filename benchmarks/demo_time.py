"""`mirrorkit demo`'s training time with one iterator per fit and with an iterator per epoch.

Runs the demo's training (`mirrorkit.demo.train.train` with its defaults: 2 CPU
replicas, 12 epochs of the bundled digits) in a fresh process per run, the
``one_iterator`` repair on ("after") and taken off ("before": Keras makes a new
distributed iterator every epoch), alternated ``--rounds`` times so that a slow
minute of a shared machine falls on both. It prints each run's ``fit`` time
(the wall time until the throughput verdict), test accuracy and the median of
each side; the Benchmarks page has its figures (docs: benchmarks/#one-iterator-per-fit).

Run it as ``python benchmarks/demo_time.py --rounds 3``.

Example:
```python
import subprocess, sys
subprocess.run([sys.executable, "benchmarks/demo_time.py", "--rounds", "1"], check=True)
```
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

SIDES = ("before", "after")


def _one_run(side: str) -> dict:
    """In this (fresh) process: the demo's training, the repair off for ``before``."""
    import mirrorkit.compat as compat
    from mirrorkit.demo import train as train_lib
    from mirrorkit.feeding import one_iterator

    if side == "before":
        enable = compat.enable

        def enable_without_one_iterator(strategy=None):
            names = enable(strategy)
            for repair in reversed(one_iterator.REPAIRS):
                repair.remove()
            return names

        compat.enable = enable_without_one_iterator  # mk.strategy calls compat.enable
    result = train_lib.train(train_lib.DemoConfig())
    on = [repair.active for repair in one_iterator.REPAIRS]
    if on != [side == "after"] * len(on):
        raise RuntimeError(f"{side}: the one_iterator repairs are {on}")
    return {"fit_s": result["train_seconds"], "accuracy": result["test_accuracy"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="before/after pairs (default 3)")
    parser.add_argument("--run", choices=SIDES, help=argparse.SUPPRESS)  # one run, internal
    args = parser.parse_args(argv)
    if args.run:
        print("RESULT " + json.dumps(_one_run(args.run)), flush=True)
        return
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    for _ in range(args.rounds):
        for side in SIDES:
            done = subprocess.run(
                [sys.executable, __file__, "--run", side], capture_output=True, text=True
            )
            lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            if done.returncode != 0 or not lines:
                sys.exit(f"the {side} run failed:\n{done.stderr[-3000:]}")
            run = json.loads(lines[-1].split(" ", 1)[1])
            runs[side].append(run)
            print(f"{side:6} fit {run['fit_s']:6.2f} s, test accuracy {run['accuracy']:.4f}")
    medians = {side: statistics.median(r["fit_s"] for r in runs[side]) for side in SIDES}
    print(
        f"median fit: before (an iterator per epoch) {medians['before']:.2f} s, after (one "
        f"iterator per fit) {medians['after']:.2f} s: "
        f"{1 - medians['after'] / medians['before']:.0%} less"
    )


if __name__ == "__main__":
    main()
