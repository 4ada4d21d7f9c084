"""Every loss form Keras accepts, as small models: one device's gradient on N replicas?

Each entry of `FORMS` builds a compiled model (under the caller's strategy scope) whose loss
has one form: a compiled loss with each reduction, a ``compute_loss`` that returns a scalar
or a per-example vector, ``add_loss`` terms (batch means, per-example sums, weight
penalties), and custom ``train_step``s taking ``tape.gradient`` of a mean, a sum, a vector
or a mix. `train` fits it on fixed data and returns what one device's run must equal: the
weights, ``iterations``, the logged losses and an evaluation. `LOGS_A_SHARE` names the forms
whose own ``train_step`` logs a by-hand sum: the value logged there is the replica's share
(docs: own-train-step/), so only their weights, iterations and evaluation are compared.
"""

from __future__ import annotations

import numpy as np

BATCH = 16
EXAMPLES = 64
RATE = 0.01


def data():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(EXAMPLES, 4)).astype("float32")
    y = (x @ rng.normal(size=(4, 1)) + 0.1 * rng.normal(size=(EXAMPLES, 1))).astype("float32")
    return x, y


def sample_weights():
    """Uneven weights: each replica's ratio of its own sums is not the global batch's."""
    return np.random.default_rng(3).uniform(0.1, 2.0, size=(EXAMPLES,)).astype("float32")


def _inputs(name):
    x, y = data()
    return (x, y, sample_weights()) if name in WEIGHTED else (x, y)


def _layers(**dense):
    import keras

    return [
        keras.Input((4,)),
        keras.layers.Dense(3, activation="tanh", **dense),
        keras.layers.Dense(1),
    ]


def _weights(model):
    rng = np.random.default_rng(7)
    model.set_weights(
        [rng.normal(scale=0.5, size=w.shape).astype("float32") for w in model.get_weights()]
    )
    return model


def _optimizer():
    import keras

    return keras.optimizers.SGD(0.01, momentum=0.5)


def _compiled(reduction=None, **dense):
    import keras

    def make():
        model = keras.Sequential(_layers(**dense))
        loss = keras.losses.MeanSquaredError(**({} if reduction is None else reduction))
        model.compile(optimizer=_optimizer(), loss=loss)
        return _weights(model)

    return make


def _compiled_function():
    """A loss function that reduces by itself: Keras hands its scalar back as it is."""
    import keras
    from keras import ops

    def summed_squares(y_true, y_pred):
        return ops.sum(ops.square(y_true - y_pred))

    def make():
        model = keras.Sequential(_layers())
        model.compile(optimizer=_optimizer(), loss=summed_squares)
        return _weights(model)

    return make


def _with_layer(layer_fn):
    import keras

    def make():
        model = keras.Sequential([*_layers()[:2], layer_fn(), _layers()[2]])
        model.compile(optimizer=_optimizer(), loss="mse")
        return _weights(model)

    return make


def _add_loss_layer(kind):
    import keras
    from keras import ops

    class Penalty(keras.layers.Layer):
        """keras.io/api/losses' activity regularizer (a sum), or its mean."""

        def call(self, inputs):
            values = RATE * ops.square(inputs)
            self.add_loss(ops.sum(values) if kind == "sum" else ops.mean(values))
            return inputs

    return Penalty


def _own_compute_loss(returns):
    import keras
    from keras import ops

    class OwnLoss(keras.Model):
        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
            per_example = keras.losses.mean_squared_error(y, y_pred)
            if returns == "mean + sum":
                return ops.mean(per_example) + RATE * ops.sum(per_example)
            return per_example if returns == "vector" else ops.sum(per_example)

    def make():
        inputs = keras.Input((4,))
        hidden = keras.layers.Dense(3, activation="tanh")(inputs)
        model = OwnLoss(inputs, keras.layers.Dense(1)(hidden))
        model.compile(optimizer=_optimizer())
        return _weights(model)

    return make


def _own_step(reduce, penalty=None, loss=None, **dense):
    """A model whose own ``train_step`` takes ``tape.gradient`` of ``reduce(...)``.

    `penalty`: an `_add_loss_layer` kind after the hidden layer; `loss`: the compiled loss;
    `dense`: the hidden layer's arguments.
    """
    import keras
    import tensorflow as tf
    from keras import ops

    class OwnStep(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                prediction = self(x, training=True)
                per_example = keras.losses.mean_squared_error(y, prediction)
                loss = reduce(per_example, prediction, self, y)
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables, strict=True))
            self.tracker.update_state(loss)
            return {"loss": self.tracker.result()}

        def test_step(self, data):
            x, y = data
            per_example = keras.losses.mean_squared_error(y, self(x, training=False))
            self.tracker.update_state(ops.mean(per_example))
            return {"loss": self.tracker.result()}

        @property
        def metrics(self):
            return [self.tracker]

    def make():
        inputs = keras.Input((4,))
        hidden = keras.layers.Dense(3, activation="tanh", **dense)(inputs)
        if penalty is not None:
            hidden = _add_loss_layer(penalty)()(hidden)
        model = OwnStep(inputs, keras.layers.Dense(1)(hidden))
        model.tracker = keras.metrics.Mean(name="loss")
        model.compile(optimizer=_optimizer(), loss=loss)
        return _weights(model)

    return make


def _step_mean(per_example, prediction, model, y):
    from keras import ops

    return ops.mean(per_example)


def _step_sum(per_example, prediction, model, y):
    from keras import ops

    return ops.sum(per_example)


def _step_vector(per_example, prediction, model, y):
    return per_example


def _step_mixed(per_example, prediction, model, y):
    from keras import ops

    return ops.mean(per_example) + RATE * ops.sum(ops.square(prediction))


def _step_global_recipe(per_example, prediction, model, y):
    # TensorFlow's custom-loop recipe: a sum divided by the global batch size
    from keras import ops

    return ops.sum(per_example) / BATCH


def _step_dynamic_mean(per_example, prediction, model, y):
    # a mean written as a sum divided by the batch's own size
    from keras import ops

    return ops.sum(per_example) / ops.cast(ops.shape(per_example)[0], "float32")


def _step_compute_loss(per_example, prediction, model, y):
    # keras.io's "Customizing what happens in fit()": the compiled loss and add_loss terms
    return model.compute_loss(y=y, y_pred=prediction)


def _step_tf_recipe_with_penalties(per_example, prediction, model, y):
    # TensorFlow's custom-loop recipe, weight penalties included
    import tensorflow as tf

    return tf.nn.compute_average_loss(per_example) + tf.nn.scale_regularization_loss(
        tf.add_n(model.losses)
    )


def _forms():
    import keras

    return {
        "compiled sum_over_batch_size": _compiled(),
        "compiled sum": _compiled({"reduction": "sum"}),
        "compiled none": _compiled({"reduction": None}),
        "compiled mean_with_sample_weight": _compiled({"reduction": "mean_with_sample_weight"}),
        "compiled function returning a sum": _compiled_function(),
        "compute_loss vector": _own_compute_loss("vector"),
        "compute_loss sum": _own_compute_loss("sum"),
        "compute_loss mean + sum": _own_compute_loss("mean + sum"),
        "add_loss mean": _with_layer(_add_loss_layer("mean")),
        "add_loss sum": _with_layer(_add_loss_layer("sum")),
        "kernel_regularizer": _compiled(kernel_regularizer=keras.regularizers.L2(RATE)),
        "activity_regularizer": _compiled(activity_regularizer=keras.regularizers.L2(RATE)),
        "train_step mean": _own_step(_step_mean),
        "train_step sum": _own_step(_step_sum),
        "train_step vector": _own_step(_step_vector),
        "train_step mean + sum": _own_step(_step_mixed),
        "train_step sum / global batch": _own_step(_step_global_recipe),
        "train_step sum / batch size": _own_step(_step_dynamic_mean),
        "train_step compute_loss with add_loss sum": _own_step(
            _step_compute_loss, penalty="sum", loss="mse"
        ),
        "train_step TF recipe with kernel_regularizer": _own_step(
            _step_tf_recipe_with_penalties, kernel_regularizer=keras.regularizers.L2(RATE)
        ),
    }


#: The names of `FORMS`, importable without Keras (for pytest's parametrize).
NAMES = (
    "compiled sum_over_batch_size",
    "compiled sum",
    "compiled none",
    "compiled mean_with_sample_weight",
    "compiled function returning a sum",
    "compute_loss vector",
    "compute_loss sum",
    "compute_loss mean + sum",
    "add_loss mean",
    "add_loss sum",
    "kernel_regularizer",
    "activity_regularizer",
    "train_step mean",
    "train_step sum",
    "train_step vector",
    "train_step mean + sum",
    "train_step sum / global batch",
    "train_step sum / batch size",
    "train_step compute_loss with add_loss sum",
    "train_step TF recipe with kernel_regularizer",
)

#: Forms trained with `sample_weights`.
WEIGHTED = ("compiled mean_with_sample_weight",)

#: Forms whose own train_step logs a sum over the batch by hand: the replica's share.
LOGS_A_SHARE = ("train_step sum", "train_step mean + sum", "train_step sum / global batch")


def train(strategy, name, epochs=2):
    """Fits form `name` on `strategy`; returns weights, iterations, losses and an evaluation."""
    import mirrorkit as mk

    with strategy.scope():
        model = _forms()[name]()
    inputs = mk.distribute(_inputs(name), strategy, global_batch_size=BATCH, shuffle=False)
    history = model.fit(inputs, epochs=epochs, verbose=0)
    evaluation = model.evaluate(
        mk.distribute(_inputs(name), strategy, global_batch_size=BATCH, shuffle=False),
        verbose=0,
    )
    return {
        "weights": [w.copy() for w in model.get_weights()],
        "iterations": int(model.optimizer.iterations.numpy()),
        "loss": [float(v) for v in history.history["loss"]],
        "evaluation": float(np.ravel(evaluation)[0]),
    }


def train_all(strategy, names=NAMES):
    """Every form in `names` on `strategy` (a worker's, in the shared 2-worker job)."""
    return {name: train(strategy, name) for name in names}


def differences(one, other, name):
    """The largest difference from one device per compared quantity (iterations exact)."""
    assert other["iterations"] == one["iterations"], (name, other["iterations"], one["iterations"])
    found = {
        "weights": max(
            float(np.abs(a - b).max())
            for a, b in zip(one["weights"], other["weights"], strict=True)
        ),
        "evaluation": abs(one["evaluation"] - other["evaluation"]),
    }
    if name not in LOGS_A_SHARE:
        found["loss"] = max(abs(a - b) for a, b in zip(one["loss"], other["loss"], strict=True))
    return found


def train_plain(strategy, name, epochs=2):
    """`train` under plain Keras on `strategy` (no mirrorkit repair; a tf.data pipeline of
    global batches, which Keras distributes itself): what plain MirroredStrategy gives."""
    import tensorflow as tf

    from mirrorkit import compat

    compat.disable()
    try:
        with strategy.scope():
            model = _forms()[name]()
        inputs = tf.data.Dataset.from_tensor_slices(_inputs(name)).batch(BATCH)
        history = model.fit(inputs, epochs=epochs, verbose=0, shuffle=False)
        evaluation = model.evaluate(inputs, verbose=0)
    finally:
        compat.enable()
    return {
        "weights": [w.copy() for w in model.get_weights()],
        "iterations": int(model.optimizer.iterations.numpy()),
        "loss": [float(v) for v in history.history["loss"]],
        "evaluation": float(np.ravel(evaluation)[0]),
    }
