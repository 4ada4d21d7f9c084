"""fit keeps one distributed iterator over an mk.distribute dataset, and trains as before.

With the ``one_iterator`` hook ``fit`` reads the dataset's repeating twin with its epoch length
as ``steps_per_epoch``; without it Keras makes a new distributed iterator every epoch. Both
must see the same examples in the same order every epoch (shuffled in-memory arrays drawn from
(seed, epoch), a dropped remainder, validation every epoch, ``initial_epoch``), so the History,
the weights and ``optimizer.iterations`` are equal; only the number of iterators differs.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from _quoted import assert_quoted_in, quoted_block

import mirrorkit as mk
from mirrorkit import distributed_data
from mirrorkit.feeding import one_iterator

RNG = np.random.default_rng(0)
X = RNG.normal(size=(200, 4)).astype("float32")  # 200 = 6 batches of 32 and 8 dropped
Y = (X[:, :1] > 0).astype("float32")
XV, YV = X[:72], Y[:72]  # 2 batches of 32 and a last one of 8, kept for evaluation


def _make_model(steps_per_execution=1):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    model.compile(
        optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"],
        steps_per_execution=steps_per_execution,
    )  # fmt: skip
    return model


@pytest.fixture
def without_one_iterator():
    def take_away():
        for repair in reversed(one_iterator.REPAIRS):
            repair.remove()

    yield take_away
    for repair in one_iterator.REPAIRS:
        repair.apply()


def _iterators_made(monkeypatch, dataset):
    """Counts the iterators made over `dataset`'s type (its twin's type too)."""
    made = []
    kind = type(dataset)
    original = kind.__iter__

    def counting(self):
        made.append(self)
        return original(self)

    monkeypatch.setattr(kind, "__iter__", counting)
    return made


def _fit(strategy, initial_epoch=0, epochs=3):
    keras.utils.set_random_seed(0)
    model = mk.build(_make_model, strategy)
    train = mk.distribute((X, Y), strategy, global_batch_size=32, seed=7)
    validation = mk.distribute((XV, YV), strategy, global_batch_size=32, for_eval=True)
    history = model.fit(
        train, validation_data=validation, epochs=epochs, initial_epoch=initial_epoch, verbose=0
    )
    return {
        "history": history.history,
        "weights": [w.numpy() for w in model.weights],
        "iterations": int(model.optimizer.iterations.numpy()),
        "train": train,
    }


def _assert_same(a, b):
    assert a["iterations"] == b["iterations"]
    assert a["history"].keys() == b["history"].keys()
    for key in a["history"]:
        np.testing.assert_allclose(a["history"][key], b["history"][key], atol=1e-6, err_msg=key)
    for wa, wb in zip(a["weights"], b["weights"], strict=True):
        np.testing.assert_allclose(wa, wb, atol=1e-6)


@pytest.mark.parametrize("initial_epoch", [0, 1])
def test_one_iterator_trains_as_an_iterator_per_epoch(without_one_iterator, initial_epoch):
    strategy = mk.strategy(cpu_replicas=2)
    one = _fit(strategy, initial_epoch)
    without_one_iterator()
    per_epoch = _fit(strategy, initial_epoch)
    _assert_same(one, per_epoch)
    assert one["iterations"] == 6 * (3 - initial_epoch)  # 6 steps an epoch, 8 examples dropped


@pytest.mark.slow  # two fits each way; the quick set keeps its evaluate counterpart
@pytest.mark.parametrize("steps_per_execution", [3, 4])
def test_steps_per_execution_never_reads_into_the_next_epoch(
    monkeypatch, without_one_iterator, steps_per_execution
):
    """6 training steps an epoch and 3 of validation: whole executions of 3, not of 4."""
    strategy = mk.strategy(cpu_replicas=2)

    def fit():
        keras.utils.set_random_seed(0)

        model = mk.build(lambda: _make_model(steps_per_execution), strategy)
        train = mk.distribute((X, Y), strategy, global_batch_size=32, seed=7)
        validation = mk.distribute((XV, YV), strategy, global_batch_size=32, for_eval=True)
        history = model.fit(train, validation_data=validation, epochs=3, verbose=0)
        return {
            "history": history.history,
            "weights": [w.numpy() for w in model.weights],
            "iterations": int(model.optimizer.iterations.numpy()),
        }

    one = fit()
    assert one["iterations"] == 18
    without_one_iterator()
    _assert_same(one, fit())


def test_fit_makes_one_training_and_one_validation_iterator(monkeypatch):
    strategy = mk.strategy(cpu_replicas=2)
    probe = mk.distribute((X, Y), strategy, global_batch_size=32, seed=7)
    made = _iterators_made(monkeypatch, distributed_data.twin(probe))
    _fit(strategy, epochs=4)
    assert len(made) == 2  # training and validation, over 4 epochs


def test_fit_made_an_iterator_per_epoch_before(monkeypatch, without_one_iterator):
    strategy = mk.strategy(cpu_replicas=2)
    probe = mk.distribute((X, Y), strategy, global_batch_size=32, seed=7)
    made = _iterators_made(monkeypatch, probe)
    without_one_iterator()
    _fit(strategy, epochs=4)
    assert len(made) >= 8  # at least one for training and one for validation, each epoch


def test_the_twin_gives_each_epoch_the_order_of_that_epoch():
    strategy = mk.strategy("one_device")
    data = mk.distribute(np.arange(10, dtype="int64"), strategy, global_batch_size=2, seed=3)
    twin = distributed_data.twin(data)
    assert data.steps_per_epoch == 5 and distributed_data.epoch_length(data) == 5
    assert distributed_data.epoch_length(twin) is None  # a twin has no twin
    epochs = []
    for epoch in range(3):  # an iterator per epoch, as Keras makes them
        distributed_data.record(data).epoch_order.begin(epoch)
        epochs.append([int(v) for batch in data for v in tf.reshape(batch, [-1]).numpy()])
    distributed_data.record(twin).epoch_order.begin(0)
    stream = iter(twin)
    continuous = [[int(v) for _ in range(5) for v in tf.reshape(next(stream), [-1]).numpy()]]
    continuous += [[int(v) for _ in range(5) for v in tf.reshape(next(stream), [-1]).numpy()]]
    continuous += [[int(v) for _ in range(5) for v in tf.reshape(next(stream), [-1]).numpy()]]
    assert continuous == epochs
    assert epochs[0] != epochs[1] and sorted(epochs[0]) == list(range(10))


def test_a_fit_given_its_own_steps_and_a_plain_dataset_are_left_alone():
    strategy = mk.strategy(cpu_replicas=2)
    model = mk.build(_make_model, strategy)
    plain = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((X, Y)).batch(32)
    )
    assert distributed_data.epoch_length(plain) is None  # not mirrorkit's: never changed
    train = mk.distribute((X, Y), strategy, global_batch_size=32, seed=7)
    history = model.fit(train, epochs=2, steps_per_epoch=3, verbose=0)  # the caller's steps
    assert int(model.optimizer.iterations.numpy()) == 6 and len(history.history["loss"]) == 2


def test_a_dataset_distributed_elsewhere_is_left_alone_and_said_once(monkeypatch, capfd):
    from mirrorkit import notices

    monkeypatch.setattr(notices, "_said", set())
    strategy = mk.strategy(cpu_replicas=2)
    model = mk.build(_make_model, strategy)
    plain = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((X, Y)).batch(32)
    )
    made = _iterators_made(monkeypatch, plain)
    capfd.readouterr()
    model.fit(plain, epochs=1, verbose=0)  # one epoch: nothing to keep
    assert "distributed without mk.distribute" not in capfd.readouterr().err
    per_epoch = len(made)
    model.fit(plain, epochs=3, verbose=0)
    model.fit(plain, epochs=2, verbose=0)
    said = capfd.readouterr().err
    assert said.count("fit's x is a dataset distributed without mk.distribute") == 1, said
    assert "keeps one iterator for the whole fit" in said
    assert_quoted_in(quoted_block("compat.md", "For it, a `fit` over"), said)
    assert len(made) == per_epoch * (1 + 3 + 2)  # unchanged: Keras's iterators every epoch
    model.fit(mk.distribute((X, Y), strategy, global_batch_size=32, seed=7), epochs=2, verbose=0)
    assert "distributed without" not in capfd.readouterr().err  # mirrorkit's own: kept, not said


def test_an_iterator_left_reading_does_not_move_the_next_fits_orders():
    """A resumed fit's new iterator reads the epoch it begins, whatever an old one read since."""
    strategy = mk.strategy("one_device")
    data = mk.distribute(np.arange(10, dtype="int64"), strategy, global_batch_size=2, seed=3)
    twin = distributed_data.twin(data)

    def epoch_of(stream):
        return [int(v) for _ in range(5) for v in tf.reshape(next(stream), [-1]).numpy()]

    distributed_data.record(twin).epoch_order.begin(0)
    old = iter(twin)
    first, second = epoch_of(old), epoch_of(old)
    distributed_data.record(twin).epoch_order.begin(1)  # the resumed fit begins epoch 1
    new = iter(twin)
    epoch_of(old)  # the old iterator reads on (prefetching, or never freed)
    assert epoch_of(new) == second and epoch_of(new) != first


def test_a_pipeline_that_reshuffles_itself_keeps_an_iterator_per_epoch():
    strategy = mk.strategy(cpu_replicas=2)
    own = tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(200, seed=1).batch(32)
    assert distributed_data.epoch_length(mk.distribute(own, strategy)) is None  # its own orders
    streamed = mk.distribute((X, Y), strategy, global_batch_size=32, seed=1, cache=True)
    assert distributed_data.epoch_length(streamed) is None  # a streamed shuffle's orders, likewise
    unshuffled = tf.data.Dataset.from_tensor_slices((X, Y)).batch(32)
    kept = mk.distribute(unshuffled, strategy)
    assert distributed_data.epoch_length(kept) == 7  # kept, not dropped


def _evaluate_and_predict(strategy, data, calls=3, steps_per_execution=1, callbacks=()):
    keras.utils.set_random_seed(0)

    model = mk.build(lambda: _make_model(steps_per_execution), strategy)
    evaluated = [model.evaluate(data, verbose=0, callbacks=list(callbacks)) for _ in range(calls)]
    predicted = [model.predict(data, verbose=0) for _ in range(calls)]
    return evaluated, predicted


# 3 batches an epoch: whole executions of 1 or 3 steps, not of 2 (whose last would read on).
@pytest.mark.parametrize(
    "steps_per_execution, iterators",
    [
        (1, 1),
        pytest.param(3, 1, marks=pytest.mark.slow),  # the quick set keeps the first case
        pytest.param(2, 6, marks=pytest.mark.slow),
    ],
)
def test_evaluate_and_predict_keep_one_iterator_across_calls(
    monkeypatch, without_one_iterator, steps_per_execution, iterators
):
    strategy = mk.strategy(cpu_replicas=2)
    data = mk.distribute((XV, YV), strategy, global_batch_size=32, for_eval=True)
    made = _iterators_made(monkeypatch, data)  # the twin's type too
    one = _evaluate_and_predict(strategy, data, steps_per_execution=steps_per_execution)
    assert len(made) >= iterators and (iterators == 6 or len(made) == 1)  # 3 evaluate, 3 predict
    kept = len(made)
    without_one_iterator()
    per_call = _evaluate_and_predict(strategy, data, steps_per_execution=steps_per_execution)
    assert len(made) >= kept + 6  # at least one a call (Keras 3.15 makes two)
    np.testing.assert_allclose(one[0], per_call[0], atol=1e-6)
    assert one[0][0] == one[0][2]  # every call the whole epoch, from its first batch
    for a, b in zip(one[1], per_call[1], strict=True):
        assert a.shape == (72, 1)  # the last batch of 8 too, in order
        np.testing.assert_array_equal(a, b)


class _StopAt(keras.callbacks.Callback):
    def __init__(self, batch, error=False):
        super().__init__()
        self.batch, self.error = batch, error

    def on_test_batch_end(self, batch, logs=None):
        if batch == self.batch:
            if self.error:
                raise RuntimeError("stopped part-way")
            self.model.stop_evaluating = True


@pytest.mark.parametrize("error", [False, True], ids=["stop_evaluating", "an-error"])
def test_a_call_stopped_part_way_gives_its_iterator_up(monkeypatch, error):
    strategy = mk.strategy(cpu_replicas=2)
    data = mk.distribute((XV, YV), strategy, global_batch_size=32, for_eval=True)
    made = _iterators_made(monkeypatch, data)
    model = mk.build(_make_model, strategy)
    whole = model.evaluate(data, verbose=0)
    try:
        model.evaluate(data, verbose=0, callbacks=[_StopAt(0, error)])  # one batch of three
    except RuntimeError:
        assert error
    assert model.evaluate(data, verbose=0) == whole  # from the epoch's first batch again
    assert len(made) == 2  # the part-way one was not kept
    assert model.evaluate(data, verbose=0) == whole and len(made) == 2


@pytest.fixture
def keras_reads_a_batch_to_build():
    """Keras's own symbolic build, which reads the first batch, then starts the epoch again."""
    from mirrorkit.compat import symbolic_build

    yield symbolic_build.REPAIR.remove  # called once the strategy is made (which applies it)
    symbolic_build.REPAIR.apply()


def test_an_unbuilt_model_reading_a_batch_to_build_itself_misses_nothing(
    monkeypatch, keras_reads_a_batch_to_build
):
    strategy = mk.strategy(cpu_replicas=2)
    keras_reads_a_batch_to_build()
    data = mk.distribute((XV, YV), strategy, global_batch_size=32, for_eval=True)
    made = _iterators_made(monkeypatch, data)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    first = model.evaluate(data, verbose=0)  # builds from a batch, then reads the epoch
    assert len(made) == 2  # the one read to build is not kept
    assert model.evaluate(data, verbose=0) == first
    assert model.evaluate(XV, YV, batch_size=32, verbose=0) == pytest.approx(first, abs=1e-6)


def test_a_shuffled_dataset_and_given_steps_keep_an_iterator_per_call(monkeypatch):
    strategy = mk.strategy(cpu_replicas=2)
    model = mk.build(_make_model, strategy)
    shuffled = mk.distribute(
        (XV[:64], YV[:64]), strategy, global_batch_size=32, seed=3, shuffle=True
    )
    made = _iterators_made(monkeypatch, shuffled)
    predicted = [model.predict(shuffled, verbose=0) for _ in range(2)]
    # each call an iterator and the next epoch's order, as without the hook
    np.testing.assert_array_equal(np.sort(predicted[0], 0), np.sort(predicted[1], 0))
    assert len(made) >= 2
    before = len(made)
    plain = mk.distribute((XV, YV), strategy, global_batch_size=32, for_eval=True)
    for _ in range(2):
        model.evaluate(plain, steps=2, verbose=0)  # the caller's steps
    assert len(made) >= before + 2


def test_a_kept_iterator_goes_with_its_dataset_without_a_garbage_collection():
    import gc
    import weakref

    strategy = mk.strategy(cpu_replicas=2)
    model = mk.build(_make_model, strategy)
    data = mk.distribute((XV, YV), strategy, global_batch_size=32, for_eval=True)
    model.evaluate(data, verbose=0)
    model.predict(data, verbose=0)
    gc.collect()
    gc.disable()
    try:
        kept = weakref.ref(distributed_data.kept_iterator(distributed_data.twin(data)))
        del data  # the twin is in no reference cycle: its iterator is freed here, not later
        assert kept() is None
    finally:
        gc.enable()
