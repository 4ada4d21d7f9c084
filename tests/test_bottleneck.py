"""The bottleneck verdict in `ThroughputCallback`'s report: input wait measured in get_next."""

from __future__ import annotations

import os
import re
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
from _quoted import assert_quoted_in, quoted_block
from tensorflow.python.distribute import input_lib

import mirrorkit as mk
from mirrorkit.throughput.bottleneck import verdict


def test_verdict_lines():
    assert verdict(0.38, None) == (
        "input-bound: 38% of each step waits for data; add prefetch / parallel map / cache"
    )
    assert verdict(0.05, 0.62) == (
        "communication-bound: compute share 0.62; try gradient_compression='fp16' or a larger "
        "per-replica batch"
    )
    assert verdict(0.05, 0.9).startswith("compute-bound: compute share 0.90")
    assert verdict(0.05, None) == "not input-bound: 5% of each step waits for data"
    assert verdict(None, None) is None
    assert verdict(0.59, 0.01, 1) == (  # multi-worker: the worker with the largest own wait
        "input-bound: 59% of each step waits for data on worker 1; "
        "add prefetch / parallel map / cache"
    )


def _verdict_kinds() -> set[str]:
    """Every kind of verdict `verdict` can return: the words before the colon of its lines.

    Read from the function's source, so a new ``return f"new-kind: ..."`` is found without
    a case here; the report's own ``straggler:`` line is one more.
    """
    import inspect
    import re

    source = inspect.getsource(verdict)
    kinds = set(re.findall(r'(?:^|[\s(])f?"([a-z][a-z -]*[a-z]): ', source, re.M))
    return kinds | {"straggler"}


def _documented_fixes(page: str) -> dict[str, str]:
    """The verdict table of docs/throughput.md: {verdict: its "Fix to try" cell}."""
    rows = [line.strip() for line in page.splitlines() if line.strip().startswith("|")]
    cells = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]
    fixes = {}
    for i, header in enumerate(cells):
        if header[:1] != ["Verdict"] or "Fix to try" not in header:
            continue
        fix = header.index("Fix to try")
        for row in cells[i + 2 :]:  # after the header and its --- line
            if len(row) != len(header):
                break
            fixes[row[0].strip("`")] = row[fix]
    return fixes


def test_every_verdict_the_code_gives_has_a_row_with_a_fix_on_the_throughput_page():
    from mirrorkit.throughput import report

    kinds = _verdict_kinds()
    # The source reading finds what the function returns, and the report's list of verdicts
    # that name a fix is among them.
    reached = {
        verdict(wait, compute, host_share=host, epoch_overhead_share=overhead).split(":")[0]
        for wait in (None, 0.05, 0.5)
        for compute in (None, 0.5, 0.9)
        for host in (None, 0.5)
        for overhead in (None, 0.5)
        if verdict(wait, compute, host_share=host, epoch_overhead_share=overhead)
    }
    assert reached | {"straggler"} <= kinds, (reached, kinds)
    assert set(report._ACTIONABLE) <= kinds, report._ACTIONABLE
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "docs", "throughput.md")) as f:
        fixes = _documented_fixes(f.read())
    missing = sorted(kind for kind in kinds if not fixes.get(kind, "").strip(" -"))
    assert not missing, (
        f"verdicts without a row and a fix in docs/throughput.md's verdict table: {missing}"
    )


def test_a_missing_per_worker_iterator_method_is_named_and_wraps_nothing(monkeypatch):
    from mirrorkit import internals
    from mirrorkit.throughput.input_clock import InputClock

    before = input_lib.DistributedIterator.get_next
    monkeypatch.delattr(input_lib._SingleWorkerDatasetIteratorBase, "get_next_as_optional_list")
    clock = InputClock(capacity=4)
    with pytest.raises(
        internals.InternalChangedError,
        match="_SingleWorkerDatasetIteratorBase.get_next_as_optional_list",
    ):
        clock.install()
    assert not clock.installed and input_lib.DistributedIterator.get_next is before


#: Width of the hidden layers: a step long enough that get_next's own Python work on a
#: prefetched pipeline stays a small share of it on a busy machine (3-4 % idle, 5-6 % beside
#: three busy loops; with 256 it was 8-12 % idle and 28-29 % there, over the 20 % threshold).
HIDDEN = 1024
#: Seconds the planted slow map sleeps a batch: an input wait share of 0.29 beside three busy
#: loops at 0.03 s with that step, too near the threshold; 0.1 s leaves a wide margin.
SLOW_MAP_BATCH_S = 0.1


def _make_model():
    model = keras.Sequential(
        [
            keras.Input((32,)),
            keras.layers.Dense(HIDDEN, activation="relu"),
            keras.layers.Dense(HIDDEN, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer="sgd", loss="mse")
    return model


def _data(slow_s: float):
    rng = np.random.default_rng(0)
    x = rng.random((30 * 128, 32)).astype("float32")
    y = rng.random((30 * 128, 1)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(128)
    if slow_s:

        def sleep(batch):
            time.sleep(slow_s)
            return batch

        def slow(a, b):  # a slow map, one batch at a time: the planted input bottleneck
            return tf.ensure_shape(tf.py_function(sleep, [a], tf.float32), [None, 32]), b

        return data.map(slow)
    return data.prefetch(tf.data.AUTOTUNE)  # the pipeline the verdict recommends


def _fit(slow_s: float):
    """In a fresh process (2 CPU replicas): fit one epoch; the report and what was printed."""
    import contextlib
    import io
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=2)
    model = mk.build(_make_model, strategy)
    throughput = mk.ThroughputCallback(warmup_steps=3)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        model.fit(
            _data(slow_s),
            epochs=1,
            verbose=0,
            callbacks=[throughput],
            validation_data=_data(0).take(2),
        )
    restored = not hasattr(input_lib.DistributedIterator.get_next, "__wrapped__")
    return throughput.report, printed.getvalue(), restored


@pytest.mark.multiprocess
def test_a_slow_map_is_input_bound(fresh):
    report, printed, restored = fresh(_fit, SLOW_MAP_BATCH_S)
    epoch = report.epochs[0]
    assert epoch.input_wait_share > 0.2, str(report)
    assert epoch.verdict.startswith("input-bound: ") and "add prefetch" in epoch.verdict
    assert epoch.verdict in printed and f"epoch 1: {epoch.verdict}" in str(report)
    assert restored  # get_next is TensorFlow's own again after fit
    quote = quoted_block("throughput.md", "that sleeps 0.1 ms per example")
    assert_quoted_in(quote, printed, figures_vary=True)  # the page's run: its model, 2 epochs


@pytest.mark.multiprocess
def test_nothing_planted_is_not_input_bound(fresh):
    report, _, restored = fresh(_fit, 0)
    epoch = report.epochs[0]
    assert epoch.input_wait_share < 0.2, str(report)
    # On 2 replicas the step clock times compute and the all-reduce too: the verdict says which.
    assert epoch.verdict.startswith(("compute-bound: ", "communication-bound: ")), str(report)
    assert epoch.compute_share is not None and epoch.communication_share is not None
    assert restored


@pytest.mark.parametrize("steps_per_execution", [2])
def test_no_input_share_when_steps_are_grouped(steps_per_execution):
    model = mk.build(_make_model, mk.strategy(cpu_replicas=2))
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=steps_per_execution)
    throughput = mk.ThroughputCallback(warmup_steps=2, verbose=0)
    model.fit(_data(0).take(12), epochs=1, verbose=0, callbacks=[throughput])
    assert throughput.report.epochs[0].input_wait_share is None


def _communication_heavy_worker():
    import keras
    import numpy as np
    import tensorflow as tf

    import mirrorkit as mk

    strategy = mk.strategy()
    assert strategy.num_replicas_in_sync == 2

    def make():  # 2.2M weights, 8 examples a step: the all-reduce dominates
        model = keras.Sequential(
            [keras.Input((64,))]
            + [keras.layers.Dense(1024) for _ in range(3)]
            + [keras.layers.Dense(1)]
        )
        model.compile(optimizer="sgd", loss="mse")
        return model

    model = mk.build(make, strategy)
    x = np.random.rand(8 * 20, 64).astype("float32")
    y = np.random.rand(8 * 20, 1).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8).prefetch(tf.data.AUTOTUNE)
    throughput = mk.ThroughputCallback(warmup_steps=3)  # the chief prints the epoch's line
    model.fit(data, epochs=1, verbose=0, callbacks=[throughput])
    return throughput.report.epochs[0]


@pytest.mark.multiprocess
def test_two_workers_with_a_large_all_reduce_are_communication_bound(capfd):
    from _multiworker import run_workers

    for epoch in run_workers(_communication_heavy_worker, n=2):
        assert epoch.compute_share is not None and epoch.compute_share < 0.7, epoch
        assert epoch.verdict.startswith("communication-bound: compute share "), epoch.verdict
        assert "gradient_compression='fp16'" in epoch.verdict
    quote = quoted_block("throughput.md", "small steps, so the all-reduce dominates")
    assert_quoted_in(quote, capfd.readouterr().out, figures_vary=True)


def test_calm_epochs_are_one_line_and_bound_ones_each_get_theirs():
    from mirrorkit.throughput.bottleneck import verdict
    from mirrorkit.throughput.report import EpochThroughput, ThroughputReport

    def epoch(n, wait):
        return EpochThroughput(
            epoch=n,
            steps=10,
            examples_per_sec=100.0,
            examples_per_sec_per_replica=50.0,
            examples_per_sec_per_worker=100.0,
            step_time_median_s=0.1,
            step_time_p90_s=0.1,
            step_time_max_s=0.1,
            epoch_time_s=1.0,
            input_wait_share=wait,
            verdict=verdict(wait, None),
        )

    report = ThroughputReport(
        num_replicas=2,
        num_workers=1,
        global_batch_size=32,
        epochs=[epoch(1, 0.03), epoch(2, 0.4), epoch(3, 0.02), epoch(4, 0.04)],
    )
    verdicts = [line for line in str(report).splitlines() if re.match(r"epochs? \d", line)]
    assert verdicts == [
        "epoch 2: input-bound: 40% of each step waits for data; "
        "add prefetch / parallel map / cache",
        "epochs 1-4 (3 epochs): no bottleneck to fix; epoch 4: not input-bound: 4% of each step "
        "waits for data",
    ], str(report)


#: The planted faults of the 2-worker jobs: seconds of a slow map per batch (on every worker),
#: and seconds worker 1 sleeps after each step (a slow peer, outside its compiled step).
SLOW_MAP_S, SLOW_PEER_S = 0.06, 0.05
#: Steps per epoch of those jobs (16 * STEPS examples, global batch 16).
STEPS = 24


def _two_worker_fit(plant):
    """One worker of a 2-worker job of 2 epochs; its (input wait share, verdict, report) per epoch.

    Epoch 1 has nothing planted. In epoch 2, ``plant="map"``: every worker's map sleeps
    `SLOW_MAP_S` a batch; ``plant="peer"``: worker 1 sleeps `SLOW_PEER_S` after each step
    in a callback.
    """
    import time

    import keras
    import numpy as np
    import tensorflow as tf

    import mirrorkit as mk
    from mirrorkit.cluster import cluster_info

    rank = cluster_info.from_environment().worker_index  # before TensorFlow starts
    strategy = mk.strategy()

    def make():
        model = keras.Sequential(
            [keras.Input((8,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)]
        )
        model.compile(optimizer="sgd", loss="mse")
        return model

    model = mk.build(make, strategy)
    rng = np.random.default_rng(0)
    x = rng.random((16 * STEPS, 8)).astype("float32")
    y = rng.random((16 * STEPS, 1)).astype("float32")
    slow_now = tf.Variable(False)  # set for epoch 2 (a few batches made before stay fast)

    def sleep(batch):
        time.sleep(SLOW_MAP_S)
        return batch

    def slow(a, b):  # no Python in the pipeline in epoch 1 (a py_function holds the GIL)
        if plant == "map":
            a = tf.cond(slow_now, lambda: tf.py_function(sleep, [a], tf.float32), lambda: a)
        return tf.ensure_shape(a, [None, 8]), b

    def per_worker(context):  # a finite dataset: get_next agrees with the peer on a next batch
        data = tf.data.Dataset.from_tensor_slices((x, y))
        data = data.shard(context.num_input_pipelines, context.input_pipeline_id)
        data = data.batch(context.get_per_replica_batch_size(16), drop_remainder=True)
        return data.map(slow)

    class SlowMap(keras.callbacks.Callback):  # no batch hook: no per-step stop agreement
        def on_epoch_begin(self, epoch, logs=None):
            slow_now.assign(epoch == 1)

    class SlowPeer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.slow = rank == 1 and epoch == 1

        def on_train_batch_end(self, batch, logs=None):
            if self.slow:
                time.sleep(SLOW_PEER_S)

    throughput = mk.ThroughputCallback(warmup_steps=3, verbose=0)
    model.fit(
        mk.distribute(per_worker, strategy, global_batch_size=16),
        epochs=2,
        verbose=0,
        callbacks=[SlowPeer() if plant == "peer" else SlowMap(), throughput],
    )
    report = throughput.report
    return [(e.input_wait_share, e.verdict, str(report)) for e in report.epochs]


@pytest.mark.multiprocess
def test_two_workers_nothing_planted_then_a_slow_map():
    from _multiworker import run_workers

    for rank, epochs in enumerate(run_workers(_two_worker_fit, "map", n=2)):
        (share, said, report), (slow_share, slow_said, _) = epochs
        # Each worker waits for its own batch only, not in the agreement with its peer.
        assert share < 0.2 and not said.startswith("input-bound"), (rank, report)
        assert slow_share > 0.2 and slow_said.startswith("input-bound: "), (rank, report)


@pytest.mark.multiprocess
def test_two_workers_a_slow_peer_is_host_work_not_input():
    from _multiworker import run_workers

    for rank, epochs in enumerate(run_workers(_two_worker_fit, "peer", n=2)):
        for epoch, (share, said, report) in enumerate(epochs, 1):
            assert share < 0.2 and not said.startswith("input-bound"), (rank, epoch, report)
        # Worker 1's sleep is outside its compiled step; worker 0 waits for it outside too
        # (in the per-step stop agreement a batch-hook callback turns on).
        assert epochs[1][1].startswith("host-bound: "), (rank, report)
