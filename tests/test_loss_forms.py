"""Every loss form Keras accepts trains on N replicas as on one device (docs: own-train-step/).

The forms (`_loss_forms.FORMS`): a compiled loss with each reduction, a ``compute_loss`` that
returns a scalar sum or a per-example vector, ``add_loss`` terms that are batch means,
per-example sums or weight penalties, and custom ``train_step``s taking ``tape.gradient`` of
a mean, a sum, a vector, a mean plus a sum, and a sum divided by the global batch
(TensorFlow's custom-loop recipe). Before `mirrorkit.compat.one_device_tape`, the sums
trained at 1/N of one device's gradient on N replicas. The reader of loss forms is checked
on its own first, op by op, without training.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from _loss_forms import NAMES, differences, train, train_plain
from _quoted import assert_quoted_in, quoted_block
from keras import ops

import mirrorkit as mk
from mirrorkit import compat, versions
from mirrorkit.compat import loss_reader, loss_terms, one_device_tape

TOLERANCE = 1e-5
#: Keras before 3.15 (the tested 3.10), where the docs' table says plain Keras differs.
OLD_KERAS = versions.parse(keras.__version__) < (3, 15)


def _relative(found):
    """Weights and values above 1 compared relatively (float32 keeps about 7 digits)."""
    return {k: v for k, v in found.items() if v > TOLERANCE}


# -- the reader, op by op -----------------------------------------------------------------

_WEIGHTS = np.ones((3, 2), "float32")


def _per_example(x):
    return ops.mean(ops.square(ops.matmul(x, _WEIGHTS)), axis=-1)


#: expression of the batch x (8 examples of 3 values) -> the form mirrorkit must read.
EXPRESSIONS = {
    "ops.mean of per-example values": (lambda x: ops.mean(_per_example(x)), "mean"),
    "ops.sum of per-example values": (lambda x: ops.sum(_per_example(x)), "sum"),
    "a per-example vector": (_per_example, "batch"),
    "mean of sums over features": (lambda x: ops.mean(ops.sum(ops.square(x), axis=1)), "mean"),
    "sum of every value": (lambda x: ops.sum(ops.square(x)), "sum"),
    "sum / static batch size": (lambda x: ops.sum(_per_example(x)) / ops.shape(x)[0], "mean"),
    "sum / global batch size": (lambda x: ops.sum(_per_example(x)) / 16.0, "sum"),
    "sum of every value / its count": (lambda x: ops.sum(ops.square(x)) / 24.0, "mean"),
    "0.5 * sum": (lambda x: 0.5 * ops.sum(_per_example(x)), "sum"),
    "a weight penalty": (lambda x: 0.01 * ops.sum(ops.square(_WEIGHTS)), "const"),
    "mean + weight penalty": (
        lambda x: ops.mean(_per_example(x)) + ops.sum(ops.square(_WEIGHTS)),
        "mean",
    ),
    "mean + sum": (lambda x: ops.mean(_per_example(x)) + ops.sum(_per_example(x)), "mixed"),
    "root mean square": (lambda x: ops.sqrt(ops.mean(_per_example(x))), "nonlinear"),
    "softmax across the examples": (
        lambda x: ops.mean(ops.log_softmax(ops.transpose(ops.matmul(x, _WEIGHTS)))),
        "unknown",
    ),
    "a transposed batch, summed": (lambda x: ops.sum(ops.transpose(x)), "sum"),
    "x[:, 0], averaged": (lambda x: ops.mean(x[:, 0]), "mean"),
    "x[:4], averaged": (lambda x: ops.mean(x[:4]), "unknown"),
    "the examples concatenated twice, summed": (
        lambda x: ops.sum(ops.concatenate([x, x], axis=0)),
        "sum",
    ),
    "the Gram matrix of the batch, summed": (
        lambda x: ops.sum(ops.matmul(ops.transpose(x), x)),
        "sum",
    ),
    "this replica's examples against its own, a softmax over them": (
        lambda x: ops.mean(ops.log_softmax(ops.matmul(x, ops.transpose(x)), axis=-1)),
        "unknown",
    ),
    "a cumulative sum along the batch, averaged": (
        lambda x: ops.mean(ops.cumsum(x, axis=0)),
        "unknown",
    ),
    "a cumulative sum along the features, averaged": (
        lambda x: ops.mean(ops.cumsum(x, axis=1)),
        "mean",
    ),
    "the batch against itself rolled by one": (
        lambda x: ops.mean(ops.square(x - ops.roll(x, 1, axis=0))),
        "unknown",
    ),
    "the top 2 examples of each feature": (
        lambda x: ops.mean(ops.top_k(ops.transpose(x), 2)[0]),
        "unknown",
    ),
    "einsum: each example against this replica's": (
        lambda x: ops.mean(ops.log_softmax(ops.einsum("bd,cd->cb", x, x), axis=0)),
        "unknown",
    ),
    "einsum: each example times this replica's, elementwise": (
        lambda x: ops.mean(ops.einsum("bd,cd->bcd", x, x)),
        "unknown",
    ),
    "einsum: a per-example dot product, averaged": (
        lambda x: ops.mean(ops.einsum("bd,bd->b", x, x)),
        "mean",
    ),
    "einsum: a sum over the examples of outer products": (
        lambda x: ops.sum(ops.einsum("bd,be->de", x, x)),
        "sum",
    ),
    "sum / the count of ones like the examples": (
        lambda x: ops.sum(_per_example(x)) / ops.sum(ops.ones_like(_per_example(x))),
        "mean",
    ),
    "an embedding lookup of ids": (
        lambda x: ops.sum(ops.take(_WEIGHTS, ops.cast(x[:, 0] > 0, "int32"), axis=0)),
        "sum",
    ),
}


@pytest.mark.parametrize("name", list(EXPRESSIONS))
def test_the_reader_reads_each_form(name):
    expression, expected = EXPRESSIONS[name]
    found = []

    @tf.function(input_signature=[tf.TensorSpec([8, 3], tf.float32)])
    def step(x):
        loss = expression(x)
        reader = loss_reader.Reader(tf.compat.v1.get_default_graph(), {x.name})
        found.append(reader.read(loss))
        return loss

    step.get_concrete_function()
    assert found[0].kind == expected, f"{name}: read {found[0]}"


def test_a_dynamic_batch_size_divides_a_sum_into_a_mean():
    found = []

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def step(x):
        per_example = _per_example(x)
        reader = loss_reader.Reader(tf.compat.v1.get_default_graph(), {x.name})
        size = ops.cast(ops.shape(x)[0], "float32")
        found.append(reader.read(ops.sum(per_example) / size))
        found.append(reader.read(ops.sum(per_example)))
        # noise drawn to the batch's shape: one value per example, summed a sum
        noise = tf.random.uniform(tf.shape(per_example))
        found.append(reader.read(ops.sum(noise * ops.mean(per_example))))
        found.append(reader.read(ops.sum(per_example) / ops.sum(ops.ones_like(per_example))))
        return per_example

    step.get_concrete_function()
    assert [form.kind for form in found] == ["mean", "sum", "sum", "mean"]


def test_a_mixed_loss_is_split_into_terms_of_one_form_each():
    found = []

    @tf.function(input_signature=[tf.TensorSpec([8, 3], tf.float32)])
    def step(x):
        per_example = _per_example(x)
        loss = 2.0 * (ops.mean(per_example) - 0.5 * ops.sum(per_example))
        reader = loss_reader.Reader(tf.compat.v1.get_default_graph(), {x.name})
        terms, form = loss_terms.weighted_terms(reader, loss)
        found.append((form.kind, sorted(f.kind for _, _, f in terms)))
        return loss

    step.get_concrete_function()
    assert found == [("mixed", ["mean", "sum"])]


# -- every form, trained ------------------------------------------------------------------


@pytest.fixture(scope="module")
def strategies():
    return mk.strategy("one_device"), mk.strategy(cpu_replicas=2)


@pytest.fixture(scope="module")
def one_device(strategies):
    """Each form's one-device run, trained once for the module's tests: ``one_device(name)``."""
    runs = {}

    def run(name):
        if name not in runs:
            runs[name] = train(strategies[0], name)
        return runs[name]

    return run


@pytest.mark.slow  # 15 pairs of fits, about 25 s
@pytest.mark.parametrize("name", NAMES)
def test_every_loss_form_trains_as_one_device(name, strategies, one_device):
    one, two = one_device(name), train(strategies[1], name)
    found = differences(one, two, name)
    found["loss"] = found.get("loss", 0.0) / max(1.0, max(abs(v) for v in one["loss"]))
    assert _relative(found) == {}, f"{name}: {found}"


@pytest.mark.upstream
def test_summed_losses_train_at_half_the_gradient_upstream(strategies):
    """Without the loss-form repairs, mirrorkit's averaging trains a sum over the batch at 1/N
    of one device's gradient: a per-example vector, an ops.sum, an add_loss of a sum. If this
    stops failing, retire the one_device_tape repairs."""
    one_device, replicas = strategies
    for repair in one_device_tape.REPAIRS:
        repair.remove()
    try:
        for name in ("train_step vector", "train_step sum", "add_loss sum"):
            found = differences(train(one_device, name), train(replicas, name), name)
            assert found["weights"] > 1e-3, f"{name}: {found}"
    finally:
        compat.enable()


#: Each loss repair's canary: the loss form that fails once that repair alone is taken off,
#: and what differs from one device then (found by taking each off alone over every form).
ALONE = {
    "one_device_compute_loss": ("compute_loss sum", "loss"),
    "one_device_loss_scale": ("compiled sum_over_batch_size", "weights"),
    "one_device_loss_unscale": ("compiled sum_over_batch_size", "loss"),
    "one_device_reduction": ("compiled sum_over_batch_size", "weights"),
    "one_device_step": ("train_step mean", "weights"),
    "one_device_tape": ("train_step vector", "weights"),
    "one_device_additional_loss": ("train_step compute_loss with add_loss sum", "loss"),
    "one_device_regularization_loss": ("train_step TF recipe with kernel_regularizer", "loss"),
}


@pytest.mark.upstream
@pytest.mark.parametrize("repair", sorted(ALONE))
def test_a_loss_repair_taken_off_alone_fails_as_keras_does_upstream(repair, strategies, one_device):
    """Each repair of a loss, taken off alone: its form trains or logs unlike one device."""
    from mirrorkit.patching import catalogue

    name, differs = ALONE[repair]
    taken = catalogue.named(repair)
    taken.remove()
    try:
        found = differences(one_device(name), train(strategies[1], name), name)
    finally:
        taken.apply()
    assert found[differs] > 1e-3, (
        f"{repair}: with it off alone, '{name}' trains as one device on Keras "
        f"{keras.__version__} ({found}): retire the repair"
    )


def test_a_sum_is_said_once_and_an_unreadable_loss_is_said_with_the_fix(
    strategies, capfd, monkeypatch
):
    from mirrorkit import notices

    monkeypatch.setattr(notices, "_said", set())  # said again, whatever ran before
    one_device, replicas = strategies
    train(replicas, "train_step vector", epochs=1)
    said = capfd.readouterr().err
    assert "a loss given to tape.gradient" in said
    assert "is one value per example (its gradient is that of their sum): mirrorkit sums" in said

    class RootMeanSquare(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = ops.sqrt(ops.mean(ops.square(self(x, training=True) - y)))
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables, strict=True))
            return {"loss": loss}

    with replicas.scope():
        inputs = keras.Input((4,))
        model = RootMeanSquare(inputs, keras.layers.Dense(1)(inputs))
        model.compile(optimizer="sgd")
    x, y = np.ones((32, 4), "float32"), np.zeros((32, 1), "float32")
    model.fit(mk.distribute((x, y), replicas, global_batch_size=16), epochs=1, verbose=0)
    said = capfd.readouterr().err
    assert_quoted_in(
        quoted_block("compat.md", "device's gradient only for a mean, and the notice"), said
    )
    from mirrorkit.equivalence import suspects

    found = suspects.find(model)
    assert any("nonlinear" in form for _, form in found["loss_forms"]), found
    assert any("cannot read" in line for line in suspects.describe(found))

    class LocalNegatives(RootMeanSquare):
        """In-batch negatives without mk.all_gather: each example against its replica's."""

        def train_step(self, data):
            x, _ = data
            with tf.GradientTape() as tape:
                z = self(x, training=True)
                scores = ops.matmul(z, ops.transpose(z))
                labels = ops.arange(ops.shape(z)[0])
                loss = ops.mean(
                    keras.losses.sparse_categorical_crossentropy(labels, scores, from_logits=True)
                )
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables, strict=True))
            return {"loss": loss}

    with replicas.scope():
        inputs = keras.Input((4,))
        model = LocalNegatives(inputs, keras.layers.Dense(3)(inputs))
        model.compile(optimizer="sgd")
    model.fit(mk.distribute((x, y), replicas, global_batch_size=16), epochs=1, verbose=0)
    said = capfd.readouterr().err
    # the notice names the op the reader could not read past: the local similarity matrix
    assert "a loss given to tape.gradient" in said, said
    assert "made by operations mirrorkit cannot read" in said, said
    assert "unreadable from" in said and "(MatMul)" in said, said


# -- the docs' table --------------------------------------------------------------------------

#: own-train-step.md's table of loss forms: how each row's first cell begins -> its forms.
TABLE_ROWS = {
    "`compile(loss=...)`, a `keras.losses` object": (
        "compiled sum_over_batch_size",
        "compiled sum",
    ),
    "`compile(loss=...)` with `reduction=None`": ("compiled none", "compute_loss vector"),
    "a `compute_loss` that returns `ops.sum(...)`": ("compute_loss sum",),
    "`add_loss(ops.mean(...))`": ("add_loss mean",),
    "`add_loss(rate * ops.sum": ("add_loss sum",),
    '`compile(loss=...)` with `reduction="mean_with_sample_weight"`': (
        "compiled mean_with_sample_weight",
    ),
    "`compile(loss=fn)`, where `fn` returns": ("compiled function returning a sum",),
    "a `compute_loss` that returns `ops.mean(...) + ": ("compute_loss mean + sum",),
    "`kernel_regularizer=`": ("kernel_regularizer",),
    "`activity_regularizer=`": ("activity_regularizer",),
    "your own `train_step`: `tape.gradient` of `ops.mean(...)`, or": (
        "train_step mean",
        "train_step sum / batch size",
    ),
    "your own `train_step`: `tape.gradient` of `ops.sum(...)`, or": (
        "train_step sum",
        "train_step vector",
    ),
    "your own `train_step`: `tape.gradient` of `ops.mean(...) + ": ("train_step mean + sum",),
    "your own `train_step`: `tape.gradient` of `ops.sum(...) / global": (
        "train_step sum / global batch",
    ),
    "your own `train_step`: `tape.gradient` of `self.compute_loss(...)`": (
        "train_step compute_loss with add_loss sum",
    ),
    "your own `train_step`: `tape.gradient` of `tf.nn.compute_average_loss(...) + ": (
        "train_step TF recipe with kernel_regularizer",
    ),
}


def _table_rows():
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "own-train-step.md").read_text()
    section = text.split("## Loss forms", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][2:]
    cells = [[c.strip() for c in row.strip("|").split(" | ")] for row in rows]
    return {next(k for k in TABLE_ROWS if c[0].startswith(k)): c for c in cells}


@pytest.mark.slow  # 15 fits under plain MirroredStrategy, about 20 s
def test_the_docs_table_of_loss_forms_says_what_plain_mirrored_strategy_gives(one_device):
    rows = _table_rows()
    assert set(rows) == set(TABLE_ROWS), "a row of the table matches no key, or two"
    assert sorted(f for forms in TABLE_ROWS.values() for f in forms) == sorted(NAMES)
    plain = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
    for key, (_, says, with_mirrorkit) in rows.items():
        assert with_mirrorkit.startswith("one device's gradient"), key
        for name in TABLE_ROWS[key]:
            one = one_device(name)
            got = train_plain(plain, name)
            weights = max(
                float(np.abs(a - b).max())
                for a, b in zip(one["weights"], got["weights"], strict=True)
            )
            differs = says.startswith("not one device's") or (
                OLD_KERAS and "Keras 3.10: not one device's" in says
            )
            assert (weights > 1e-3) == differs, (name, weights, says)
            if differs:
                continue
            if "logs N times" in says:
                np.testing.assert_allclose(got["loss"], [2 * v for v in one["loss"]], rtol=1e-5)
            elif "logged loss" in says:
                np.testing.assert_allclose(got["loss"], one["loss"], rtol=1e-5)


# -- on two workers -----------------------------------------------------------------------


def loss_forms_on_workers(strategy):
    """In each worker of the session's shared 2-worker job (`two_worker_job`)."""
    from _loss_forms import train_all

    assert type(strategy).__name__ == "CollectiveAllReduceStrategy"
    return train_all(strategy)


@pytest.mark.multiprocess
def test_loss_forms_on_two_workers_train_as_one_device(two_worker_job, one_device):
    workers = [scenarios["loss_forms"] for scenarios in two_worker_job]
    for name in NAMES:
        one = one_device(name)
        for worker, runs in enumerate(workers):
            found = differences(one, runs[name], name)
            found["loss"] = found.get("loss", 0.0) / max(1.0, max(abs(v) for v in one["loss"]))
            assert _relative(found) == {}, f"{name} on worker {worker}: {found}"
