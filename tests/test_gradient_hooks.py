"""One ordered chain of hooks around the optimizer's gradient all-reduce (training/gradient_hooks).

In-process tests (2 of the test process's 4 CPU replicas) check the chain's
rules: order by stage, riders summed with the gradients, one hook per name,
one hook replacing the all-reduce, the optimizer's own method back when the
last hook goes. The 2-worker test runs gradient compression, NaNGuard and
ThroughputCallback's step clock in one fit and compares it with one device.
"""

from __future__ import annotations

import numpy as np
import pytest
from _training import GLOBAL_BATCH, make_data, make_model
from test_compression import FP16_TOLERANCE

import mirrorkit as mk
from mirrorkit.training import gradient_hooks
from mirrorkit.training.gradient_hooks import GradientHook

#: What the chain runs with all three of mirrorkit's hooks, whatever order they came in.
THE_THREE = (
    "step_clock",
    "nan_guard.check",
    "compression",
    "step_clock.reduced",
    "nan_guard.verdict",
)


def _tiny():
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


def _own_method(optimizer):
    """Whether the optimizer's all-reduce is its class's own method again."""
    method = getattr(optimizer, gradient_hooks.ALL_REDUCE)
    own = getattr(type(optimizer), gradient_hooks.ALL_REDUCE)
    return gradient_hooks.ALL_REDUCE not in vars(optimizer) and method.__func__ is own


def _all_reduce_on_two_replicas(strategy, optimizer, rider=None):
    """Calls the optimizer's all-reduce, traced, on 2 replicas: replica r sends gradient r + 1.

    Returns each replica's summed gradient, and the rider's sum when a hook
    puts it in ``rider[thread]``.
    """
    import threading

    import tensorflow as tf

    variable = tf.Variable(0.0)

    @tf.function
    def step():
        context = tf.distribute.get_replica_context()
        gradient = tf.cast(context.replica_id_in_sync_group, tf.float32) + 1.0
        ((summed, _),) = getattr(optimizer, gradient_hooks.ALL_REDUCE)([(gradient, variable)])
        if rider is None:
            return summed, tf.zeros([2])
        return summed, rider.pop(threading.get_ident())

    with strategy.scope():
        summed, riders = strategy.run(step)
    local = strategy.experimental_local_results
    return [float(v) for v in local(summed)], [r.numpy().tolist() for r in local(riders)]


def test_hooks_run_by_stage_then_order_not_in_the_order_registered():
    import threading

    import tensorflow as tf

    strategy = mk.strategy(cpu_replicas=2)
    model = mk.build(_tiny, strategy)
    optimizer = model.optimizer
    rider = {}

    def add_rider(step):
        step.riders["ones"] = tf.ones([2])

    def read_rider(step):
        assert step.reduced
        rider[threading.get_ident()] = step.riders.pop("ones")

    def doubled_reduce(pairs, all_reduce):
        return [(g * 2.0, v) for g, v in all_reduce(pairs)]

    registered = [
        GradientHook("read", read_rider, stage="after"),
        GradientHook("late", lambda step: None, stage="before", order=20),
        GradientHook("double", doubled_reduce, stage="reduce"),
        GradientHook("add", add_rider, stage="before", order=10),
        GradientHook("also_10", lambda step: None, stage="before", order=10),
    ]
    for hook in registered:
        gradient_hooks.register(optimizer, hook, used_for="the test")
    expected = ("add", "also_10", "late", "double", "read")
    assert tuple(h.name for h in gradient_hooks.hooks(optimizer)) == expected
    summed, riders = _all_reduce_on_two_replicas(strategy, optimizer, rider)
    assert gradient_hooks.ran(optimizer) == expected
    # Gradients 1 and 2 summed, doubled by the replacing hook; the rider summed (2 x 1), doubled.
    assert summed == [6.0, 6.0]
    assert riders == [[4.0, 4.0]] * 2
    for hook in registered:
        gradient_hooks.remove(optimizer, hook)
    assert _own_method(optimizer)
    assert _all_reduce_on_two_replicas(strategy, optimizer)[0] == [3.0, 3.0]


def test_the_same_hook_twice_is_one_and_the_last_removal_restores_what_was_there():
    strategy = mk.strategy(cpu_replicas=2)
    optimizer = mk.build(_tiny, strategy).optimizer
    keras_all_reduce = getattr(optimizer, gradient_hooks.ALL_REDUCE)

    def earlier_wrapper(grads_and_vars):  # someone's wrapper, there before the chain
        return keras_all_reduce(grads_and_vars)

    setattr(optimizer, gradient_hooks.ALL_REDUCE, earlier_wrapper)
    hook = GradientHook("noop", lambda step: None, stage="before")
    gradient_hooks.register(optimizer, hook, used_for="the test")
    gradient_hooks.register(optimizer, hook, used_for="the test")
    assert gradient_hooks.hooks(optimizer) == (hook,)
    # A hook of the same name replaces it; removing the replaced one leaves the new one.
    newer = GradientHook("noop", lambda step: None, stage="before")
    gradient_hooks.register(optimizer, newer, used_for="the test")
    gradient_hooks.remove(optimizer, hook)
    assert gradient_hooks.hooks(optimizer) == (newer,)
    assert _all_reduce_on_two_replicas(strategy, optimizer)[0] == [3.0, 3.0]
    gradient_hooks.remove(optimizer, "noop")
    assert gradient_hooks.hooks(optimizer) == ()
    assert getattr(optimizer, gradient_hooks.ALL_REDUCE) is earlier_wrapper


def test_a_second_hook_replacing_the_all_reduce_is_an_error():
    model = mk.build(_tiny, mk.strategy(cpu_replicas=2), gradient_compression="bf16")
    other = GradientHook("other", lambda pairs, all_reduce: all_reduce(pairs), stage="reduce")
    with pytest.raises(ValueError, match="'compression' already replaces it.*remove"):
        gradient_hooks.register(model.optimizer, other, used_for="the test")
    gradient_hooks.remove(model.optimizer, "compression")
    gradient_hooks.register(model.optimizer, other, used_for="the test")
    assert [h.name for h in gradient_hooks.hooks(model.optimizer)] == ["other"]


def test_bad_hooks_are_errors_that_say_what_to_give():
    stages = "before, reduce, after"
    with pytest.raises(ValueError, match=f"'mine' needs stage= \\(one of {stages}\\)"):
        GradientHook("mine", print)
    with pytest.raises(ValueError, match=f"stage must be one of {stages}; got 'during'"):
        GradientHook("mine", print, stage="during")
    with pytest.raises(TypeError, match="fn must be callable"):
        GradientHook("mine", None, stage="before")
    with pytest.raises(ValueError, match="non-empty name"):
        GradientHook("", print, stage="before")
    with pytest.raises(TypeError, match="register takes a GradientHook, e.g. .*; got builtin"):
        gradient_hooks.register(_tiny().optimizer, print, used_for="the test")


# All three at once on 2 workers (1 CPU replica each), against one device


def _fit(strategy, compression=None, callbacks=()):
    import keras

    x, y = make_data()
    model = mk.build(lambda: make_model("sgd", 0.1), strategy, gradient_compression=compression)
    optimizer = model.optimizer
    during = []

    class Listing(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            during.append(tuple(h.name for h in gradient_hooks.hooks(optimizer)))

    data = mk.distribute((x, y), strategy, global_batch_size=GLOBAL_BATCH, shuffle=False)
    history = model.fit(data, epochs=2, verbose=0, callbacks=[*callbacks, Listing()])
    return model, {
        "weights": [w.copy() for w in model.get_weights()],
        "loss": history.history["loss"],
        "iterations": int(optimizer.iterations.numpy()),
        "during": sorted(set(during)),
        "ran": gradient_hooks.ran(optimizer),
        "after_fit": [h.name for h in gradient_hooks.hooks(optimizer)],
    }


def fit_with_all_three(compression):
    """On each worker: compression, NaNGuard and ThroughputCallback's clock in one fit."""
    throughput = mk.ThroughputCallback(verbose=0)
    model, result = _fit(mk.strategy(), compression, [throughput, mk.callbacks.NaNGuard()])
    optimizer = model.optimizer
    for hook in gradient_hooks.hooks(optimizer):
        gradient_hooks.remove(optimizer, hook)
    result["restored"] = _own_method(optimizer)
    epochs = throughput.report.to_dict()["epochs"]
    result["compute_s"] = [epoch["worker_compute_median_s"] for epoch in epochs]
    return result


@pytest.mark.multiprocess
def test_compression_nan_guard_and_step_clock_together_run_in_order_and_equal_one_device():
    from _multiworker import run_workers

    workers = run_workers(fit_with_all_three, "fp16", n=2, timeout_s=300)
    _, one_device = _fit(mk.strategy("one_device"))
    for rank, got in enumerate(workers):
        # (a) every step went through the three, in the chain's order, not the order they
        # were registered in (compression at build, the clock at set_model, the guard at
        # on_train_begin).
        assert got["during"] == [THE_THREE], f"worker {rank}"
        assert got["ran"] == THE_THREE, f"worker {rank}"
        assert got["after_fit"] == ["compression"], f"worker {rank}: the callbacks' hooks left"
        assert all(min(medians) > 0 for medians in got["compute_s"]), "the clock timed nothing"
        # (b) one device's training, within the compressed all-reduce's tolerance.
        assert got["iterations"] == one_device["iterations"] == 8
        diff = max(
            float(np.abs(a - b).max())
            for a, b in zip(got["weights"], one_device["weights"], strict=True)
        )
        assert 0 < diff < FP16_TOLERANCE, f"worker {rank}: {diff}"  # compressed, and close
        np.testing.assert_allclose(got["loss"], one_device["loss"], rtol=0, atol=FP16_TOLERANCE)
        # (c) with no hook left, the optimizer's own method is back.
        assert got["restored"], f"worker {rank}"
