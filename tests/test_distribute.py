"""`mk.distribute` on simulated CPU replicas in this process (4 logical CPUs)."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from _quoted import assert_quoted_in, quoted_block

import mirrorkit as mk
from mirrorkit import distributed_data, notices

NUM_EXAMPLES = 1000
GLOBAL_BATCH = 64


def _strategy(replicas):
    return mk.strategy("one_device") if replicas == 1 else mk.strategy(cpu_replicas=replicas)


def _ids_by_replica(strategy, distributed):
    """One epoch: for each step, the example ids each replica received."""
    steps = []
    for batch in distributed:
        ids = batch[0] if isinstance(batch, tuple) else batch
        steps.append(
            [v.numpy().reshape(-1).tolist() for v in strategy.experimental_local_results(ids)]
        )
    return steps


def _tagged(n=NUM_EXAMPLES):
    ids = np.arange(n, dtype="int64")
    return ids, (ids % 7).astype("float32")


@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_training_epoch_uses_each_example_at_most_once(replicas):
    strategy = _strategy(replicas)
    data = mk.distribute(_tagged(), strategy, global_batch_size=GLOBAL_BATCH, seed=1)
    steps = _ids_by_replica(strategy, data)
    seen = [i for step in steps for replica in step for i in replica]
    assert len(seen) == len(set(seen))  # no id twice
    dropped = NUM_EXAMPLES % GLOBAL_BATCH
    assert len(set(range(NUM_EXAMPLES)) - set(seen)) == dropped == data.dropped_per_epoch
    assert len(steps) == data.steps_per_epoch == NUM_EXAMPLES // GLOBAL_BATCH
    for step in steps:  # every replica gets its own equal share of each global batch
        assert [len(r) for r in step] == [GLOBAL_BATCH // replicas] * replicas
    assert (data.global_batch_size, data.per_replica_batch_size) == (64, 64 // replicas)


@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_evaluation_epoch_uses_every_example_once_in_order(replicas):
    strategy = _strategy(replicas)
    data = mk.distribute(_tagged(), strategy, global_batch_size=GLOBAL_BATCH, for_eval=True)
    seen = [i for step in _ids_by_replica(strategy, data) for r in step for i in r]
    assert seen == list(range(NUM_EXAMPLES))
    assert data.steps_per_epoch == 16 and data.dropped_per_epoch == 0


def test_shuffle_is_seeded_and_changes_every_epoch():
    strategy = _strategy(2)

    def epochs(seed):
        data = mk.distribute(_tagged(), strategy, global_batch_size=GLOBAL_BATCH, seed=seed)
        return [_ids_by_replica(strategy, data) for _ in range(2)]

    first, again, other = epochs(5), epochs(5), epochs(6)
    assert first == again  # the same seed gives the same orders
    assert first[0] != first[1]  # a new order each epoch
    assert first[0] != other[0]
    assert [i for r in first[0][0] for i in r] != list(range(GLOBAL_BATCH))  # shuffled at all


def test_shuffled_order_is_one_of_seed_and_epoch_not_of_the_iterators_made():
    strategy = _strategy(2)
    data = mk.distribute(_tagged(), strategy, global_batch_size=GLOBAL_BATCH, seed=5)
    first = _ids_by_replica(strategy, data)
    unread = [iter(data) for _ in range(3)]  # made and never read (Keras makes such)
    second = _ids_by_replica(strategy, data)
    assert first != second and unread
    with strategy.scope():  # the epoch is a host variable even in a scope, not a mirrored one
        again = mk.distribute(_tagged(), strategy, global_batch_size=GLOBAL_BATCH, seed=5)
    assert not isinstance(
        distributed_data.record(again).epoch_order.epoch, tf.distribute.DistributedValues
    )
    distributed_data.record(again).epoch_order.begin(
        1
    )  # a resumed run: mk.resumable sets the epoch Keras begins
    assert _ids_by_replica(strategy, again) == second
    distributed_data.record(again).epoch_order.begin(0)
    assert _ids_by_replica(strategy, again) == first
    assert _ids_by_replica(strategy, again) == second  # and counts on by itself


def test_seed_is_drawn_and_said_when_not_given(capfd):
    strategy = _strategy(2)
    mk.distribute(_tagged(), strategy, global_batch_size=GLOBAL_BATCH)
    assert "shuffling with seed" in capfd.readouterr().err


def _classifier():
    model = keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)]
    )
    model.compile(
        optimizer="sgd",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["sparse_categorical_accuracy"],
    )
    rng = np.random.default_rng(3)
    model.set_weights([rng.normal(size=w.shape).astype("float32") for w in model.get_weights()])
    return model


def _classification_data(n):
    rng = np.random.default_rng(4)
    return rng.normal(size=(n, 5)).astype("float32"), rng.integers(0, 3, size=n).astype("int32")


@pytest.mark.parametrize("num_examples", [1000, 961])  # 961: the last batch has 1 example
def test_evaluate_and_predict_on_four_replicas_equal_one_device(num_examples):
    x, y = _classification_data(num_examples)
    want = _classifier().evaluate(x, y, batch_size=GLOBAL_BATCH, verbose=0, return_dict=True)
    want_pred = _classifier().predict(x, batch_size=GLOBAL_BATCH, verbose=0)
    strategy = _strategy(4)
    model = mk.build(_classifier, strategy)
    got = model.evaluate(
        mk.distribute((x, y), strategy, global_batch_size=GLOBAL_BATCH, for_eval=True),
        verbose=0,
        return_dict=True,
    )
    for key in want:
        assert got[key] == pytest.approx(want[key], abs=1e-6), key
    predicted = model.predict(
        mk.distribute(x, strategy, global_batch_size=GLOBAL_BATCH, for_eval=True), verbose=0
    )
    assert predicted.shape == (num_examples, 3)
    np.testing.assert_allclose(predicted, want_pred, atol=1e-6)


def test_fit_on_distributed_arrays_equals_one_device():
    x, y = _classification_data(256)
    reference = _classifier()
    reference.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
    strategy = _strategy(4)
    model = mk.build(_classifier, strategy)
    model.fit(
        mk.distribute((x, y), strategy, global_batch_size=GLOBAL_BATCH, shuffle=False),
        epochs=2,
        verbose=0,
    )
    for got, want in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_sample_weights_and_dict_inputs_pass_through():
    strategy = _strategy(2)
    features = {"a": np.arange(8, dtype="float32"), "b": np.arange(8, dtype="float32") * 2}
    data = mk.distribute(
        (features, np.zeros(8, "float32"), np.full(8, 0.5, "float32")),
        strategy,
        per_replica_batch_size=2,
        shuffle=False,
    )
    (x, y, w) = next(iter(data))
    a = np.concatenate([v.numpy() for v in strategy.experimental_local_results(x["a"])])
    assert a.tolist() == [0, 1, 2, 3] and data.global_batch_size == 4
    assert (
        np.concatenate([v.numpy() for v in strategy.experimental_local_results(w)]).tolist()
        == [0.5] * 4
    )


def test_an_already_batched_dataset_is_rebatched_and_said(capfd):
    strategy = _strategy(2)
    dataset = tf.data.Dataset.range(100).batch(10).map(lambda b: b * 1)
    data = mk.distribute(dataset, strategy, global_batch_size=32, for_eval=True)
    seen = [i for step in _ids_by_replica(strategy, data) for r in step for i in r]
    assert seen == list(range(100))
    assert "already batched (batch size 10)" in capfd.readouterr().err


def test_a_padded_batch_dataset_is_refused():
    with pytest.raises(ValueError, match="padded_batch"):
        mk.distribute(tf.data.Dataset.range(10).padded_batch(2), _strategy(2), global_batch_size=4)


def test_string_inputs_with_string_lookup_train_on_two_replicas():
    strategy = _strategy(2)

    def make():
        text = keras.Input((1,), dtype="string")
        ids = keras.layers.StringLookup(vocabulary=["cat", "dog", "eel"])(text)
        out = keras.layers.Dense(1)(keras.layers.Flatten()(keras.layers.Embedding(4, 4)(ids)))
        model = keras.Model(text, out)
        model.compile(optimizer="sgd", loss="mse")
        return model

    words = np.array([["cat"], ["dog"], ["eel"], ["cat"]] * 8)
    model = mk.build(make, strategy)
    data = mk.distribute((words, np.ones((32, 1), "float32")), strategy, global_batch_size=8)
    history = model.fit(data, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2 and np.isfinite(history.history["loss"]).all()


def test_a_first_global_batch_smaller_than_the_replica_count_works():
    x, y = _classification_data(1)
    want = _classifier().evaluate(x, y, verbose=0, return_dict=True)
    strategy = _strategy(2)
    model = mk.build(_classifier, strategy)
    got = model.evaluate(
        mk.distribute((x, y), strategy, global_batch_size=4, for_eval=True),
        verbose=0,
        return_dict=True,
    )
    assert got["loss"] == pytest.approx(want["loss"], abs=1e-6)


def test_ragged_features_pass_through():
    strategy = _strategy(2)
    ragged = tf.ragged.constant([[1], [2, 3], [4, 5, 6], [7]])
    data = mk.distribute(
        (ragged, np.zeros(4, "float32")), strategy, global_batch_size=2, shuffle=False
    )
    x, _ = next(iter(data))
    rows = [r.to_list() for v in strategy.experimental_local_results(x) for r in [v]]
    assert rows == [[[1]], [[2, 3]]]


def test_per_worker_function_gets_its_batch_size():
    strategy = _strategy(2)

    def pipeline(context):
        assert context.get_per_replica_batch_size(8) == 4
        return tf.data.Dataset.range(16)

    data = mk.distribute(pipeline, strategy, global_batch_size=8)
    assert [len(r) for r in _ids_by_replica(strategy, data)[0]] == [4, 4]


# Errors: each names what was wrong and what to do.


def test_both_or_neither_batch_size_is_an_error():
    with pytest.raises(ValueError, match="exactly one of per_replica_batch_size= and global"):
        mk.distribute(_tagged(), _strategy(2), per_replica_batch_size=4, global_batch_size=8)
    with pytest.raises(ValueError, match=r"\(got neither\)"):
        mk.distribute(_tagged(), _strategy(2))


def test_a_global_batch_the_replicas_do_not_divide_names_the_nearest_sizes():
    with pytest.raises(ValueError, match="nearest sizes that do are 60 and 64"):
        mk.distribute(_tagged(), _strategy(4), global_batch_size=62)


def test_training_data_smaller_than_one_global_batch_is_an_error():
    with pytest.raises(ValueError, match="30 examples, fewer than one global batch of 64"):
        mk.distribute(_tagged(30), _strategy(2), global_batch_size=64)


def test_a_function_returning_the_wrong_batch_size_is_an_error():
    def pipeline(context):
        return tf.data.Dataset.range(64).batch(8)

    with pytest.raises(
        ValueError, match="returned batches of 8 examples, but each replica takes 4"
    ):
        mk.distribute(pipeline, _strategy(2), global_batch_size=8)


def test_unreadable_data_and_bad_options_are_errors():
    with pytest.raises(TypeError, match="cannot read data of type list"):
        mk.distribute([1, 2, 3], _strategy(2), global_batch_size=2)
    with pytest.raises(ValueError, match="shard must be"):
        mk.distribute(_tagged(), _strategy(2), global_batch_size=2, shard="rows")
    with pytest.raises(ValueError, match="drop_remainder=True would drop"):
        mk.distribute(
            _tagged(), _strategy(2), global_batch_size=2, for_eval=True, drop_remainder=True
        )
    with pytest.raises(ValueError, match="different numbers of rows"):
        mk.distribute((np.ones(4), np.ones(5)), _strategy(2), global_batch_size=2)


def test_a_tfds_split_that_does_not_exist_is_an_error(tmp_path):
    from _tfds_builder import prepare

    builder = prepare(str(tmp_path))
    with pytest.raises(ValueError, match="has no split 'validation'.*its splits are test, train"):
        mk.distribute(builder, _strategy(2), global_batch_size=8, split="validation")
    with pytest.raises(ValueError, match="needs split="):
        mk.distribute(builder, _strategy(2), global_batch_size=8)


def test_tfds_on_one_worker_reads_every_example(tmp_path):
    from _tfds_builder import NUM_TEST, prepare

    prepare(str(tmp_path))
    strategy = _strategy(2)
    data = mk.distribute(
        "tiny_images",
        strategy,
        global_batch_size=16,
        split="test",
        data_dir=str(tmp_path),
        as_supervised=False,
        for_eval=True,
    )
    seen = []
    for batch in data:
        seen += [i for v in strategy.experimental_local_results(batch["id"]) for i in v.numpy()]
    assert sorted(seen) == list(range(10_000, 10_000 + NUM_TEST))


# already-batched datasets: their batches kept, their length known


def test_a_dataset_batched_by_the_global_batch_keeps_its_batches_length_and_order(capfd):
    strategy = _strategy(2)
    data = mk.distribute(tf.data.Dataset.range(100).batch(10), strategy, for_eval=True)
    assert (data.global_batch_size, data.steps_per_epoch, data.num_examples) == (10, 10, 100)
    assert int(data.cardinality) == 10
    seen = [i for step in _ids_by_replica(strategy, data) for r in step for i in r]
    assert seen == list(range(100))
    assert "keeps its batches" in capfd.readouterr().err


def test_a_rebatched_dataset_keeps_its_length():
    data = mk.distribute(
        tf.data.Dataset.range(100).batch(10).map(lambda b: b * 1),
        _strategy(2),
        global_batch_size=32,
        shuffle=False,
    )
    assert (data.steps_per_epoch, data.num_examples, data.dropped_per_epoch) == (3, 100, 4)
    assert int(data.cardinality) == 3


def test_an_uneven_last_batch_is_dropped_in_training_and_kept_when_even():
    uneven = mk.distribute(tf.data.Dataset.range(63).batch(8), _strategy(2))
    assert (uneven.steps_per_epoch, uneven.num_examples, uneven.dropped_per_epoch) == (7, 63, 7)
    even = mk.distribute(tf.data.Dataset.range(62).batch(8), _strategy(2))
    assert (even.steps_per_epoch, even.num_examples, even.dropped_per_epoch) == (8, 62, 0)


def test_fit_on_a_batched_dataset_takes_exactly_its_steps():
    import keras

    strategy = _strategy(2)
    x = np.arange(80, dtype="float32").reshape(40, 2) / 80
    dataset = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(8).map(lambda a, b: (a, b))
    data = mk.distribute(dataset, strategy)
    model = mk.build(
        lambda: _compiled(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])), strategy
    )
    history = model.fit(data, epochs=3, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 3 * 5  # no phantom step per epoch
    assert len(history.history["loss"]) == 3


def _compiled(model):
    model.compile(optimizer="adam", loss="mse")
    return model


# class weights


def test_class_weight_map_missing_is_named(monkeypatch):
    from keras.src.trainers.data_adapters import tf_dataset_adapter

    from mirrorkit import internals

    monkeypatch.delattr(tf_dataset_adapter, "make_class_weight_map_fn")
    with pytest.raises(internals.InternalChangedError, match="make_class_weight_map_fn"):
        mk.distribute(
            (np.ones((8, 2), "float32"), np.zeros(8, "int32")),
            _strategy(2),
            global_batch_size=4,
            class_weight={0: 1.0, 1: 2.0},
        )


@pytest.mark.upstream
def test_class_weight_without_the_repair_is_keras_attribute_error():
    import keras

    from mirrorkit.compat import class_weight

    strategy = _strategy(2)
    model = mk.build(
        lambda: _compiled(keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])), strategy
    )
    data = mk.distribute(
        (np.ones((8, 2), "float32"), np.zeros(8, "int32")), strategy, global_batch_size=4
    )
    class_weight.REPAIR.remove()
    try:
        with pytest.raises(AttributeError, match="has no attribute 'map'") as caught:
            model.fit(data, class_weight={0: 1.0, 1: 2.0}, verbose=0)
    finally:
        class_weight.REPAIR.apply()
    said = f"{type(caught.value).__name__}: {caught.value}"
    assert_quoted_in(
        quoted_block("compat.md", "the same with plain `strategy.experimental_distribute_dataset`"),
        said,
    )


def test_class_weight_on_a_distributed_dataset_is_said_once(monkeypatch, capfd):
    import keras

    monkeypatch.setattr(notices, "_said", set())
    strategy = _strategy(2)
    model = mk.build(
        lambda: _compiled(keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])), strategy
    )
    data = mk.distribute(
        (np.ones((8, 2), "float32"), np.zeros(8, "int32")), strategy, global_batch_size=4
    )
    capfd.readouterr()
    model.fit(data, class_weight={0: 1.0, 1: 2.0}, verbose=0)
    said = capfd.readouterr().err
    assert_quoted_in(quoted_block("compat.md", "distributed. The chief prints:"), said)


# validation_split


def _split_model_and_data():
    strategy = _strategy(2)
    model = mk.build(
        lambda: _compiled(keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])), strategy
    )
    data = mk.distribute(
        (np.ones((8, 2), "float32"), np.zeros((8, 2), "float32")), strategy, global_batch_size=4
    )
    return model, data


def test_validation_split_on_a_distributed_dataset_says_how_to_split():
    model, data = _split_model_and_data()
    with pytest.raises(ValueError, match=r"fit\(validation_split=0.2\) splits") as caught:
        model.fit(data, validation_split=0.2, verbose=0)
    assert_quoted_in(
        quoted_block("compat.md", "the last part as `validation_data`, as Keras takes it:"),
        f"{type(caught.value).__name__}: {caught.value}",
    )


@pytest.mark.upstream
def test_validation_split_without_the_repair_is_keras_value_error():
    from mirrorkit.feeding import validation_split

    model, data = _split_model_and_data()
    validation_split.REPAIR.remove()
    try:
        with pytest.raises(ValueError, match="validation_split") as caught:
            model.fit(data, validation_split=0.2, verbose=0)
    finally:
        validation_split.REPAIR.apply()
    assert_quoted_in(
        quoted_block("compat.md", "raises Keras's error, which"),
        f"{type(caught.value).__name__}: {caught.value}",
    )


def test_a_cache_after_a_shuffle_is_said_in_training(capfd):
    shuffled = tf.data.Dataset.range(64).shuffle(64, seed=0).batch(8).cache()
    mk.distribute(shuffled, _strategy(2), for_eval=True)
    assert "cache()d after it is shuffled" not in capfd.readouterr().err
    mk.distribute(shuffled, _strategy(2))
    assert "every epoch replays the first epoch's order" in capfd.readouterr().err
    notices._said.clear()  # said once per process: let it be said again if it were due
    mk.distribute(tf.data.Dataset.range(64).cache().shuffle(64).batch(8), _strategy(2))
    assert "cache()d after it is shuffled" not in capfd.readouterr().err


def test_a_padded_batch_dataset_is_kept_when_its_batch_is_the_global_one():
    padded = tf.data.Dataset.range(10).map(lambda i: tf.fill([i % 3 + 1], i)).padded_batch(4)
    data = mk.distribute(padded, _strategy(2), for_eval=True)
    assert (data.global_batch_size, data.steps_per_epoch, data.num_examples) == (4, 3, 10)
    rows = [r for batch in data for part in _replica_parts(batch) for r in part.tolist()]
    assert [row[0] for row in rows] == list(range(10))  # padding stays padding, in order


def _replica_parts(batch):
    values = getattr(batch, "values", (batch,))
    return [v.numpy() for v in values]


def test_a_dataset_that_repeats_forever_is_not_said_to_have_an_unknown_length(capfd):
    for batched in (False, True):
        notices._said.clear()
        data = tf.data.Dataset.range(64).repeat()
        data = mk.distribute(data.batch(8) if batched else data, _strategy(2), global_batch_size=8)
        assert data.steps_per_epoch is None
        assert "is unknown" not in capfd.readouterr().err
    notices._said.clear()
    mk.distribute(tf.data.Dataset.range(64).filter(lambda i: i > 2).batch(8), _strategy(2))
    assert "the number of batches in data is unknown" in capfd.readouterr().err


def test_a_partial_batch_a_shuffle_moved_is_dropped_wherever_it_lands():
    strategy = _strategy(2)
    batches = tf.data.Dataset.range(11).batch(4).shuffle(3, seed=1)  # the batch of 3 moves
    data = mk.distribute(batches, strategy)
    assert (data.steps_per_epoch, data.num_examples, data.dropped_per_epoch) == (2, 11, 3)
    for _ in range(4):  # several epochs: the partial batch lands first, last or between
        sizes = [sum(len(part) for part in _replica_parts(batch)) for batch in data]
        assert sizes == [4, 4]


def test_the_inputs_page_quotes_what_mk_distribute_says(monkeypatch, capfd):
    """Each notice and error docs/inputs.md quotes, from the situation the page describes."""
    from _quoted import assert_quoted_in, quoted_block

    page = "inputs.md"
    strategy = _strategy(2)
    ids = np.arange(1000, dtype="int64")

    def said(make):
        monkeypatch.setattr(notices, "_said", set())
        capfd.readouterr()
        try:
            make()
        except ValueError as err:
            print(f"ValueError: {err}")
        return "".join(capfd.readouterr())

    kept = said(lambda: mk.distribute(tf.data.Dataset.from_tensor_slices(ids).batch(64), strategy))
    assert_quoted_in(quoted_block(page, "A dataset whose batches are kept prints"), kept)
    rebatched = said(
        lambda: mk.distribute(
            tf.data.Dataset.from_tensor_slices(ids).batch(63), strategy, global_batch_size=64
        )
    )
    assert_quoted_in(quoted_block(page, "it says that it batched again:"), rebatched)
    padded = tf.data.Dataset.range(100).map(lambda i: tf.fill([i % 3 + 1], i)).padded_batch(32)
    refused = said(lambda: mk.distribute(padded, strategy, global_batch_size=64))
    assert_quoted_in(quoted_block(page, "Asked for another batch size, `mk.distribute`"), refused)
    odd = said(lambda: mk.distribute(ids, strategy, global_batch_size=63))
    assert_quoted_in(quoted_block(page, "is an error that names the nearest ones:"), odd)
    drawn = said(lambda: mk.distribute(ids, strategy, global_batch_size=64))
    assert_quoted_in(quoted_block(page, "A drawn seed is printed"), drawn)
    assert_quoted_in(quoted_block(page, "The last partial global batch is dropped"), drawn)
    uneven = said(
        lambda: mk.distribute(tf.data.Dataset.from_tensor_slices(ids[:999]).batch(64), strategy)
    )
    assert_quoted_in(quoted_block(page, "share evenly is dropped in training"), uneven)
    filtered = tf.data.Dataset.from_tensor_slices(ids).filter(lambda i: i % 2 == 0)
    unknown = said(lambda: mk.distribute(filtered, strategy, global_batch_size=64))
    assert_quoted_in(quoted_block(page, "**A length tf.data cannot know**"), unknown)
    cached = tf.data.Dataset.from_tensor_slices(ids).shuffle(1000, seed=0).batch(64).cache()
    replayed = said(lambda: mk.distribute(cached, strategy))
    assert_quoted_in(quoted_block(page, "In training, `mk.distribute` prints:"), replayed)
    hidden = tf.data.Dataset.from_tensor_slices(ids).batch(8)
    hidden = hidden.flat_map(lambda b: tf.data.Dataset.from_tensors(b))
    unsure = said(lambda: mk.distribute(hidden, strategy, global_batch_size=4, shuffle=False))
    assert_quoted_in(quoted_block(page, "call `.unbatch()` first if each is a batch"), unsure)
