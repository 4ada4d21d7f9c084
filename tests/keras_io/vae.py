# Variational AutoEncoder, ported to mirrorkit.
#
# Original: https://keras.io/examples/generative/vae/ (keras-io examples/generative/vae.py):
# a Sampling layer, a Conv2D encoder and a Conv2DTranspose decoder as functional models, and a
# VAE keras.Model with no call() whose train_step reduces its losses by hand (ops.mean over the
# batch of ops.sum of keras.losses.binary_crossentropy, a function, and of the KL term) and
# tracks them in keras.metrics.Mean; compile(optimizer=Adam()); fit on the MNIST digits.
#
# Changed in both functions (not for mirrorkit): stand-in data (`write_data`: mirrorkit's bundled
# 8x8 UCI digits scaled up to 16x16 in [0, 1], instead of the MNIST download), so the encoder's
# input is (16, 16, 1) and its layers smaller (filters 8 and 16, a 4x4 start in the decoder);
# the sampling noise epsilon is an input drawn once with NumPy and passed with the data
# (fit(digits, epsilon)), instead of keras.random.normal in the Sampling layer (each replica
# would draw its own); 256 digits, batch_size 32, 2 epochs instead of 30; shuffle=False so that
# one device and the replicas see the same batches.
#
# Changed for mirrorkit (`ported` against `original`, LINES_CHANGED, counted by difflib):
# import mirrorkit; strategy = mk.strategy(...); `with strategy.scope():` around the models'
# construction and compile (re-indented); the arrays through mk.distribute. The train_step is
# unchanged: inside fit its hand-reduced losses are one device's and the gradients are averaged
# (plain Keras under a strategy trains it at N times one device's gradient).

import numpy as np

LINES_CHANGED = {"added": 27, "removed": 20, "reindented": 18}
NUM_DIGITS = 256
LATENT_DIM = 2


def write_data(workdir):
    import os

    from mirrorkit.demo.data import load_digits

    images, _ = load_digits()
    digits = np.kron(images[:NUM_DIGITS], np.ones((2, 2), "uint8")) / 16.0
    epsilon = np.random.default_rng(0).normal(size=(NUM_DIGITS, LATENT_DIM))
    np.savez(os.path.join(workdir, "digits.npz"), digits=digits, epsilon=epsilon)


def original(workdir):
    import os

    import keras
    import numpy as np
    import tensorflow as tf
    from keras import layers, ops

    class Sampling(layers.Layer):
        """Uses (z_mean, z_log_var) to sample z, the vector encoding a digit."""

        def call(self, inputs):
            z_mean, z_log_var, epsilon = inputs
            return z_mean + ops.exp(0.5 * z_log_var) * epsilon

    latent_dim = LATENT_DIM

    encoder_inputs = keras.Input(shape=(16, 16, 1))
    epsilon_inputs = keras.Input(shape=(latent_dim,))
    x = layers.Conv2D(8, 3, activation="relu", strides=2, padding="same")(encoder_inputs)
    x = layers.Conv2D(16, 3, activation="relu", strides=2, padding="same")(x)
    x = layers.Flatten()(x)
    x = layers.Dense(16, activation="relu")(x)
    z_mean = layers.Dense(latent_dim, name="z_mean")(x)
    z_log_var = layers.Dense(latent_dim, name="z_log_var")(x)
    z = Sampling()([z_mean, z_log_var, epsilon_inputs])
    encoder = keras.Model([encoder_inputs, epsilon_inputs], [z_mean, z_log_var, z], name="encoder")

    latent_inputs = keras.Input(shape=(latent_dim,))
    x = layers.Dense(4 * 4 * 16, activation="relu")(latent_inputs)
    x = layers.Reshape((4, 4, 16))(x)
    x = layers.Conv2DTranspose(16, 3, activation="relu", strides=2, padding="same")(x)
    x = layers.Conv2DTranspose(8, 3, activation="relu", strides=2, padding="same")(x)
    decoder_outputs = layers.Conv2DTranspose(1, 3, activation="sigmoid", padding="same")(x)
    decoder = keras.Model(latent_inputs, decoder_outputs, name="decoder")

    class VAE(keras.Model):
        def __init__(self, encoder, decoder, **kwargs):
            super().__init__(**kwargs)
            self.encoder = encoder
            self.decoder = decoder
            self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
            self.reconstruction_loss_tracker = keras.metrics.Mean(name="reconstruction_loss")
            self.kl_loss_tracker = keras.metrics.Mean(name="kl_loss")

        @property
        def metrics(self):
            return [
                self.total_loss_tracker,
                self.reconstruction_loss_tracker,
                self.kl_loss_tracker,
            ]

        def train_step(self, data):
            data, epsilon = data
            with tf.GradientTape() as tape:
                z_mean, z_log_var, z = self.encoder([data, epsilon])
                reconstruction = self.decoder(z)
                reconstruction_loss = ops.mean(
                    ops.sum(
                        keras.losses.binary_crossentropy(data, reconstruction),
                        axis=(1, 2),
                    )
                )
                kl_loss = -0.5 * (1 + z_log_var - ops.square(z_mean) - ops.exp(z_log_var))
                kl_loss = ops.mean(ops.sum(kl_loss, axis=1))
                total_loss = reconstruction_loss + kl_loss
            grads = tape.gradient(total_loss, self.trainable_weights)
            self.optimizer.apply_gradients(zip(grads, self.trainable_weights, strict=True))
            self.total_loss_tracker.update_state(total_loss)
            self.reconstruction_loss_tracker.update_state(reconstruction_loss)
            self.kl_loss_tracker.update_state(kl_loss)
            return {
                "loss": self.total_loss_tracker.result(),
                "reconstruction_loss": self.reconstruction_loss_tracker.result(),
                "kl_loss": self.kl_loss_tracker.result(),
            }

    with np.load(os.path.join(workdir, "digits.npz")) as f:
        mnist_digits, epsilon = f["digits"], f["epsilon"]
    mnist_digits = np.expand_dims(mnist_digits, -1).astype("float32")
    epsilon = epsilon.astype("float32")

    vae = VAE(encoder, decoder)
    vae.compile(optimizer=keras.optimizers.Adam())
    history = vae.fit(mnist_digits, epsilon, epochs=2, batch_size=32, shuffle=False)

    from keras_io import outcome

    return outcome(vae, history)


def ported(workdir, cpu_replicas):
    import os

    import keras
    import numpy as np
    import tensorflow as tf
    from keras import layers, ops

    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=cpu_replicas)

    class Sampling(layers.Layer):
        """Uses (z_mean, z_log_var) to sample z, the vector encoding a digit."""

        def call(self, inputs):
            z_mean, z_log_var, epsilon = inputs
            return z_mean + ops.exp(0.5 * z_log_var) * epsilon

    latent_dim = LATENT_DIM

    with strategy.scope():
        encoder_inputs = keras.Input(shape=(16, 16, 1))
        epsilon_inputs = keras.Input(shape=(latent_dim,))
        x = layers.Conv2D(8, 3, activation="relu", strides=2, padding="same")(encoder_inputs)
        x = layers.Conv2D(16, 3, activation="relu", strides=2, padding="same")(x)
        x = layers.Flatten()(x)
        x = layers.Dense(16, activation="relu")(x)
        z_mean = layers.Dense(latent_dim, name="z_mean")(x)
        z_log_var = layers.Dense(latent_dim, name="z_log_var")(x)
        z = Sampling()([z_mean, z_log_var, epsilon_inputs])
        encoder = keras.Model(
            [encoder_inputs, epsilon_inputs], [z_mean, z_log_var, z], name="encoder"
        )

        latent_inputs = keras.Input(shape=(latent_dim,))
        x = layers.Dense(4 * 4 * 16, activation="relu")(latent_inputs)
        x = layers.Reshape((4, 4, 16))(x)
        x = layers.Conv2DTranspose(16, 3, activation="relu", strides=2, padding="same")(x)
        x = layers.Conv2DTranspose(8, 3, activation="relu", strides=2, padding="same")(x)
        decoder_outputs = layers.Conv2DTranspose(1, 3, activation="sigmoid", padding="same")(x)
        decoder = keras.Model(latent_inputs, decoder_outputs, name="decoder")

    class VAE(keras.Model):
        def __init__(self, encoder, decoder, **kwargs):
            super().__init__(**kwargs)
            self.encoder = encoder
            self.decoder = decoder
            self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
            self.reconstruction_loss_tracker = keras.metrics.Mean(name="reconstruction_loss")
            self.kl_loss_tracker = keras.metrics.Mean(name="kl_loss")

        @property
        def metrics(self):
            return [
                self.total_loss_tracker,
                self.reconstruction_loss_tracker,
                self.kl_loss_tracker,
            ]

        def train_step(self, data):
            data, epsilon = data
            with tf.GradientTape() as tape:
                z_mean, z_log_var, z = self.encoder([data, epsilon])
                reconstruction = self.decoder(z)
                reconstruction_loss = ops.mean(
                    ops.sum(
                        keras.losses.binary_crossentropy(data, reconstruction),
                        axis=(1, 2),
                    )
                )
                kl_loss = -0.5 * (1 + z_log_var - ops.square(z_mean) - ops.exp(z_log_var))
                kl_loss = ops.mean(ops.sum(kl_loss, axis=1))
                total_loss = reconstruction_loss + kl_loss
            grads = tape.gradient(total_loss, self.trainable_weights)
            self.optimizer.apply_gradients(zip(grads, self.trainable_weights, strict=True))
            self.total_loss_tracker.update_state(total_loss)
            self.reconstruction_loss_tracker.update_state(reconstruction_loss)
            self.kl_loss_tracker.update_state(kl_loss)
            return {
                "loss": self.total_loss_tracker.result(),
                "reconstruction_loss": self.reconstruction_loss_tracker.result(),
                "kl_loss": self.kl_loss_tracker.result(),
            }

    with np.load(os.path.join(workdir, "digits.npz")) as f:
        mnist_digits, epsilon = f["digits"], f["epsilon"]
    mnist_digits = np.expand_dims(mnist_digits, -1).astype("float32")
    epsilon = epsilon.astype("float32")

    with strategy.scope():
        vae = VAE(encoder, decoder)
        vae.compile(optimizer=keras.optimizers.Adam())
    train = mk.distribute((mnist_digits, epsilon), strategy, global_batch_size=32, shuffle=False)
    history = vae.fit(train, epochs=2)

    from keras_io import outcome

    return outcome(vae, history)
