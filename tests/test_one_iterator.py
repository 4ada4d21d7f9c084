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

import mirrorkit as mk
from mirrorkit.compat import one_iterator
from mirrorkit.pipeline import repeating

RNG = np.random.default_rng(0)
X = RNG.normal(size=(200, 4)).astype("float32")  # 200 = 6 batches of 32 and 8 dropped
Y = (X[:, :1] > 0).astype("float32")
XV, YV = X[:72], Y[:72]  # 2 batches of 32 and a last one of 8, kept for evaluation


def _make_model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
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


def test_fit_makes_one_training_and_one_validation_iterator(monkeypatch):
    strategy = mk.strategy(cpu_replicas=2)
    probe = mk.distribute((X, Y), strategy, global_batch_size=32, seed=7)
    made = _iterators_made(monkeypatch, repeating.twin(probe))
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
    twin = repeating.twin(data)
    assert data.steps_per_epoch == 5 and repeating.epoch_length(data) == 5
    assert repeating.epoch_length(twin) is None  # a twin has no twin
    epochs = []
    for epoch in range(3):  # an iterator per epoch, as Keras makes them
        data.epoch_order.begin(epoch)
        epochs.append([int(v) for batch in data for v in tf.reshape(batch, [-1]).numpy()])
    twin.epoch_order.begin(0)
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
    assert repeating.epoch_length(plain) is None  # not mirrorkit's: never changed
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
    assert len(made) == per_epoch * (1 + 3 + 2)  # unchanged: Keras's iterators every epoch
    model.fit(mk.distribute((X, Y), strategy, global_batch_size=32, seed=7), epochs=2, verbose=0)
    assert "distributed without" not in capfd.readouterr().err  # mirrorkit's own: kept, not said


def test_an_iterator_left_reading_does_not_move_the_next_fits_orders():
    """A resumed fit's new iterator reads the epoch it begins, whatever an old one read since."""
    strategy = mk.strategy("one_device")
    data = mk.distribute(np.arange(10, dtype="int64"), strategy, global_batch_size=2, seed=3)
    twin = repeating.twin(data)

    def epoch_of(stream):
        return [int(v) for _ in range(5) for v in tf.reshape(next(stream), [-1]).numpy()]

    twin.epoch_order.begin(0)
    old = iter(twin)
    first, second = epoch_of(old), epoch_of(old)
    twin.epoch_order.begin(1)  # the resumed fit begins epoch 1
    new = iter(twin)
    epoch_of(old)  # the old iterator reads on (prefetching, or never freed)
    assert epoch_of(new) == second and epoch_of(new) != first


def test_a_pipeline_that_reshuffles_itself_keeps_an_iterator_per_epoch():
    strategy = mk.strategy(cpu_replicas=2)
    own = tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(200, seed=1).batch(32)
    assert repeating.epoch_length(mk.distribute(own, strategy)) is None  # its own orders
    streamed = mk.distribute((X, Y), strategy, global_batch_size=32, seed=1, cache=True)
    assert repeating.epoch_length(streamed) is None  # a streamed shuffle's orders, likewise
    unshuffled = tf.data.Dataset.from_tensor_slices((X, Y)).batch(32)
    assert repeating.epoch_length(mk.distribute(unshuffled, strategy)) == 7  # kept, not dropped
