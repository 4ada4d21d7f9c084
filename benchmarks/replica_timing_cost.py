"""What `ThroughputCallback`'s per-replica timing costs: the steady step time with it on and off.

A 3-layer MLP (about 250k weights, Adam, global batch 256) on 2 CPU replicas, in one process,
through `mk.distribute`, trained one epoch of ``--steps`` steps at a time with a
`ThroughputCallback(replica_timing=True)` or ``replica_timing=False``, in the order off, on,
on, off (so that neither arm is always second), ``--rounds`` times. Each epoch's figure is the
callback's own median step time, which leaves out its warm-up steps (the first step of every
``fit`` traces again: the timing is put into, or taken out of, the compiled step). The cost is
the median over rounds of on / off - 1, each round's figure the mean of its two epochs of each.
With the timing on, it also prints how much of the step the measured shares (compute,
all-reduce, update, replica wait, input wait, host) account for: each is a median over the
epoch's steps, so their sum is near 1, not 1 by construction (what they leave is the dispatch
share; a sum over 1 leaves none).

Run it as ``python benchmarks/replica_timing_cost.py``; the Benchmarks page has its
figure (docs: benchmarks/#replica-timing-cost).

Example:
```python
import subprocess, sys
subprocess.run([sys.executable, "benchmarks/replica_timing_cost.py", "--steps", "30",
                "--rounds", "2"], check=True)
```
"""

from __future__ import annotations

import argparse
import os
import statistics


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="steps an epoch (default 200)")
    parser.add_argument("--rounds", type=int, default=12, help="epochs of each arm (default 12)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np

    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=2)

    def make():
        model = keras.Sequential(
            [keras.Input((256,))]
            + [keras.layers.Dense(384, activation="relu") for _ in range(2)]
            + [keras.layers.Dense(10)]
        )
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(True))
        return model

    rng = np.random.default_rng(0)
    x = rng.normal(size=(256 * args.steps, 256)).astype("float32")
    y = rng.integers(0, 10, size=(256 * args.steps,))
    model = mk.build(make, strategy)
    data = mk.distribute((x, y), strategy, global_batch_size=256, seed=0)
    medians: dict[str, list[float]] = {"off": [], "on": []}
    share_sums: list[float] = []
    for round_ in range(args.rounds + 1):
        seen: dict[str, list[float]] = {"off": [], "on": []}
        for name in ("off", "on", "on", "off"):
            callback = mk.ThroughputCallback(verbose=0, replica_timing=name == "on")
            model.fit(data, epochs=1, verbose=0, callbacks=[callback])
            (epoch,) = callback.report.epochs
            assert bool(epoch.replica_compute_median_s) == (name == "on")
            seen[name].append(epoch.step_time_median_s)
            if name == "on" and round_ > 0:
                share_sums.append(measured_share_sum(epoch))
        if round_ > 0:  # round 0 warms both up
            for name, times in seen.items():
                medians[name].append(statistics.mean(times))
    ratios = [on / off for on, off in zip(medians["on"], medians["off"], strict=True)]
    cost = statistics.median(ratios) - 1
    off, on = statistics.median(medians["off"]), statistics.median(medians["on"])
    print(
        f"median step: timing off {off * 1000:.3f} ms, on {on * 1000:.3f} ms; median of the "
        f"{args.rounds} rounds' on/off: {cost * 100:+.2f}%"
    )
    share_sum = statistics.median(share_sums)
    print(
        f"measured shares sum to {share_sum:.3f} of the step (median of {len(share_sums)} "
        f"epochs; range {min(share_sums):.3f}-{max(share_sums):.3f})"
    )
    return {"off_s": off, "on_s": on, "cost": cost, "share_sum": share_sum}


def measured_share_sum(epoch) -> float:
    """The sum of an epoch's measured shares (the dispatch share is what they leave).

    Args:
        epoch: an `EpochThroughput` with the per-replica timing on.
    """
    shares = (
        epoch.compute_share,
        epoch.communication_share,
        epoch.update_share,
        epoch.replica_wait_share,
        epoch.input_wait_share,
        epoch.host_share,
    )
    return sum(share or 0.0 for share in shares)


if __name__ == "__main__":
    main()
