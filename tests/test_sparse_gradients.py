"""Sparse gradients on several replicas reach the optimizer as one device's would.

Keras's sparse matmul (a Dense layer on a sparse input) gives one gradient slice per id of the
batch; TensorFlow's all-reduce concatenates the replicas' slices, and Adam-like optimizers square
each slice on its own. `mirrorkit.compat.gradient_sums` merges them to one slice per id,
as one device has them; an Embedding lookup keeps one slice per occurrence, on one device too.
`mk.distribute` takes `tf.SparseTensor` features as fit does.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import mirrorkit as mk
from mirrorkit.compat import gradient_sums

TOLERANCE = 1e-5
BATCH = 16
FEATURES = 20

OPTIMIZERS = {
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.01),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.01),
    "adagrad": lambda: keras.optimizers.Adagrad(0.1),
}


def multi_hot(n=64, seed=0):
    """What TextVectorization(output_mode="multi_hot", sparse=True) makes: sparse 0/1 rows."""
    rng = np.random.default_rng(seed)
    dense = (rng.random((n, FEATURES)) < 0.2).astype("float32")
    labels = rng.integers(0, 2, size=(n, 3)).astype("float32")
    return tf.sparse.from_dense(dense), labels


def make_sparse_model(optimizer="adam"):
    inputs = keras.Input((FEATURES,), sparse=True)
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(3)(hidden))
    model.compile(
        optimizer=OPTIMIZERS[optimizer](),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
        metrics=["binary_accuracy"],
    )
    _fixed_weights(model)
    return model


def _fixed_weights(model):
    rng = np.random.default_rng(7)
    model.set_weights(
        [rng.normal(scale=0.5, size=w.shape).astype("float32") for w in model.get_weights()]
    )


def fit(strategy, make_model, data, as_tf_data=False, epochs=2):
    with strategy.scope():
        model = make_model()
    if as_tf_data:
        inputs = tf.data.Dataset.from_tensor_slices(data).batch(BATCH)
    else:
        inputs = mk.distribute(data, strategy, global_batch_size=BATCH, shuffle=False)
    history = model.fit(inputs, epochs=epochs, verbose=0).history
    return model, {k: [float(v) for v in vs] for k, vs in history.items()}


def largest_difference(one, two):
    return max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(one.get_weights(), two.get_weights(), strict=True)
    )


def assert_as_one_device(make_model, data, **fit_args):
    one_model, one_history = fit(mk.strategy("one_device"), make_model, data, **fit_args)
    two_model, two_history = fit(mk.strategy(cpu_replicas=2), make_model, data, **fit_args)
    assert two_model.optimizer.iterations.numpy() == one_model.optimizer.iterations.numpy()
    for key, values in one_history.items():
        np.testing.assert_allclose(two_history[key], values, atol=TOLERANCE, err_msg=key)
    difference = largest_difference(one_model, two_model)
    assert difference <= TOLERANCE, f"weights {difference:.3g} from one device"
    return one_model, two_model


def _quick_only(name):
    """The quick set (pytest -m "not slow", under 2 minutes) keeps Adam's case."""
    marks = {o: [] if o == name else [pytest.mark.slow] for o in OPTIMIZERS}
    return [pytest.param(o, marks=marks[o]) for o in sorted(OPTIMIZERS)]


@pytest.mark.parametrize("optimizer", _quick_only("adam"))
def test_a_dense_layer_on_sparse_inputs_trains_as_one_device(optimizer):
    assert_as_one_device(lambda: make_sparse_model(optimizer), multi_hot(), as_tf_data=True)


@pytest.mark.slow
def test_mk_distribute_takes_sparse_features_and_trains_as_one_device():
    assert_as_one_device(make_sparse_model, multi_hot())


def make_embedding_model(optimizer="adam"):
    model = keras.Sequential(
        [
            keras.Input((4,), dtype="int32"),
            keras.layers.Embedding(10, 3),
            keras.layers.Flatten(),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=OPTIMIZERS[optimizer](), loss="mse")
    _fixed_weights(model)
    return model


def repeated_ids(n=64):
    """Ids 0-9, so every id repeats within each replica's 8 rows and across the replicas."""
    rng = np.random.default_rng(3)
    return rng.integers(0, 10, size=(n, 4)).astype("int32"), rng.normal(size=(n, 1)).astype(
        "float32"
    )


@pytest.mark.parametrize("optimizer", _quick_only("adam"))
def test_embedding_ids_repeated_within_and_across_replicas_train_as_one_device(optimizer):
    assert_as_one_device(lambda: make_embedding_model(optimizer), repeated_ids())


def _gradients(model, x, y):
    """Whether each gradient is summed per id, read in the traced step (as fit traces it)."""
    found = []

    @tf.function(autograph=False)  # as Keras traces it (the 3.16 nightly's autograph trips on it)
    def gradients():
        with tf.GradientTape() as tape:
            loss = keras.losses.mean_squared_error(y, model(x))
        grads = tape.gradient(loss, model.trainable_variables)
        found.extend(gradient_sums.summed_per_id(g) for g in grads)

    gradients()
    return found


def test_a_sparse_matmuls_slices_are_told_from_an_embeddings():
    x, _ = multi_hot(8)
    assert _gradients(make_sparse_model(), x, tf.zeros((8, 3)))[:2] == [True, False]
    ids, y = repeated_ids(8)
    assert _gradients(make_embedding_model(), ids, y)[0] is False


def test_sparse_features_shuffled_and_for_eval_keep_every_row():
    x, y = multi_hot(40)
    strategy = mk.strategy(cpu_replicas=2)
    dense = tf.sparse.to_dense(x).numpy()
    ordered = mk.distribute((x, y), strategy, global_batch_size=BATCH, for_eval=True)
    rows = []
    for features, _ in ordered:
        for part in strategy.experimental_local_results(features):
            rows.append(tf.sparse.to_dense(part).numpy())
    np.testing.assert_array_equal(np.concatenate(rows), dense)  # all 40, in order
    shuffled = mk.distribute((x, y), strategy, global_batch_size=BATCH, seed=1)
    seen = []
    for features, _ in shuffled:
        for part in strategy.experimental_local_results(features):
            seen.append(tf.sparse.to_dense(part).numpy())
    seen = np.concatenate(seen)
    assert len(seen) == 32  # 2 whole global batches; the remainder of 8 dropped
    as_rows = {row.tobytes() for row in dense}
    assert all(row.tobytes() in as_rows for row in seen)
    assert not np.array_equal(seen, dense[:32])  # shuffled


@pytest.mark.slow
def test_sparse_features_through_a_preprocess_function_read_one_row_at_a_time():
    x, y = multi_hot(32)
    strategy = mk.strategy(cpu_replicas=2)
    doubled = mk.distribute(
        (x, y), strategy, global_batch_size=BATCH, shuffle=False,
        preprocess=lambda f, label: (f * 2.0, label),
    )  # fmt: skip
    first, _ = next(iter(doubled))
    part = tf.sparse.to_dense(strategy.experimental_local_results(first)[0]).numpy()
    np.testing.assert_array_equal(part, 2 * tf.sparse.to_dense(x).numpy()[:8])


@pytest.mark.upstream
def test_keras_alone_squares_each_replicas_slice():
    """Without the merge, Adam adds g1**2 + g2**2 where one device adds (g1 + g2)**2. If this
    stops failing, TensorFlow merges the slices itself: retire the merge."""
    data = multi_hot()
    one, _ = fit(mk.strategy("one_device"), make_sparse_model, data, as_tf_data=True)
    strategy = mk.strategy(cpu_replicas=2)
    merge = gradient_sums.summed_per_id
    gradient_sums.summed_per_id = lambda gradient: False
    try:
        two, _ = fit(strategy, make_sparse_model, data, as_tf_data=True)
    finally:
        gradient_sums.summed_per_id = merge
    assert largest_difference(one, two) > 1e-4
