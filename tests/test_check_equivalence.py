"""`mk.check_equivalence`: a clean model passes; each recognised cause is named when planted."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from _quoted import assert_quoted_in, quoted_block

import mirrorkit as mk
from mirrorkit.equivalence import suspects

rng = np.random.default_rng(0)
X = rng.random((64, 6)).astype("float32")
Y = rng.random((64, 1)).astype("float32")
CHECK = dict(replicas=(1, 2), steps=3, batch_size=16)


def _layers(*middle):
    return [
        keras.Input((6,)),
        keras.layers.Dense(4, activation="tanh"),
        *middle,
        keras.layers.Dense(1),
    ]


def clean_model():
    model = keras.Sequential(_layers())
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


def batch_norm_model():
    """`_layers` around a BatchNormalization, named as in a fresh session (scale.md quotes it)."""
    first, last = (
        keras.layers.Dense(4, activation="tanh", name="dense"),
        keras.layers.Dense(1, name="dense_1"),
    )
    norm = keras.layers.BatchNormalization(name="batch_normalization")
    model = keras.Sequential([keras.Input((6,)), first, norm, last], name="sequential")
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


def summed_loss_model():
    model = keras.Sequential(_layers())
    model.compile(
        optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.MeanSquaredError(reduction="sum")
    )
    return model


def dropout_model():
    model = keras.Sequential(_layers(keras.layers.Dropout(0.5)))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


class SummingStep(keras.Sequential):
    """Averages over its own replica's batch by hand (ops.mean), as keras.io steps do."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.ops.square(self(x, training=True) - y))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        return {"loss": loss}


def custom_step_model():
    model = SummingStep(_layers())
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


class GuideStep(keras.Sequential):
    """The train_step of the keras.io guide "Customizing what happens in fit()"."""

    unscale = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        self.loss_tracker.update_state(mk.unscale_loss(loss) if self.unscale else loss)
        return {"loss": self.loss_tracker.result()}

    @property
    def metrics(self):
        return [self.loss_tracker]


class UnscaledGuideStep(GuideStep):
    unscale = True


def guide_step_model(cls=GuideStep):
    model = cls(_layers())
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


class UnseededNoise(keras.layers.Layer):
    def call(self, x, training=None):
        return x + tf.random.uniform(tf.shape(x), maxval=0.1)  # no seed: differs every run


def noisy_model():
    model = keras.Sequential(_layers(UnseededNoise()))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


def gru_model():
    """A GRU keeps a seed generator for dropout; with dropout=0 it draws nothing."""
    layers = [keras.layers.Reshape((3, 2)), keras.layers.GRU(4), keras.layers.Dense(1)]
    model = keras.Sequential([keras.Input((6,)), *layers])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


class InBatch(keras.Model):
    """An in-batch softmax over x's two halves (queries, candidates); `gather` or not."""

    gather = False

    def __init__(self):
        super().__init__()
        self.query = keras.layers.Dense(3, use_bias=False)
        self.candidate = keras.layers.Dense(3, use_bias=False)
        self.loss_fn = keras.losses.CategoricalCrossentropy(from_logits=True)

    def build(self, input_shape):
        self.query.build((None, 3))
        self.candidate.build((None, 3))

    def call(self, x):
        return self.query(x[:, :3])

    def compute_loss(self, x, y, y_pred, sample_weight=None, training=True):
        candidates = self.candidate(x[:, 3:])
        offset = 0
        if self.gather:
            candidates, offset = mk.all_gather(candidates), mk.all_gather_offset(y_pred)
        positives = offset + keras.ops.arange(keras.ops.shape(y_pred)[0])
        labels = keras.ops.one_hot(positives, keras.ops.shape(candidates)[0])
        return self.loss_fn(labels, keras.ops.matmul(y_pred, keras.ops.transpose(candidates)))


class GatheringInBatch(InBatch):
    gather = True


def in_batch_model(cls=InBatch):
    model = cls()
    model.compile(optimizer=keras.optimizers.SGD(0.5))
    return model


def _suspects(model_fn):
    keras.backend.clear_session()  # layer names from 0 (dropout, not dropout_2) whatever ran
    with mk.strategy(cpu_replicas=2).scope():
        return suspects.describe(suspects.find(model_fn()))


@pytest.mark.parametrize(
    "model_fn, named",
    [
        (clean_model, None),
        (batch_norm_model, "BatchNormalization(synchronized=True)"),
        (summed_loss_model, None),  # inside fit a summed loss is one device's global sum
        (dropout_model, "random layers: dropout (Dropout)"),
        (custom_step_model, "custom train_step (SummingStep.train_step)"),
        (gru_model, None),  # a seed generator, but dropout=0: it draws nothing
        (in_batch_model, "custom compute_loss (InBatch.compute_loss)"),
    ],
)
def test_each_suspect_is_recognised(model_fn, named):
    found = _suspects(model_fn)
    if named is None:
        assert found == []
    else:
        assert len(found) == 1 and named in found[0]


@pytest.mark.multiprocess  # mk.check_equivalence trains in fresh processes
def test_a_clean_model_passes():
    report = mk.check_equivalence(clean_model, (X, Y), **CHECK)
    assert report.passed, str(report)
    assert report.largest(2) < 1e-5 and report.causes == []
    assert len(report.differences[2]) == 2  # the two Dense layers
    assert "equivalence PASSED" in str(report) and "PASSED" in report._repr_html_()


@pytest.mark.multiprocess  # mk.check_equivalence trains in fresh processes
@pytest.mark.parametrize(
    "model_fn, named",
    [
        (batch_norm_model, "batch norm without synchronisation"),
        (noisy_model, "non-deterministic or unseeded random ops"),
    ],
)
def test_a_planted_cause_fails_and_is_named(model_fn, named):
    report = mk.check_equivalence(model_fn, (X, Y), **CHECK)
    assert not report.passed
    assert any(named in cause for cause in report.causes), str(report)
    assert "equivalence FAILED" in str(report) and named in str(report)
    if model_fn is batch_norm_model:
        quote = quoted_block("scale.md", "on a model with an unsynchronised `BatchNormalization`")
        assert_quoted_in(quote, str(report))


@pytest.mark.multiprocess  # mk.check_equivalence trains in fresh processes
def test_an_in_batch_loss_fails_and_names_compute_loss_until_it_gathers():
    report = mk.check_equivalence(in_batch_model, (X, Y), **CHECK)
    assert not report.passed
    assert any("custom compute_loss (InBatch.compute_loss)" in c for c in report.causes), str(
        report
    )
    assert "mk.all_gather" in str(report)
    quote = quoted_block("own-train-step.md", "`mk.check_equivalence` names an overridden")
    assert_quoted_in(quote, str(report))
    gathered = mk.check_equivalence(lambda: in_batch_model(GatheringInBatch), (X, Y), **CHECK)
    assert gathered.passed, str(gathered)


@pytest.mark.multiprocess  # mk.check_equivalence trains in fresh processes
def test_custom_train_steps_that_average_by_hand_or_log_keras_losses_pass():
    """Inside fit every loss is one device's: a step that reduces by hand trains as one device
    (it differed by 0.195 before), and the guide's step logs one device's loss (it read half)."""
    for model_fn in (custom_step_model, guide_step_model):
        report = mk.check_equivalence(model_fn, (X, Y), **CHECK)
        assert report.passed, str(report)
        assert report.largest(2) < 1e-5 and report.log_differences == {}


def test_the_guide_step_logs_one_device_loss_and_is_told_so(capfd):
    strategy = mk.strategy(cpu_replicas=2)
    data = mk.distribute((X, Y), strategy, global_batch_size=16, shuffle=False)
    logged = {}
    for name, make in (
        ("keras", clean_model),
        ("guide", guide_step_model),
        ("unscaled", lambda: guide_step_model(UnscaledGuideStep)),  # earlier mirrorkit's advice
    ):
        keras.utils.set_random_seed(0)
        model = mk.build(make, strategy)
        logged[name] = model.fit(data, epochs=1, verbose=0).history["loss"][0]
    assert logged["guide"] == pytest.approx(logged["keras"], rel=1e-5)
    assert logged["unscaled"] == pytest.approx(logged["keras"], rel=1e-5)
    err = capfd.readouterr().err
    assert "GuideStep overrides train_step: inside fit, mirrorkit makes every loss one " in err
    assert_quoted_in(quoted_block("compat.md", "for a class named `GuideStep`"), err)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(model_fn=clean_model()), "Pass make_model, not make_model()"),
        (dict(data=X), r"data must be an \(x, y\) tuple"),
        (dict(data=(X, Y[:10])), "same number of examples"),
        (dict(replicas=(2,)), "at least two different positive replica counts"),
        (dict(replicas=(1, 1)), "at least two different positive replica counts"),
        (dict(replicas=(1, 3)), r"batch_size=16 does not split evenly over \[3\] replicas"),
        (dict(steps=0), "steps must be a positive integer"),
        (dict(tolerance=0), "tolerance must be a positive number"),
        (dict(data=(X[:8], Y[:8])), "fewer examples than one global batch of 16"),
    ],
)
def test_bad_arguments_say_what_was_wrong(kwargs, message):
    args = dict(model_fn=clean_model, data=(X, Y), **CHECK)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        mk.check_equivalence(**args)
