"""Users' own training code on 2 replicas (in the pytest process) trains as on one device.

Models without ``call()``, optimizers other than ``model.optimizer``, losses reduced by hand,
``tf.nn.compute_average_loss``, summed losses, ``MultiOptimizer`` and ``LossScaleOptimizer``;
a model built outside the scope; batch normalisation said at ``fit``. The keras.io examples
themselves, each in fresh processes against one device in its own, are
tests/test_keras_io_examples.py.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from _quoted import assert_quoted_in, quoted_block
from keras import layers, ops

import mirrorkit as mk
from mirrorkit import compat
from mirrorkit.compat import one_device_loss, one_device_tape, optimizer_step

RNG = np.random.default_rng(0)
X = RNG.random((64, 4, 4, 1)).astype("float32")
Z = RNG.normal(size=(64, 2, 3)).astype("float32")  # two latent draws per example
BATCH = 16


@pytest.fixture
def take_away():
    """``take_away(names)`` removes those repairs (after the test's strategies are made, which
    apply them); every repair is back after the test."""

    def remove(names):
        for repair in reversed(compat.REPAIRS):
            if repair.name in names:
                repair.remove()

    yield remove
    compat.enable()


class GAN(keras.Model):
    """The keras.io DCGAN's shape: no call(), two optimizers under other names, a loss object."""

    def __init__(self, discriminator, generator):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn
        self.d_loss_metric = keras.metrics.Mean(name="d_loss")
        self.g_loss_metric = keras.metrics.Mean(name="g_loss")

    @property
    def metrics(self):
        return [self.d_loss_metric, self.g_loss_metric]

    def train_step(self, data):
        real, z = data
        n = ops.shape(real)[0]
        combined = ops.concatenate([self.generator(z[:, 0]), real], axis=0)
        labels = ops.concatenate([ops.ones((n, 1)), ops.zeros((n, 1))], axis=0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(combined))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(
            zip(grads, self.discriminator.trainable_weights, strict=True)
        )
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(ops.zeros((n, 1)), self.discriminator(self.generator(z[:, 1])))
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights, strict=True))
        self.d_loss_metric.update_state(d_loss)
        self.g_loss_metric.update_state(g_loss)
        return {m.name: m.result() for m in self.metrics}


def make_gan(d_optimizer=None, g_optimizer=None):
    discriminator = keras.Sequential(
        [
            keras.Input((4, 4, 1)),
            layers.Flatten(),
            layers.Dense(8, activation="relu"),
            layers.Dense(1),
        ]
    )
    generator = keras.Sequential(
        [keras.Input((3,)), layers.Dense(16, name="g_dense"), layers.Reshape((4, 4, 1))]
    )
    gan = GAN(discriminator, generator)
    gan.compile(
        d_optimizer=d_optimizer or keras.optimizers.Adam(1e-3),
        g_optimizer=g_optimizer or keras.optimizers.Adam(1e-3),
        loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    return gan


def make_gan_with_wrapped_optimizers():
    """A LossScaleOptimizer and a MultiOptimizer as the GAN's two optimizers."""
    optimizers = keras.optimizers.OptimizerMap(default_optimizer=keras.optimizers.SGD(0.1))
    optimizers[".*g_dense/kernel"] = keras.optimizers.Adam(1e-2)
    return make_gan(
        d_optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3)),
        g_optimizer=keras.optimizers.MultiOptimizer(optimizers),
    )


class HandReduced(keras.Model):
    """The keras.io VAE's way: losses reduced by hand (ops.mean of a keras.losses function)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = layers.Dense(16, activation="sigmoid")
        self.tracker = keras.metrics.Mean(name="loss")

    def call(self, x):
        return ops.reshape(self.dense(ops.reshape(x, (-1, 16))), (-1, 4, 4, 1))

    @property
    def metrics(self):
        return [self.tracker]

    def loss_of(self, x):
        per_example = keras.losses.binary_crossentropy(x, self(x, training=True))
        return ops.mean(ops.sum(per_example, axis=(1, 2)))

    def train_step(self, data):
        x, _ = data
        with tf.GradientTape() as tape:
            loss = self.loss_of(x)
        grads = tape.gradient(loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights, strict=True))
        self.tracker.update_state(loss)
        return {"loss": self.tracker.result()}


class AverageLoss(HandReduced):
    """TensorFlow's custom-training guide's way: tf.nn.compute_average_loss over the replica."""

    def loss_of(self, x):
        per_example = ops.sum(keras.losses.binary_crossentropy(x, self(x, training=True)), (1, 2))
        return tf.nn.compute_average_loss(per_example, global_batch_size=BATCH)


def make_hand_reduced(cls=HandReduced, optimizer="sgd"):
    model = cls()
    model.compile(optimizer=keras.optimizers.SGD(0.5) if optimizer == "sgd" else optimizer)
    return model


def make_summed():
    model = keras.Sequential([keras.Input((4, 4, 1)), layers.Flatten(), layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss=keras.losses.MeanSquaredError("sum"))
    return model


def make_multi_optimizer():
    model = keras.Sequential(
        [keras.Input((4, 4, 1)), layers.Flatten(), layers.Dense(4, name="first"), layers.Dense(1)]
    )
    optimizers = keras.optimizers.OptimizerMap(default_optimizer=keras.optimizers.SGD(0.1))
    optimizers[".*first/.*"] = keras.optimizers.Adam(1e-2)
    model.compile(optimizer=keras.optimizers.MultiOptimizer(optimizers), loss="mse")
    return model


def make_loss_scaled():
    model = keras.Sequential([keras.Input((4, 4, 1)), layers.Flatten(), layers.Dense(1)])
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-2))
    model.compile(optimizer=optimizer, loss="mse")
    return model


def _optimizers(model):
    """Every optimizer the model holds, by attribute name, wrapped ones included."""
    found = {}
    for name, value in vars(model).items():
        if isinstance(value, keras.optimizers.Optimizer):
            found[name] = value
            for i, inner in enumerate(getattr(value, "optimizers", None) or []):
                found[f"{name}.optimizers[{i}]"] = inner
            if hasattr(value, "inner_optimizer"):
                found[f"{name}.inner_optimizer"] = value.inner_optimizer
    return found


def train(strategy, make_model, data, epochs=2, distribute=True):
    """Weights, History and every optimizer's iterations after fit on `strategy`."""
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = make_model()
    if distribute:
        data = mk.distribute(data, strategy, global_batch_size=BATCH, shuffle=False)
    history = model.fit(data, epochs=epochs, verbose=0).history
    return {
        "weights": [w.numpy().copy() for w in model.weights],
        "history": {k: [float(v) for v in vs] for k, vs in history.items()},
        "iterations": {k: int(o.iterations.numpy()) for k, o in _optimizers(model).items()},
    }


def _largest_difference(one, two):
    return max(
        float(np.max(np.abs(a - b))) for a, b in zip(one["weights"], two["weights"], strict=True)
    )


def assert_as_one_device(make_model, data, tolerance=1e-5):
    one = train(mk.strategy("one_device"), make_model, data)
    two = train(mk.strategy(cpu_replicas=2), make_model, data)
    assert two["iterations"] == one["iterations"]
    assert two["history"].keys() == one["history"].keys()
    for key, values in one["history"].items():
        np.testing.assert_allclose(two["history"][key], values, atol=tolerance, err_msg=key)
    assert _largest_difference(one, two) <= tolerance
    return one, two


def test_a_model_without_call_and_two_optimizers_trains_as_one_device():
    one, _ = assert_as_one_device(make_gan, (X, Z))
    assert one["iterations"] == {"optimizer": 0, "d_optimizer": 8, "g_optimizer": 8}


def test_loss_scale_and_multi_optimizers_in_a_custom_step_train_as_one_device():
    if not hasattr(keras.optimizers, "MultiOptimizer"):
        pytest.skip(f"keras.optimizers.MultiOptimizer is new in Keras 3.15 ({keras.__version__})")
    one, _ = assert_as_one_device(make_gan_with_wrapped_optimizers, (X, Z))
    assert one["iterations"] == {
        "optimizer": 0,
        "d_optimizer": 8,
        "d_optimizer.inner_optimizer": 8,
        "g_optimizer": 8,
        "g_optimizer.optimizers[0]": 8,
        "g_optimizer.optimizers[1]": 8,
    }


def test_a_model_without_call_fits_under_a_one_device_strategy_too():
    train(mk.strategy("one_device"), make_gan, (X, Z), epochs=1)  # Keras's build would raise


@pytest.mark.upstream
def test_a_model_without_call_fails_to_build_upstream(take_away):
    strategy = mk.strategy(cpu_replicas=2)
    take_away({"symbolic_build"})
    with pytest.raises(Exception, match="Unable to automatically build the model"):
        train(strategy, make_gan, (X, Z), epochs=1)


@pytest.mark.upstream
def test_optimizers_under_other_names_fail_upstream(take_away):
    """keras#23085: fails where the optimizer_variables repair is needed; trains where Keras
    has shipped its fix (#23087, keras-nightly 3.16) and the repair steps aside."""
    from mirrorkit.compat import optimizer_variables

    strategy = mk.strategy(cpu_replicas=2)
    take_away({"optimizer_variables"})
    if not optimizer_variables.REPAIR.needed():
        train(strategy, make_gan, (X, Z), epochs=1)
        return
    with pytest.raises(Exception, match="placeholder"):
        train(strategy, make_gan, (X, Z), epochs=1)


def test_a_loss_reduced_by_hand_trains_as_one_device():
    assert_as_one_device(make_hand_reduced, (X, X))


def test_tf_nn_compute_average_loss_in_a_step_trains_as_one_device():
    assert_as_one_device(lambda: make_hand_reduced(AverageLoss), (X, X))


@pytest.mark.upstream
def test_tf_nn_compute_average_loss_in_a_step_logs_a_replicas_share_upstream(taken_off):
    """The canary of one_device_average_loss, taken off alone: TensorFlow's average over the
    global batch is each replica's share in fit's step, so the step logs 1/N of one device's
    loss (the gradient is still one device's: the tape repair reads the sum)."""
    make = lambda: make_hand_reduced(AverageLoss)  # noqa: E731
    one = train(mk.strategy("one_device"), make, (X, X))
    replicas = mk.strategy(cpu_replicas=2)
    taken_off("one_device_average_loss")
    two = train(replicas, make, (X, X))
    np.testing.assert_allclose(
        two["history"]["loss"], [value / 2 for value in one["history"]["loss"]], rtol=1e-4
    )


ONE_DEVICE_LOSS = [
    repair.name
    for repair in (*one_device_loss.REPAIRS, *one_device_tape.REPAIRS, optimizer_step.STEP)
]


@pytest.mark.upstream
def test_a_loss_reduced_by_hand_trains_at_twice_the_gradient_upstream(take_away):
    """Plain Keras: the replicas' gradients are summed, so SGD moves twice as far."""
    one_device, replicas = mk.strategy("one_device"), mk.strategy(cpu_replicas=2)
    take_away(set(ONE_DEVICE_LOSS))
    one = train(one_device, make_hand_reduced, (X, X), epochs=1)
    two = train(replicas, make_hand_reduced, (X, X), epochs=1)
    assert _largest_difference(one, two) > 1e-3
    doubled = train(
        one_device,
        lambda: make_hand_reduced(optimizer=keras.optimizers.SGD(1.0)),  # twice the rate
        (X, X),
        epochs=1,
    )
    assert _largest_difference(doubled, two) < 1e-5


def test_a_summed_loss_trains_as_one_device():
    assert_as_one_device(make_summed, (X, RNG.normal(size=(64, 1)).astype("float32")))


def test_multi_optimizer_trains_as_one_device():
    if not hasattr(keras.optimizers, "MultiOptimizer"):
        pytest.skip(f"keras.optimizers.MultiOptimizer is new in Keras 3.15 ({keras.__version__})")
    one, _ = assert_as_one_device(make_multi_optimizer, (X, X[:, 0, :1, 0]))
    assert set(one["iterations"].values()) == {8}


def test_loss_scale_optimizer_trains_as_one_device():
    one, _ = assert_as_one_device(make_loss_scaled, (X, X[:, 0, :1, 0]))
    assert one["iterations"] == {"optimizer": 8, "optimizer.inner_optimizer": 8}


def test_a_custom_loop_outside_fit_keeps_tensorflow_contract():
    """Outside fit Keras's losses stay divided by the replica count; mk.unscale_loss undoes it."""
    strategy = mk.strategy(cpu_replicas=2)
    with strategy.scope():
        loss_fn = keras.losses.MeanSquaredError()

    @tf.function
    def losses(x):
        def replica(x):
            loss = loss_fn(tf.zeros_like(x), x)
            return loss, mk.unscale_loss(loss)

        return strategy.run(replica, args=(x,))

    x = next(iter(mk.distribute(np.ones((8, 1), "float32") * 2, strategy, global_batch_size=8)))
    scaled, unscaled = (strategy.experimental_local_results(v)[0] for v in losses(x))
    assert float(scaled) == pytest.approx(2.0) and float(unscaled) == pytest.approx(4.0)


def test_a_model_built_outside_the_scope_is_told_what_to_do(tmp_path):
    strategy = mk.strategy(cpu_replicas=2)
    model = make_summed()  # no scope
    data = mk.distribute((X, X[:, 0, :1, 0]), strategy, global_batch_size=BATCH)
    with pytest.raises(ValueError, match=r"built outside any strategy's scope.*mk\.build") as err:
        model.fit(data, epochs=1, verbose=0)
    quote = quoted_block("own-train-step.md", "Handed an `mk.distribute` dataset, `fit`")
    assert_quoted_in(quote, f"ValueError: {err.value}")
    quote = quoted_block("compat.md", "error that names the cause (here for a `Sequential` model)")
    assert_quoted_in(quote, f"ValueError: {err.value}")
    # What the error says for a model already trained: save it, load it under the scope.
    model.fit(X, X[:, 0, :1, 0], epochs=1, verbose=0)
    model.save(tmp_path / "model.keras")
    with strategy.scope():
        loaded = keras.models.load_model(tmp_path / "model.keras")
    assert isinstance(loaded.weights[0].value, tf.distribute.DistributedValues)
    loaded.fit(data, epochs=1, verbose=0)
    assert int(loaded.optimizer.iterations.numpy()) == 2 + 4  # its optimizer state came along


@pytest.mark.upstream
def test_a_model_built_outside_the_scope_fails_upstream(take_away):
    """Keras's own error for it, which does not say what to do: symbolic_build names the cause."""
    strategy = mk.strategy(cpu_replicas=2)
    take_away({"symbolic_build"})
    model = make_summed()  # no scope
    data = mk.distribute((X, X[:, 0, :1, 0]), strategy, global_batch_size=BATCH)
    with pytest.raises(ValueError) as err:
        model.fit(data, epochs=1, verbose=0)
    quote = quoted_block("compat.md", "`fit(mk.distribute(...))`, fails with Keras's error:")
    assert_quoted_in(quote, f"ValueError: {err.value}")


def _with_batch_norm():
    base = keras.Sequential(
        [
            keras.Input((4, 4, 1)),
            layers.Conv2D(2, 3),
            layers.BatchNormalization(name="batch_normalization"),
        ],
        name="base",
    )
    base.trainable = False
    inputs = keras.Input((4, 4, 1))
    outputs = layers.Dense(1)(layers.Flatten()(base(inputs, training=False)))
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="sgd", loss="mse")
    return model, base


def test_batch_norm_is_said_at_fit_once_the_base_is_unfrozen(capfd):
    strategy = mk.strategy(cpu_replicas=2)
    with strategy.scope():  # not mk.build: nothing is said when the model is made
        model, base = _with_batch_norm()
    data = mk.distribute((X, X[:, 0, :1, 0]), strategy, global_batch_size=BATCH)
    model.fit(data, epochs=1, verbose=0)
    assert "BatchNormalization" not in capfd.readouterr().err  # frozen: moving statistics
    base.trainable = True
    with strategy.scope():
        model.compile(optimizer="sgd", loss="mse")
    model.fit(data, epochs=1, verbose=0)
    err = capfd.readouterr().err
    assert "1 BatchNormalization layer(s) (batch_normalization" in err
    assert "mk.synchronize_batch_norm(model)" in err
    assert_quoted_in(quoted_block("own-train-step.md", "At `fit` you see:"), err)
    assert mk.synchronize_batch_norm(model) == [base.layers[-1].name]
    assert mk.synchronize_batch_norm(model) == []  # already synchronised
