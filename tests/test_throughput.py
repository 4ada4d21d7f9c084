"""`mk.ThroughputCallback` and `ThroughputReport`."""

import json
import time

import keras
import pytest
import tensorflow as tf

import mirrorkit as mk
from mirrorkit.throughput.callback import find_straggler

GLOBAL_BATCH = 32
SLEEP_S = 0.05


def _slow_batches(steps, seconds=SLEEP_S):
    """Global batches that each take `seconds` to make: the true rate is GLOBAL_BATCH / seconds."""

    def make(ids):
        def pause(value):
            time.sleep(seconds)
            return value

        ids = tf.ensure_shape(tf.numpy_function(pause, [ids], tf.int64, stateful=True), ids.shape)
        x = tf.tile(tf.cast(ids, tf.float32)[:, None], [1, 4]) / (steps * GLOBAL_BATCH)
        return x, x[:, :1]

    batches = tf.data.Dataset.range(steps * GLOBAL_BATCH).batch(GLOBAL_BATCH, drop_remainder=True)
    return batches.map(make)


def _model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def _fit(callback, epochs=2, steps=12, replicas=2):
    strategy = mk.strategy(cpu_replicas=replicas)
    model = mk.build(_model, strategy)
    data = mk.distribute(
        _slow_batches(steps), strategy, global_batch_size=GLOBAL_BATCH, shuffle=False
    )
    return model.fit(data, epochs=epochs, verbose=0, callbacks=[callback])


def test_measured_rate_is_within_ten_percent_of_the_true_rate():
    callback = mk.ThroughputCallback(warmup_steps=2, verbose=0)
    history = _fit(callback)
    true_rate = GLOBAL_BATCH / SLEEP_S  # the input makes one global batch per SLEEP_S
    for epoch in callback.report.epochs:
        assert true_rate / 1.10 <= epoch.examples_per_sec <= true_rate * 1.001
        assert epoch.examples_per_sec_per_replica == pytest.approx(epoch.examples_per_sec / 2)
        assert SLEEP_S <= epoch.step_time_median_s <= epoch.step_time_p90_s <= epoch.step_time_max_s
    assert history.history["examples_per_sec"] == [
        e.examples_per_sec for e in callback.report.epochs
    ]
    assert len(history.history["examples_per_sec_per_replica"]) == 2
    assert callback.report.global_batch_size == GLOBAL_BATCH  # read from Keras's loss tracker


def test_outputs_parse_and_show_the_figures(tmp_path, capfd):
    json_path = tmp_path / "throughput.json"
    callback = mk.ThroughputCallback(
        warmup_steps=2,
        log_every=5,
        json_path=str(json_path),
        tensorboard_dir=str(tmp_path / "tb"),
        baseline=GLOBAL_BATCH / SLEEP_S,
    )
    _fit(callback, epochs=1)
    said = capfd.readouterr().out
    assert "step 10:" in said and "epoch 1:" in said and "scaling efficiency" in said
    saved = json.loads(json_path.read_text())
    assert saved["num_replicas"] == 2 and len(saved["epochs"]) == 1
    assert saved["epochs"][0]["scaling_efficiency"] == pytest.approx(0.5, rel=0.1)
    text = str(callback.report)
    assert "examples/s" in text and "efficiency" in text and len(text.splitlines()) == 3
    from html.parser import HTMLParser

    cells = []

    class Cells(HTMLParser):
        def handle_data(self, data):
            cells.append(data)

    Cells().feed(callback.report._repr_html_())
    assert "examples/s" in cells and "epoch" in cells
    assert list((tmp_path / "tb").iterdir())  # TensorBoard event file
    figure = callback.report.plot(str(tmp_path / "throughput.png"))
    assert (tmp_path / "throughput.png").stat().st_size > 0 and figure is not None


def test_baseline_from_a_bench_json_file(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(
        json.dumps({"results": [{"replicas": 1, "workers": 1, "examples_per_sec_per_replica": 80}]})
    )
    assert mk.ThroughputCallback(baseline=str(path)).baseline == 80
    path.write_text(json.dumps({"results": []}))
    with pytest.raises(ValueError, match="no single-replica result"):
        mk.ThroughputCallback(baseline=str(path))


def test_bad_arguments_are_errors():
    with pytest.raises(ValueError, match="log_every must be a positive integer"):
        mk.ThroughputCallback(log_every=0)
    with pytest.raises(ValueError, match="straggler_factor must be above 1"):
        mk.ThroughputCallback(straggler_factor=0.9)
    with pytest.raises(ValueError, match="baseline must be a positive"):
        mk.ThroughputCallback(baseline=-1.0)


def test_find_straggler():
    assert find_straggler([0.1, 0.1, 0.5], 1.2) == 2
    assert find_straggler([0.1, 0.115], 1.2) is None
    assert find_straggler([0.2, 0.1], 1.5) == 0


def test_tensorboard_dir_without_tensorboard_is_a_clear_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(ImportError, match="pip install tensorboard"):
        mk.ThroughputCallback(tensorboard_dir="logs")


def _fit_with_one_slow_worker(slow_worker):
    import time

    import keras
    import numpy as np
    import tensorflow as tf

    import mirrorkit as mk
    from mirrorkit import cluster

    # Before mk.strategy(), read the rank from TF_CONFIG: TensorFlow must not start yet.
    delay = 0.06 if cluster.from_environment().task_index == slow_worker else 0.0

    class SlowOnOneWorker(keras.layers.Layer):
        def call(self, x):
            def pause(value):
                time.sleep(delay)
                return value

            return tf.ensure_shape(tf.numpy_function(pause, [x], x.dtype, stateful=True), x.shape)

    strategy = mk.strategy()

    def make():
        model = keras.Sequential([keras.Input((4,)), SlowOnOneWorker(), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    model = mk.build(make, strategy)
    x = np.ones((16 * 20, 4), "float32")
    callback = mk.ThroughputCallback(warmup_steps=3, verbose=1)
    data = mk.distribute((x, x[:, :1]), strategy, global_batch_size=16, shuffle=False)
    model.fit(data, epochs=1, verbose=0, callbacks=[callback])
    return callback.report.to_dict()


@pytest.mark.slow
@pytest.mark.parametrize("slow_worker", [1, None])
def test_straggler_is_flagged_only_when_one_worker_is_slow(slow_worker):
    from _multiworker import run_workers

    reports = run_workers(_fit_with_one_slow_worker, slow_worker, n=2)
    for report in reports:  # every worker reaches the same verdict
        (epoch,) = report["epochs"]
        assert len(epoch["worker_compute_median_s"]) == 2
        assert epoch["straggler"] == slow_worker
    if slow_worker is None:
        # A Dense(1) step computes for well under a millisecond; all-reduce and host work dominate.
        assert all(report["epochs"][0]["compute_share"] < 0.5 for report in reports)
    if slow_worker is not None:
        medians = reports[0]["epochs"][0]["worker_compute_median_s"]
        assert medians[1] >= 0.06 > medians[0]
        assert reports[0]["epochs"][0]["slowest_worker"] == 1
        # The 60 ms of work dominate every step; worker 0 spends them waiting.
        for report in reports:
            share = report["epochs"][0]["compute_share"]
            assert 0.7 < share <= 1.05
