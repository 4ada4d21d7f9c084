"""mk.callbacks.NaNGuard and ReplicaSyncCheck: on 2 in-process replicas and on 2 real workers.

The NaN is planted in the input data of one replica (or one worker) at one step,
so only that replica's loss and gradients are non-finite before the all-reduce.
"""

from __future__ import annotations

import numpy as np
import pytest
from _quoted import assert_quoted_in, quoted_block

import mirrorkit as mk

BAD_STEP = 7
PER_REPLICA = 4


def _data(workers, replicas_per_worker, bad_worker, bad_replica, steps=12):
    """Per-worker arrays; worker `bad_worker`'s step BAD_STEP has NaN on local `bad_replica`."""
    rng = np.random.default_rng(0)
    per_worker = PER_REPLICA * replicas_per_worker
    out = []
    for w in range(workers):
        x = rng.normal(size=(steps * per_worker, 3)).astype("float32")
        y = rng.normal(size=(steps * per_worker, 1)).astype("float32")
        if w == bad_worker:
            start = BAD_STEP * per_worker + bad_replica * PER_REPLICA
            x[start : start + PER_REPLICA] = np.nan
        out.append((x, y))
    return out


def _model():
    import keras
    from _models import tiny_model

    keras.utils.set_random_seed(0)
    return tiny_model(optimizer=keras.optimizers.SGD(0.01))


def _fit_until_nan(strategy, arrays, checkpoint):
    """Fits with a ModelCheckpoint(save_freq=1) listed BEFORE the guard; returns what happened."""
    import keras
    import tensorflow as tf

    model = mk.build(_model, strategy)

    def dataset_fn(context):  # per-replica batches, taken by the worker's replicas in turn
        x, y = arrays[context.input_pipeline_id]
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(PER_REPLICA)

    data = strategy.distribute_datasets_from_function(dataset_fn)
    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append((batch, [w.copy() for w in self.model.get_weights()]))

    saver = keras.callbacks.ModelCheckpoint(checkpoint, save_weights_only=True, save_freq=1)
    try:
        model.fit(data, epochs=1, verbose=0, callbacks=[saver, Record(), mk.callbacks.NaNGuard()])
    except mk.callbacks.NonFiniteError as err:
        error = {
            "message": str(err),
            "step": err.step,
            "workers": err.workers,
            "replicas": err.replicas,
        }
    else:
        error = None
    return error, seen


def test_nan_on_one_replica_stops_at_that_step_and_keeps_checkpoint(tmp_path):
    strategy = mk.strategy(cpu_replicas=2)
    checkpoint = str(tmp_path / "last.weights.h5")
    arrays = _data(1, 2, bad_worker=0, bad_replica=1)
    error, seen = _fit_until_nan(strategy, arrays, checkpoint)
    assert error is not None, "NaNGuard did not stop training"
    assert error["step"] == BAD_STEP
    assert error["replicas"] == [1] and error["workers"] == [0]
    assert f"at step {BAD_STEP}" in error["message"]
    assert "worker 0 replica 1" in error["message"]
    assert [batch for batch, _ in seen] == list(range(BAD_STEP))  # no callback saw step 7
    model = _model()
    model.load_weights(checkpoint)
    for got, want in zip(model.get_weights(), seen[-1][1], strict=True):
        assert np.isfinite(got).all()
        np.testing.assert_array_equal(got, want)  # the file is the state after step 6


def test_clean_run_trains_like_without_guard(capfd):
    import tensorflow as tf

    strategy = mk.strategy(cpu_replicas=2)
    x, y = _data(1, 2, bad_worker=-1, bad_replica=0)[0]
    results = []
    for callbacks in (
        [],
        [mk.callbacks.NaNGuard(), mk.callbacks.ReplicaSyncCheck(every_n_steps=3)],
    ):
        model = mk.build(_model, strategy)
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(2 * PER_REPLICA)
        model.fit(data, epochs=1, verbose=0, callbacks=callbacks)
        results.append(model.get_weights())
    for got, want in zip(results[1], results[0], strict=True):
        np.testing.assert_array_equal(got, want)
    assert len(callbacks[1].costs_s) == 4  # 12 steps / 3
    assert all(cost > 0 for cost in callbacks[1].costs_s)
    said = capfd.readouterr().err
    assert_quoted_in(quoted_block("guards.md", "the chief prints the number of checks"), said)


def _named_model():
    """`_model`, its names fixed as in a fresh session (the error the guards page quotes)."""
    import keras

    keras.utils.set_random_seed(0)
    dense = keras.layers.Dense(1, name="dense")
    model = keras.Sequential([keras.Input((3,)), dense], name="sequential")
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model


def test_replica_sync_check_names_the_perturbed_variable():
    import tensorflow as tf

    strategy = mk.strategy(cpu_replicas=2)
    x, y = _data(1, 2, bad_worker=-1, bad_replica=0)[0]
    model = mk.build(_named_model, strategy)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(2 * PER_REPLICA)
    model.fit(data, epochs=1, verbose=0)
    bias = model.layers[0].bias
    copy = bias.value.values[1]  # replica 1's copy of the MirroredVariable
    copy.assign(copy + 0.25)
    check = mk.callbacks.ReplicaSyncCheck(every_n_steps=2)
    with pytest.raises(mk.callbacks.ReplicasDivergedError) as caught:
        model.fit(data, epochs=1, verbose=0, callbacks=[check])
    assert caught.value.variable == bias.path
    assert caught.value.replica == 1
    assert caught.value.difference == pytest.approx(0.25)
    assert repr(bias.path) in str(caught.value) and "off by 0.25" in str(caught.value)
    assert "np.float64" not in str(caught.value)  # the checksums read as plain numbers
    assert len(check.costs_s) == 1
    quote = quoted_block("guards.md", "Here replica 1's copy of a bias was changed by hand:")
    assert_quoted_in(quote, str(caught.value))


def test_replica_sync_check_rejects_bad_every_n_steps():
    with pytest.raises(ValueError, match="every_n_steps"):
        mk.callbacks.ReplicaSyncCheck(every_n_steps=0)


def _guards_on_two_workers(directory):
    import os

    import tensorflow as tf

    import mirrorkit as mk
    from mirrorkit.cluster import cluster_info

    strategy = mk.strategy()
    me = cluster_info.from_environment().task_index
    checkpoint = os.path.join(directory, "last.weights.h5")
    error, seen = _fit_until_nan(strategy, _data(2, 1, bad_worker=1, bad_replica=0), checkpoint)
    # The same processes go on with collectives: nobody was left inside one.
    clean = _data(2, 1, bad_worker=-1, bad_replica=0)

    def dataset_fn(context):
        x, y = clean[context.input_pipeline_id]
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(PER_REPLICA)

    model = mk.build(_model, strategy)
    data = strategy.distribute_datasets_from_function(dataset_fn)
    model.fit(
        data, epochs=1, steps_per_epoch=3, verbose=0, callbacks=[mk.callbacks.ReplicaSyncCheck(1)]
    )
    if me == 1:
        kernel = model.layers[0].kernel.value.values[0]  # this worker's only replica
        kernel.assign(kernel * 2.0)
    try:
        model.fit(
            data,
            epochs=1,
            steps_per_epoch=3,
            verbose=0,
            callbacks=[mk.callbacks.ReplicaSyncCheck(2)],
        )
    except mk.callbacks.ReplicasDivergedError as err:
        diverged = {
            "variable": err.variable,
            "replica": err.replica,
            "path": model.layers[0].kernel.path,
        }
    else:
        diverged = None
    return {
        "error": error,
        "batches": [b for b, _ in seen],
        "last": seen[-1][1],
        "diverged": diverged,
    }


@pytest.mark.multiprocess
def test_two_workers_nan_on_worker_1_stops_both_at_step_7(tmp_path):
    from _multiworker import run_workers

    results = run_workers(_guards_on_two_workers, str(tmp_path), n=2, timeout_s=240)
    for worker, result in enumerate(results):
        error = result["error"]
        assert error is not None, f"worker {worker} did not stop"
        assert error["step"] == BAD_STEP, f"worker {worker}: {error['message']}"
        assert error["workers"] == [1] and error["replicas"] == [1]
        assert "worker 1 replica 0 (global replica 1" in error["message"]
        assert result["batches"] == list(range(BAD_STEP)), f"worker {worker} trained past step 7"
        assert result["diverged"] is not None, f"worker {worker}: ReplicaSyncCheck missed it"
        assert result["diverged"]["variable"] == result["diverged"]["path"]
        assert result["diverged"]["replica"] == 1
    model = _model()
    model.load_weights(str(tmp_path / "last.weights.h5"))  # written by the chief, after step 6
    for got, want in zip(model.get_weights(), results[0]["last"], strict=True):
        assert np.isfinite(got).all()
        np.testing.assert_array_equal(got, want)


def test_a_gradient_alone_non_finite_is_caught_and_named():
    # sqrt(|error|) at error 0: the loss is 0 (finite), its gradient is not.
    import keras
    import tensorflow as tf

    def make():
        model = keras.Sequential(
            [keras.Input((3,)), keras.layers.Dense(1, kernel_initializer="zeros")]
        )
        model.compile(optimizer="sgd", loss=lambda t, p: tf.reduce_mean(tf.sqrt(tf.abs(t - p))))
        return model

    strategy = mk.strategy(cpu_replicas=2)
    model = mk.build(make, strategy)
    x = np.ones((16, 3), "float32")
    y = np.ones((16, 1), "float32")
    x[4:8], y[4:8] = 0.0, 0.0  # step 0, replica 1: prediction 0 == target 0
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    with pytest.raises(mk.callbacks.NonFiniteError) as caught:
        model.fit(data, epochs=1, verbose=0, callbacks=[mk.callbacks.NaNGuard()])
    assert caught.value.step == 0
    assert caught.value.what == {1: "gradient"}
    assert "non-finite gradient at step 0" in str(caught.value)


def test_a_step_the_guard_cannot_check_is_an_error_not_a_silent_no_op():
    # A train_step that updates the weights itself never reaches the optimizer's all-reduce.
    import tensorflow as tf
    from _models import own_update_model

    model = mk.build(own_update_model, mk.strategy(cpu_replicas=2))
    x, y = np.ones((32, 3), "float32"), np.ones((32, 1), "float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    with pytest.raises(RuntimeError, match="NaNGuard could not check this training step"):
        model.fit(data, epochs=1, verbose=0, callbacks=[mk.callbacks.NaNGuard()])


def test_with_accumulation_the_guard_stops_at_the_optimizer_step_of_the_bad_micro_step():
    # gradient_accumulation_steps=2: the checks ride in every 2nd micro-step's all-reduce, so
    # a NaN in micro-step 2's batch (replica 1's part) stops fit at micro-step 3, the end of
    # optimizer step 1 (the optimizer's iterations count optimizer steps), before the weights
    # take it.
    import keras
    import tensorflow as tf

    def make():
        from _models import tiny_model

        return tiny_model(optimizer=keras.optimizers.SGD(0.01, gradient_accumulation_steps=2))

    model = mk.build(make, mk.strategy(cpu_replicas=2))
    x, y = np.ones((48, 3), "float32"), np.ones((48, 1), "float32")
    x[20:24] = np.nan  # micro-step 2 (batches of 8), its second half: replica 1
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    with pytest.raises(mk.callbacks.NonFiniteError) as caught:
        model.fit(data, epochs=1, verbose=0, callbacks=[mk.callbacks.NaNGuard()])
    assert caught.value.step == 1
    assert caught.value.replicas == [1]
