# Making new layers and models via subclassing: its end-to-end example, ported to mirrorkit.
#
# Original: https://keras.io/guides/making_new_layers_and_models_via_subclassing/
# (keras-io guides/making_new_layers_and_models_via_subclassing.py), "Putting it all together:
# an end-to-end example": Sampling, Encoder and Decoder layers, and a VariationalAutoEncoder
# keras.Model whose call() adds its KL divergence with self.add_loss (a tf.reduce_mean over the
# batch); compile(Adam, loss=MeanSquaredError()); fit(x_train, x_train).
#
# Changed in both functions (not for mirrorkit): stand-in data (`write_data`: mirrorkit's
# bundled 8x8 UCI digits flattened, 64 values in [0, 1], instead of the MNIST download), so
# original_dim 64 and intermediate_dim 32, latent_dim 8; the sampling noise epsilon is an input
# drawn once with NumPy (the model is called on (x, epsilon)) instead of keras.random.normal in
# the Sampling layer (each replica would draw its own); 512 digits; batch_size 32 instead of 64;
# fit(shuffle=False) so that one device and the replicas see the same batches.
#
# Changed for mirrorkit (`ported` against `original`, LINES_CHANGED, counted by difflib):
# import mirrorkit; strategy = mk.strategy(...); `with strategy.scope():` around the model's
# construction and compile (re-indented); the arrays through mk.distribute.

import numpy as np

LINES_CHANGED = {"added": 11, "removed": 5, "reindented": 4}
NUM_DIGITS = 512
LATENT_DIM = 8


def write_data(workdir):
    import os

    from mirrorkit.demo.data import load_digits

    images, _ = load_digits()
    epsilon = np.random.default_rng(0).normal(size=(NUM_DIGITS, LATENT_DIM))
    np.savez(os.path.join(workdir, "digits.npz"), x=images[:NUM_DIGITS], epsilon=epsilon)


def original(workdir):
    import os

    import keras
    import numpy as np
    import tensorflow as tf
    from keras import layers

    class Sampling(layers.Layer):
        """Uses (z_mean, z_log_var) to sample z, the vector encoding a digit."""

        def call(self, inputs):
            z_mean, z_log_var, epsilon = inputs
            return z_mean + tf.exp(0.5 * z_log_var) * epsilon

    class Encoder(layers.Layer):
        """Maps MNIST digits to a triplet (z_mean, z_log_var, z)."""

        def __init__(self, latent_dim=32, intermediate_dim=64, name="encoder", **kwargs):
            super().__init__(name=name, **kwargs)
            self.dense_proj = layers.Dense(intermediate_dim, activation="relu")
            self.dense_mean = layers.Dense(latent_dim)
            self.dense_log_var = layers.Dense(latent_dim)
            self.sampling = Sampling()

        def call(self, inputs, epsilon):
            x = self.dense_proj(inputs)
            z_mean = self.dense_mean(x)
            z_log_var = self.dense_log_var(x)
            z = self.sampling((z_mean, z_log_var, epsilon))
            return z_mean, z_log_var, z

    class Decoder(layers.Layer):
        """Converts z, the encoded digit vector, back into a readable digit."""

        def __init__(self, original_dim, intermediate_dim=64, name="decoder", **kwargs):
            super().__init__(name=name, **kwargs)
            self.dense_proj = layers.Dense(intermediate_dim, activation="relu")
            self.dense_output = layers.Dense(original_dim, activation="sigmoid")

        def call(self, inputs):
            x = self.dense_proj(inputs)
            return self.dense_output(x)

    class VariationalAutoEncoder(keras.Model):
        """Combines the encoder and decoder into an end-to-end model for training."""

        def __init__(
            self,
            original_dim,
            intermediate_dim=64,
            latent_dim=32,
            name="autoencoder",
            **kwargs,
        ):
            super().__init__(name=name, **kwargs)
            self.original_dim = original_dim
            self.encoder = Encoder(latent_dim=latent_dim, intermediate_dim=intermediate_dim)
            self.decoder = Decoder(original_dim, intermediate_dim=intermediate_dim)

        def call(self, inputs):
            inputs, epsilon = inputs
            z_mean, z_log_var, z = self.encoder(inputs, epsilon)
            reconstructed = self.decoder(z)
            # Add KL divergence regularization loss.
            kl_loss = -0.5 * tf.reduce_mean(z_log_var - tf.square(z_mean) - tf.exp(z_log_var) + 1)
            self.add_loss(kl_loss)
            return reconstructed

    with np.load(os.path.join(workdir, "digits.npz")) as f:
        x_train, epsilon = f["x"], f["epsilon"].astype("float32")
    x_train = x_train.reshape(NUM_DIGITS, 64).astype("float32") / 16

    original_dim = 64
    vae = VariationalAutoEncoder(original_dim, 32, LATENT_DIM)

    optimizer = keras.optimizers.Adam(learning_rate=1e-3)
    vae.compile(optimizer, loss=keras.losses.MeanSquaredError())

    history = vae.fit((x_train, epsilon), x_train, epochs=2, batch_size=32, shuffle=False)

    from keras_io import outcome

    return outcome(vae, history)


def ported(workdir, cpu_replicas):
    import os

    import keras
    import numpy as np
    import tensorflow as tf
    from keras import layers

    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=cpu_replicas)

    class Sampling(layers.Layer):
        """Uses (z_mean, z_log_var) to sample z, the vector encoding a digit."""

        def call(self, inputs):
            z_mean, z_log_var, epsilon = inputs
            return z_mean + tf.exp(0.5 * z_log_var) * epsilon

    class Encoder(layers.Layer):
        """Maps MNIST digits to a triplet (z_mean, z_log_var, z)."""

        def __init__(self, latent_dim=32, intermediate_dim=64, name="encoder", **kwargs):
            super().__init__(name=name, **kwargs)
            self.dense_proj = layers.Dense(intermediate_dim, activation="relu")
            self.dense_mean = layers.Dense(latent_dim)
            self.dense_log_var = layers.Dense(latent_dim)
            self.sampling = Sampling()

        def call(self, inputs, epsilon):
            x = self.dense_proj(inputs)
            z_mean = self.dense_mean(x)
            z_log_var = self.dense_log_var(x)
            z = self.sampling((z_mean, z_log_var, epsilon))
            return z_mean, z_log_var, z

    class Decoder(layers.Layer):
        """Converts z, the encoded digit vector, back into a readable digit."""

        def __init__(self, original_dim, intermediate_dim=64, name="decoder", **kwargs):
            super().__init__(name=name, **kwargs)
            self.dense_proj = layers.Dense(intermediate_dim, activation="relu")
            self.dense_output = layers.Dense(original_dim, activation="sigmoid")

        def call(self, inputs):
            x = self.dense_proj(inputs)
            return self.dense_output(x)

    class VariationalAutoEncoder(keras.Model):
        """Combines the encoder and decoder into an end-to-end model for training."""

        def __init__(
            self,
            original_dim,
            intermediate_dim=64,
            latent_dim=32,
            name="autoencoder",
            **kwargs,
        ):
            super().__init__(name=name, **kwargs)
            self.original_dim = original_dim
            self.encoder = Encoder(latent_dim=latent_dim, intermediate_dim=intermediate_dim)
            self.decoder = Decoder(original_dim, intermediate_dim=intermediate_dim)

        def call(self, inputs):
            inputs, epsilon = inputs
            z_mean, z_log_var, z = self.encoder(inputs, epsilon)
            reconstructed = self.decoder(z)
            # Add KL divergence regularization loss.
            kl_loss = -0.5 * tf.reduce_mean(z_log_var - tf.square(z_mean) - tf.exp(z_log_var) + 1)
            self.add_loss(kl_loss)
            return reconstructed

    with np.load(os.path.join(workdir, "digits.npz")) as f:
        x_train, epsilon = f["x"], f["epsilon"].astype("float32")
    x_train = x_train.reshape(NUM_DIGITS, 64).astype("float32") / 16

    with strategy.scope():
        original_dim = 64
        vae = VariationalAutoEncoder(original_dim, 32, LATENT_DIM)

        optimizer = keras.optimizers.Adam(learning_rate=1e-3)
        vae.compile(optimizer, loss=keras.losses.MeanSquaredError())

    train = mk.distribute(
        ((x_train, epsilon), x_train), strategy, global_batch_size=32, shuffle=False
    )
    history = vae.fit(train, epochs=2)

    from keras_io import outcome

    return outcome(vae, history)
