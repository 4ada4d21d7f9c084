"""Per-replica throughput on one host: each replica's compute, its all-reduce, a slow replica
named, and where a step's time goes (`ThroughputCallback` with `StepClock` on 2 CPU replicas).
"""

import time

import keras
import numpy as np
import pytest
import tensorflow as tf
from _quoted import assert_quoted_in, quoted_block

import mirrorkit as mk
from mirrorkit.throughput import bottleneck
from mirrorkit.throughput.report import summary_line

SLOW_S, WORK_S = 0.04, 0.004


class ReplicaWork(keras.layers.Layer):
    """Sleeps WORK_S a step, and SLOW_S on replica `slow` (None: no replica is slow)."""

    def __init__(self, slow=None, **kwargs):
        super().__init__(**kwargs)
        self.slow = slow

    def compute_output_shape(self, shape):
        return shape

    def call(self, x):
        context = tf.distribute.get_replica_context()
        replica = context.replica_id_in_sync_group if context is not None else 0

        def pause(value, replica):
            time.sleep(SLOW_S if int(replica) == self.slow else WORK_S)
            return value

        out = tf.numpy_function(pause, [x, replica], x.dtype, stateful=True)
        return tf.ensure_shape(out, x.shape)


def fit_report(make_layers, features, batch, steps=16, epochs=2, replicas=2, **callback_args):
    strategy = mk.strategy(cpu_replicas=replicas)

    def make():
        model = keras.Sequential([keras.Input((features,)), *make_layers()])
        model.compile(optimizer="sgd", loss="mse")
        return model

    model = mk.build(make, strategy)
    x = np.random.default_rng(0).random((batch * steps, features)).astype("float32")
    data = mk.distribute((x, x[:, :1]), strategy, global_batch_size=batch, shuffle=False)
    callback = mk.ThroughputCallback(warmup_steps=3, verbose=0, **callback_args)
    model.fit(data, epochs=epochs, verbose=0, callbacks=[callback])
    return callback.report


@pytest.mark.parametrize("slow", [1, pytest.param(None, marks=pytest.mark.slow)])
def test_a_replica_that_works_longer_is_named_with_its_ratio(slow):
    report = fit_report(lambda: [ReplicaWork(slow), keras.layers.Dense(1)], 4, 16)
    for epoch in report.epochs:
        compute = epoch.replica_compute_median_s
        assert len(compute) == 2 and min(compute) >= WORK_S
        assert epoch.slow_replica == slow, epoch
        assert len(epoch.replica_all_reduce_median_s) == len(epoch.replica_examples_per_sec) == 2
    text = str(report)
    if slow is None:
        assert "slow replica" not in text
        return
    last = report.epochs[-1]
    assert compute[slow] >= SLOW_S > compute[1 - slow]
    assert last.slowest_replica == slow and last.replica_spread > 3
    # the fast replica waits for the slow one in the all-reduce; the slow one does not wait
    assert last.replica_all_reduce_median_s[1 - slow] > 0.8 * (SLOW_S - WORK_S)
    assert last.replica_all_reduce_median_s[slow] < SLOW_S / 4
    assert last.replica_examples_per_sec[1 - slow] > 3 * last.replica_examples_per_sec[slow]
    ratio = compute[slow] / compute[1 - slow]
    assert f"slow replica: replica {slow} works {compute[slow] * 1000:.1f} ms" in text
    assert f"({ratio:.2f}x)" in text
    quote = quoted_block("throughput.md", "A replica that works longer than the others is named")
    assert_quoted_in(quote, text, figures_vary=True)
    line = summary_line(last, report)
    assert f"SLOW REPLICA: replica {slow} works" in line and "slowest replica 1" in line


def _dense(width, depth):
    return lambda: [keras.layers.Dense(width) for _ in range(depth)] + [keras.layers.Dense(1)]


def _shares(epoch):
    return {
        "compute": epoch.compute_share,
        "all-reduce": epoch.communication_share,
        "update": epoch.update_share,
        "wait": epoch.replica_wait_share,
        "input": epoch.input_wait_share,
        "host": epoch.host_share,
    }


@pytest.mark.slow  # the quick set keeps the slow-replica test
def test_many_weights_and_little_compute_are_communication_bound_on_one_host():
    """28M weights, 8 examples a step: the all-reduce of 113 MB is a third of each step or more
    (about 60 ms, so that the strategy's own dispatch, about 2 ms, is a small part of it). On
    CPU replicas the forward and backward pass of so few examples reads the same 113 MB of
    weights as the all-reduce moves, so computing takes about as long: the all-reduce share,
    not its rank among the shares, makes the verdict."""
    report = fit_report(_dense(3072, 3), 64, 8)
    epoch = report.epochs[-1]
    assert epoch.verdict.startswith("communication-bound: compute share "), epoch.verdict
    assert epoch.communication_share >= bottleneck.ALL_REDUCE_BOUND_SHARE, _shares(epoch)


@pytest.mark.slow
def test_few_weights_and_much_compute_are_compute_bound_on_one_host():
    """537k weights on 8,192 examples a step (about 75 ms): computing dominates."""
    report = fit_report(_dense(512, 3), 16, 8192, steps=8)
    epoch = report.epochs[-1]
    assert epoch.verdict.startswith("compute-bound: compute share "), epoch.verdict
    assert epoch.compute_share > max(epoch.communication_share, epoch.update_share), _shares(epoch)


def test_each_replica_has_its_scalars_in_tensorboard_its_fields_in_json_and_a_plot(tmp_path):
    report = fit_report(
        lambda: [ReplicaWork(1), keras.layers.Dense(1)], 4, 16, epochs=1,
        tensorboard_dir=str(tmp_path / "tb"), json_path=str(tmp_path / "report.json"),
    )  # fmt: skip
    tags = set()
    for path in (tmp_path / "tb").iterdir():
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            tags.update(value.tag for value in event.summary.value)
    for replica in (0, 1):
        for name in ("compute_s", "all_reduce_s", "examples_per_sec"):
            assert f"throughput/replica_{replica}/{name}" in tags, sorted(tags)
    assert {"throughput/compute_share", "throughput/communication_share"} <= tags
    import json

    (epoch,) = json.loads((tmp_path / "report.json").read_text())["epochs"]
    assert epoch["slow_replica"] == 1 and len(epoch["replica_compute_median_s"]) == 2
    figure = report.plot(str(tmp_path / "throughput.png"))
    assert len(figure.axes) == 3 and figure.axes[2].get_title() == "Per replica, epoch 1"


def test_the_verdict_weighs_the_measured_shares():
    from mirrorkit.throughput.bottleneck import verdict

    assert verdict(0.05, 0.2, communication_share=0.5).startswith(
        "communication-bound: compute share 0.20, all-reduce share 0.50; try "
    )
    assert verdict(0.05, 0.04, communication_share=0.14, dispatch_share=0.62).startswith(
        "dispatch-bound: 62% of each step is the strategy's own work"
    )
    calm = verdict(0.05, 0.6, communication_share=0.1, dispatch_share=0.25)
    assert calm.startswith("compute-bound: compute share 0.60, all-reduce share 0.10, dispatch ")
    # without the all-reduce timed (replica_timing=False on workers): the compute share alone
    assert verdict(0.05, 0.5).startswith("communication-bound: compute share 0.50; try ")
