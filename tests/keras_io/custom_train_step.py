# Customizing what happens in fit() with TensorFlow, ported to mirrorkit.
#
# Original: https://keras.io/guides/custom_train_step_in_tensorflow/
# (keras-io guides/custom_train_step_in_tensorflow.py), its first four examples: "A first
# simple example" (a train_step with self.compute_loss, updating the metric named "loss" with the
# loss and the others with (y, y_pred)), "Going lower-level" (its own loss_fn, loss_tracker and
# mae_metric, compile(optimizer="adam") only), "Supporting sample_weight & class_weight" (a
# train_step that unpacks (x, y, sample_weight) and weighs its loss and metrics, fit with
# sample_weight=) and "Providing your own evaluation step" (a test_step, evaluate on arrays);
# each trained with fit on NumPy arrays.
#
# Changed in both functions (not for mirrorkit): stand-in data from a seeded generator (1,024
# rows instead of 1,000 unseeded np.random.random rows, so that batches of 32 divide them);
# 2 epochs instead of 3 and 5; fit(shuffle=False) so that one device and the replicas see the
# same batches; the classes after the first renamed LowerLevelModel, WeightedModel and
# EvaluatedModel (the guide reuses CustomModel).
#
# Changed for mirrorkit (`ported` against `original`, LINES_CHANGED, counted by difflib):
# import mirrorkit; strategy = mk.strategy(...); `with strategy.scope():` around each model's
# construction and compile (re-indented); the arrays through mk.distribute (evaluate, as the
# README's conversion says, is unchanged). The train_steps and the test_step are unchanged:
# inside fit every loss is one device's, so what they log is what one device logs (plain Keras
# under a strategy logs 1/N of it).

import numpy as np

LINES_CHANGED = {"added": 32, "removed": 24, "reindented": 21}


def write_data(workdir):
    import os

    rng = np.random.default_rng(0)
    np.savez(os.path.join(workdir, "data.npz"), x=rng.random((1024, 32)), y=rng.random((1024, 1)))


def original(workdir):
    import os

    import keras
    import numpy as np
    import tensorflow as tf

    class CustomModel(keras.Model):
        def train_step(self, data):
            # Unpack the data. Its structure depends on your model and
            # on what you pass to `fit()`.
            x, y = data

            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)  # Forward pass
                # Compute the loss value
                # (the loss function is configured in `compile()`)
                loss = self.compute_loss(y=y, y_pred=y_pred)

            # Compute gradients
            trainable_vars = self.trainable_variables
            gradients = tape.gradient(loss, trainable_vars)

            # Update weights
            self.optimizer.apply(gradients, trainable_vars)

            # Update metrics (includes the metric that tracks the loss)
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred)

            # Return a dict mapping metric names to current value
            return {m.name: m.result() for m in self.metrics}

    # Construct and compile an instance of CustomModel
    inputs = keras.Input(shape=(32,))
    outputs = keras.layers.Dense(1)(inputs)
    model = CustomModel(inputs, outputs)
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])

    # Just use `fit` as usual
    with np.load(os.path.join(workdir, "data.npz")) as data:
        x, y = data["x"], data["y"]
    first = model.fit(x, y, epochs=2, shuffle=False)

    class LowerLevelModel(keras.Model):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.loss_tracker = keras.metrics.Mean(name="loss")
            self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")
            self.loss_fn = keras.losses.MeanSquaredError()

        def train_step(self, data):
            x, y = data

            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)  # Forward pass
                # Compute our own loss
                loss = self.loss_fn(y, y_pred)

            # Compute gradients
            trainable_vars = self.trainable_variables
            gradients = tape.gradient(loss, trainable_vars)

            # Update weights
            self.optimizer.apply(gradients, trainable_vars)

            # Compute our own metrics
            self.loss_tracker.update_state(loss)
            self.mae_metric.update_state(y, y_pred)
            return {
                "loss": self.loss_tracker.result(),
                "mae": self.mae_metric.result(),
            }

        @property
        def metrics(self):
            # We list our `Metric` objects here so that `reset_states()` can be
            # called automatically at the start of each epoch
            # or at the start of `evaluate()`.
            return [self.loss_tracker, self.mae_metric]

    # Construct an instance of CustomModel
    inputs = keras.Input(shape=(32,))
    outputs = keras.layers.Dense(1)(inputs)
    lower = LowerLevelModel(inputs, outputs)

    # We don't pass a loss or metrics here.
    lower.compile(optimizer="adam")

    # Just use `fit` as usual -- you can use callbacks, etc.
    history = lower.fit(x, y, epochs=2, shuffle=False)

    class WeightedModel(keras.Model):
        def train_step(self, data):
            # Unpack the data. Its structure depends on your model and
            # on what you pass to `fit()`.
            if len(data) == 3:
                x, y, sample_weight = data
            else:
                sample_weight = None
                x, y = data

            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)  # Forward pass
                # Compute the loss value.
                # The loss function is configured in `compile()`.
                loss = self.compute_loss(
                    y=y,
                    y_pred=y_pred,
                    sample_weight=sample_weight,
                )

            # Compute gradients
            trainable_vars = self.trainable_variables
            gradients = tape.gradient(loss, trainable_vars)

            # Update weights
            self.optimizer.apply(gradients, trainable_vars)

            # Update the metrics.
            # Metrics are configured in `compile()`.
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred, sample_weight=sample_weight)

            # Return a dict mapping metric names to current value.
            # Note that it will include the loss (tracked in self.metrics).
            return {m.name: m.result() for m in self.metrics}

    # Construct and compile an instance of WeightedModel
    inputs = keras.Input(shape=(32,))
    outputs = keras.layers.Dense(1)(inputs)
    weighted = WeightedModel(inputs, outputs)
    weighted.compile(optimizer="adam", loss="mse", metrics=["mae"])

    # You can now use sample_weight argument
    sw = np.random.default_rng(1).random((1024, 1))
    weighted_history = weighted.fit(x, y, sample_weight=sw, epochs=2, shuffle=False)

    class EvaluatedModel(keras.Model):
        def test_step(self, data):
            # Unpack the data
            x, y = data
            # Compute predictions
            y_pred = self(x, training=False)
            # Updates the metrics tracking the loss
            loss = self.compute_loss(y=y, y_pred=y_pred)
            # Update the metrics.
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred)
            # Return a dict mapping metric names to current value.
            # Note that it will include the loss (tracked in self.metrics).
            return {m.name: m.result() for m in self.metrics}

    # Construct an instance of EvaluatedModel
    inputs = keras.Input(shape=(32,))
    outputs = keras.layers.Dense(1)(inputs)
    evaluated = EvaluatedModel(inputs, outputs)
    evaluated.compile(loss="mse", metrics=["mae"])

    # Evaluate with our custom test_step
    evaluation = evaluated.evaluate(x, y)

    from keras_io import outcome

    return outcome(
        lower,
        history,
        first_loss=first.history["loss"],
        first_mae=first.history["mae"],
        first_weights=np.concatenate([w.ravel() for w in model.get_weights()]),
        first_iterations=int(model.optimizer.iterations.numpy()),
        weighted_loss=weighted_history.history["loss"],
        weighted_mae=weighted_history.history["mae"],
        weighted_weights=np.concatenate([w.ravel() for w in weighted.get_weights()]),
        weighted_iterations=int(weighted.optimizer.iterations.numpy()),
        evaluation=evaluation,
    )


def ported(workdir, cpu_replicas):
    import os

    import keras
    import numpy as np
    import tensorflow as tf

    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=cpu_replicas)

    class CustomModel(keras.Model):
        def train_step(self, data):
            # Unpack the data. Its structure depends on your model and
            # on what you pass to `fit()`.
            x, y = data

            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)  # Forward pass
                # Compute the loss value
                # (the loss function is configured in `compile()`)
                loss = self.compute_loss(y=y, y_pred=y_pred)

            # Compute gradients
            trainable_vars = self.trainable_variables
            gradients = tape.gradient(loss, trainable_vars)

            # Update weights
            self.optimizer.apply(gradients, trainable_vars)

            # Update metrics (includes the metric that tracks the loss)
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred)

            # Return a dict mapping metric names to current value
            return {m.name: m.result() for m in self.metrics}

    with strategy.scope():
        # Construct and compile an instance of CustomModel
        inputs = keras.Input(shape=(32,))
        outputs = keras.layers.Dense(1)(inputs)
        model = CustomModel(inputs, outputs)
        model.compile(optimizer="adam", loss="mse", metrics=["mae"])

    # Just use `fit` as usual
    with np.load(os.path.join(workdir, "data.npz")) as data:
        x, y = data["x"], data["y"]
    train = mk.distribute((x, y), strategy, global_batch_size=32, shuffle=False)
    first = model.fit(train, epochs=2)

    class LowerLevelModel(keras.Model):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.loss_tracker = keras.metrics.Mean(name="loss")
            self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")
            self.loss_fn = keras.losses.MeanSquaredError()

        def train_step(self, data):
            x, y = data

            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)  # Forward pass
                # Compute our own loss
                loss = self.loss_fn(y, y_pred)

            # Compute gradients
            trainable_vars = self.trainable_variables
            gradients = tape.gradient(loss, trainable_vars)

            # Update weights
            self.optimizer.apply(gradients, trainable_vars)

            # Compute our own metrics
            self.loss_tracker.update_state(loss)
            self.mae_metric.update_state(y, y_pred)
            return {
                "loss": self.loss_tracker.result(),
                "mae": self.mae_metric.result(),
            }

        @property
        def metrics(self):
            # We list our `Metric` objects here so that `reset_states()` can be
            # called automatically at the start of each epoch
            # or at the start of `evaluate()`.
            return [self.loss_tracker, self.mae_metric]

    with strategy.scope():
        # Construct an instance of CustomModel
        inputs = keras.Input(shape=(32,))
        outputs = keras.layers.Dense(1)(inputs)
        lower = LowerLevelModel(inputs, outputs)

        # We don't pass a loss or metrics here.
        lower.compile(optimizer="adam")

    # Just use `fit` as usual -- you can use callbacks, etc.
    history = lower.fit(train, epochs=2)

    class WeightedModel(keras.Model):
        def train_step(self, data):
            # Unpack the data. Its structure depends on your model and
            # on what you pass to `fit()`.
            if len(data) == 3:
                x, y, sample_weight = data
            else:
                sample_weight = None
                x, y = data

            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)  # Forward pass
                # Compute the loss value.
                # The loss function is configured in `compile()`.
                loss = self.compute_loss(
                    y=y,
                    y_pred=y_pred,
                    sample_weight=sample_weight,
                )

            # Compute gradients
            trainable_vars = self.trainable_variables
            gradients = tape.gradient(loss, trainable_vars)

            # Update weights
            self.optimizer.apply(gradients, trainable_vars)

            # Update the metrics.
            # Metrics are configured in `compile()`.
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred, sample_weight=sample_weight)

            # Return a dict mapping metric names to current value.
            # Note that it will include the loss (tracked in self.metrics).
            return {m.name: m.result() for m in self.metrics}

    with strategy.scope():
        # Construct and compile an instance of WeightedModel
        inputs = keras.Input(shape=(32,))
        outputs = keras.layers.Dense(1)(inputs)
        weighted = WeightedModel(inputs, outputs)
        weighted.compile(optimizer="adam", loss="mse", metrics=["mae"])

    # You can now use sample_weight argument
    sw = np.random.default_rng(1).random((1024, 1))
    weighted_train = mk.distribute((x, y, sw), strategy, global_batch_size=32, shuffle=False)
    weighted_history = weighted.fit(weighted_train, epochs=2)

    class EvaluatedModel(keras.Model):
        def test_step(self, data):
            # Unpack the data
            x, y = data
            # Compute predictions
            y_pred = self(x, training=False)
            # Updates the metrics tracking the loss
            loss = self.compute_loss(y=y, y_pred=y_pred)
            # Update the metrics.
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred)
            # Return a dict mapping metric names to current value.
            # Note that it will include the loss (tracked in self.metrics).
            return {m.name: m.result() for m in self.metrics}

    with strategy.scope():
        # Construct an instance of EvaluatedModel
        inputs = keras.Input(shape=(32,))
        outputs = keras.layers.Dense(1)(inputs)
        evaluated = EvaluatedModel(inputs, outputs)
        evaluated.compile(loss="mse", metrics=["mae"])

    # Evaluate with our custom test_step
    evaluation = evaluated.evaluate(x, y)

    from keras_io import outcome

    return outcome(
        lower,
        history,
        first_loss=first.history["loss"],
        first_mae=first.history["mae"],
        first_weights=np.concatenate([w.ravel() for w in model.get_weights()]),
        first_iterations=int(model.optimizer.iterations.numpy()),
        weighted_loss=weighted_history.history["loss"],
        weighted_mae=weighted_history.history["mae"],
        weighted_weights=np.concatenate([w.ravel() for w in weighted.get_weights()]),
        weighted_iterations=int(weighted.optimizer.iterations.numpy()),
        evaluation=evaluation,
    )
