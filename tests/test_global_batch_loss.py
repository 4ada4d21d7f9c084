"""Losses over the whole global batch: `mk.all_gather` and `mk.all_gather_offset`.

An in-batch softmax (each query against every candidate of the batch, the positive on the
diagonal) on N replicas equals one device on the global batch once the candidates are
gathered; without the gather each replica scores only its own part. The keras.io retrieval
example (keras-rs) is tests/keras_io/sequential_retrieval.py; the 2-worker run is in
tests/test_spanning_workers.py.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import mirrorkit as mk

TOLERANCE = 1e-5
BATCH = 16


class InBatchSoftmax(keras.Model):
    """Two towers without biases (a bias on the candidates has no gradient in exact arithmetic,
    only round-off, which Adam would turn into steps); `gather` says whether to gather."""

    def __init__(self, gather=True):
        super().__init__()
        self.gather = gather
        self.query = keras.layers.Dense(4, use_bias=False)
        self.candidate = keras.layers.Dense(4, use_bias=False)
        self.loss_fn = keras.losses.CategoricalCrossentropy(from_logits=True)

    def build(self, input_shape):
        self.query.build(input_shape["query"])
        self.candidate.build(input_shape["candidate"])

    def call(self, inputs):
        return self.query(inputs["query"])

    def compute_loss(self, x, y, y_pred, sample_weight=None, training=True):
        candidates = self.candidate(x["candidate"])
        offset = 0
        if self.gather:
            candidates = mk.all_gather(candidates)
            offset = mk.all_gather_offset(y_pred)
        positives = offset + keras.ops.arange(keras.ops.shape(y_pred)[0])  # the diagonal
        labels = keras.ops.one_hot(positives, keras.ops.shape(candidates)[0])
        scores = keras.ops.matmul(y_pred, keras.ops.transpose(candidates))
        return self.loss_fn(labels, scores, sample_weight)


def data(n=64):
    rng = np.random.default_rng(0)
    return {
        "query": rng.normal(size=(n, 3)).astype("float32"),
        "candidate": rng.normal(size=(n, 5)).astype("float32"),
    }


def fit(strategy, gather=True, epochs=2):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = InBatchSoftmax(gather)
        model.compile(optimizer=keras.optimizers.Adam(0.05))
    inputs = mk.distribute(data(), strategy, global_batch_size=BATCH, shuffle=False)
    history = model.fit(inputs, epochs=epochs, verbose=0).history
    return model, [float(v) for v in history["loss"]]


def largest_difference(one, two):
    return max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(one.get_weights(), two.get_weights(), strict=True)
    )


@pytest.mark.parametrize("replicas", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_an_in_batch_softmax_with_gathered_candidates_trains_as_one_device(replicas):
    one, one_loss = fit(mk.strategy("one_device"))
    many, many_loss = fit(mk.strategy(cpu_replicas=replicas))
    np.testing.assert_allclose(many_loss, one_loss, atol=TOLERANCE)
    assert largest_difference(one, many) <= TOLERANCE


@pytest.mark.slow
def test_without_the_gather_each_replica_compares_only_its_own_examples():
    """What the gather is for: the same model ungathered is far from one device (an easier
    softmax over 8 candidates instead of 16: a lower loss)."""
    one, one_loss = fit(mk.strategy("one_device"))
    two, two_loss = fit(mk.strategy(cpu_replicas=2), gather=False)
    assert two_loss[0] < one_loss[0] - 0.3
    assert largest_difference(one, two) > 1e-2


@pytest.mark.slow
def test_evaluate_with_unequal_parts_puts_each_replicas_rows_at_its_offset():
    """37 examples in batches of 16: the last batch of 5 splits 3 and 2 between the replicas,
    so the offset of replica 1 is 3, not 5 / 2; evaluate equals one device's."""
    x = data(37)
    results = []
    for strategy in (mk.strategy("one_device"), mk.strategy(cpu_replicas=2)):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = InBatchSoftmax()
            model.compile(optimizer="adam")
            model.build({"query": (None, 3), "candidate": (None, 5)})
        model.set_weights([np.full(w.shape, 0.1 * (i + 1), "float32") * np.arange(
            w.size, dtype="float32").reshape(w.shape) / w.size
            for i, w in enumerate(model.get_weights())])  # fmt: skip
        inputs = mk.distribute(x, strategy, global_batch_size=BATCH, for_eval=True)
        results.append(model.evaluate(inputs, verbose=0, return_dict=True)["loss"])
    np.testing.assert_allclose(results[1], results[0], atol=TOLERANCE)


def test_one_replica_and_no_strategy_return_the_value_itself():
    value = tf.constant([[1.0, 2.0], [3.0, 4.0]])
    assert mk.all_gather(value) is value
    assert int(mk.all_gather_offset(value)) == 0
    strategy = mk.strategy("one_device")
    with strategy.scope():
        out = strategy.run(lambda: (mk.all_gather(value), mk.all_gather_offset(value)))
    np.testing.assert_array_equal(out[0], value)
    assert int(out[1]) == 0


def test_gathering_a_structure_in_a_custom_loop_keeps_the_global_order():
    strategy = mk.strategy(cpu_replicas=2)
    rows = np.arange(8, dtype="float32").reshape(4, 2)
    inputs = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices(rows).batch(4)
    )

    @tf.function
    def gather(batch):
        def replica(part):
            return mk.all_gather({"a": part, "b": part * 10}), mk.all_gather_offset(part)

        return strategy.run(replica, args=(batch,))

    gathered, offsets = gather(next(iter(inputs)))
    for local in strategy.experimental_local_results(gathered["a"]):
        np.testing.assert_array_equal(local, rows)  # replica 0's rows first
    np.testing.assert_array_equal(strategy.experimental_local_results(gathered["b"])[1], rows * 10)
    assert [int(o) for o in strategy.experimental_local_results(offsets)] == [0, 2]


def test_called_outside_the_step_it_says_where_to_call_it():
    strategy = mk.strategy(cpu_replicas=2)
    with strategy.scope(), pytest.raises(RuntimeError, match="outside the training step"):
        mk.all_gather(tf.constant([1.0]))
