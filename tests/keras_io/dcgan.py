# DCGAN to generate face images, ported to mirrorkit.
#
# Original: https://keras.io/examples/generative/dcgan_overriding_train_step/
# (keras-io examples/generative/dcgan_overriding_train_step.py): images from
# image_dataset_from_directory(label_mode=None) scaled to [0, 1]; a Conv2D discriminator and a
# Conv2DTranspose generator; a GAN keras.Model with no call(), whose compile() takes d_optimizer,
# g_optimizer and loss_fn (a keras.losses.BinaryCrossentropy object) and whose train_step trains
# the discriminator, then the generator, with two GradientTapes, tracking both losses in
# keras.metrics.Mean; fit.
#
# Changed in both functions (not for mirrorkit): stand-in data (`write_data`: 64 PNG images made
# of mirrorkit's bundled 8x8 UCI digits scaled up to 16x16, instead of the CelebA download), so
# image_size (16, 16) and smaller layers (filters 8-16, latent_dim 8, a 4x4 start); batch_size 16;
# shuffle=False in image_dataset_from_directory so that one device and the replicas see the same
# batches; the random draws (the two latent batches and the label noise) made once with NumPy and
# zipped with the images instead of drawn in train_step (each replica would draw its own); the
# discriminator's Dropout rate DROPOUT = 0.0 instead of 0.2; no GANMonitor callback (it plots);
# 2 epochs instead of 1.
#
# Changed for mirrorkit (`ported` against `original`, LINES_CHANGED, counted by difflib):
# import mirrorkit; strategy = mk.strategy(...); `with strategy.scope():` around the models'
# construction and the GAN's compile (re-indented); the dataset through mk.distribute. The
# train_step is unchanged: inside fit its loss is one device's and the gradients are averaged.

import numpy as np

LINES_CHANGED = {"added": 38, "removed": 34, "reindented": 33}
DROPOUT = 0.0
NUM_IMAGES = 64
LATENT_DIM = 8


def write_data(workdir):
    import os

    from PIL import Image

    from mirrorkit.demo.data import load_digits

    images, _ = load_digits()
    os.makedirs(os.path.join(workdir, "celeba_gan"))
    for i, digit in enumerate(images[:NUM_IMAGES]):
        pixels = np.kron(digit, np.ones((2, 2), "uint8")) * 15  # 8x8 in 0..16 -> 16x16
        image = Image.fromarray(np.stack([pixels] * 3, axis=-1).astype("uint8"))
        image.save(os.path.join(workdir, "celeba_gan", f"{i:03d}.png"))
    rng = np.random.default_rng(0)
    np.savez(
        os.path.join(workdir, "draws.npz"),
        latent=rng.normal(size=(NUM_IMAGES, 2, LATENT_DIM)).astype("float32"),
        label_noise=rng.uniform(size=(NUM_IMAGES, 2, 1)).astype("float32"),
    )


def original(workdir):
    import os

    import keras
    import numpy as np
    import tensorflow as tf
    from keras import layers, ops

    dataset = keras.utils.image_dataset_from_directory(
        os.path.join(workdir, "celeba_gan"),
        label_mode=None,
        image_size=(16, 16),
        batch_size=16,
        shuffle=False,
    )
    dataset = dataset.map(lambda x: x / 255.0)
    with np.load(os.path.join(workdir, "draws.npz")) as f:
        draws = tf.data.Dataset.from_tensor_slices((f["latent"], f["label_noise"])).batch(16)
    dataset = tf.data.Dataset.zip(dataset, draws)

    discriminator = keras.Sequential(
        [
            keras.Input(shape=(16, 16, 3)),
            layers.Conv2D(8, kernel_size=4, strides=2, padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2D(16, kernel_size=4, strides=2, padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Flatten(),
            layers.Dropout(DROPOUT),
            layers.Dense(1, activation="sigmoid"),
        ],
        name="discriminator",
    )
    latent_dim = LATENT_DIM
    generator = keras.Sequential(
        [
            keras.Input(shape=(latent_dim,)),
            layers.Dense(4 * 4 * 16),
            layers.Reshape((4, 4, 16)),
            layers.Conv2DTranspose(16, kernel_size=4, strides=2, padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2DTranspose(8, kernel_size=4, strides=2, padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2D(3, kernel_size=5, padding="same", activation="sigmoid"),
        ],
        name="generator",
    )

    class GAN(keras.Model):
        def __init__(self, discriminator, generator, latent_dim):
            super().__init__()
            self.discriminator = discriminator
            self.generator = generator
            self.latent_dim = latent_dim

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
            real_images, (latent, label_noise) = data
            # Sample random points in the latent space
            batch_size = ops.shape(real_images)[0]
            random_latent_vectors = latent[:, 0]

            # Decode them to fake images
            generated_images = self.generator(random_latent_vectors)

            # Combine them with real images
            combined_images = ops.concatenate([generated_images, real_images], axis=0)

            # Assemble labels discriminating real from fake images
            labels = ops.concatenate(
                [ops.ones((batch_size, 1)), ops.zeros((batch_size, 1))], axis=0
            )
            # Add random noise to the labels - important trick!
            labels += 0.05 * ops.concatenate([label_noise[:, 0], label_noise[:, 1]], axis=0)

            # Train the discriminator
            with tf.GradientTape() as tape:
                predictions = self.discriminator(combined_images)
                d_loss = self.loss_fn(labels, predictions)
            grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
            self.d_optimizer.apply_gradients(
                zip(grads, self.discriminator.trainable_weights, strict=True)
            )

            # Sample random points in the latent space
            random_latent_vectors = latent[:, 1]

            # Assemble labels that say "all real images"
            misleading_labels = ops.zeros((batch_size, 1))

            # Train the generator (note that we should *not* update the weights
            # of the discriminator)!
            with tf.GradientTape() as tape:
                predictions = self.discriminator(self.generator(random_latent_vectors))
                g_loss = self.loss_fn(misleading_labels, predictions)
            grads = tape.gradient(g_loss, self.generator.trainable_weights)
            self.g_optimizer.apply_gradients(
                zip(grads, self.generator.trainable_weights, strict=True)
            )

            # Update metrics
            self.d_loss_metric.update_state(d_loss)
            self.g_loss_metric.update_state(g_loss)
            return {
                "d_loss": self.d_loss_metric.result(),
                "g_loss": self.g_loss_metric.result(),
            }

    epochs = 2

    gan = GAN(discriminator=discriminator, generator=generator, latent_dim=latent_dim)
    gan.compile(
        d_optimizer=keras.optimizers.Adam(learning_rate=0.0001),
        g_optimizer=keras.optimizers.Adam(learning_rate=0.0001),
        loss_fn=keras.losses.BinaryCrossentropy(),
    )

    history = gan.fit(dataset, epochs=epochs)

    from keras_io import outcome

    return outcome(gan, history)


def ported(workdir, cpu_replicas):
    import os

    import keras
    import numpy as np
    import tensorflow as tf
    from keras import layers, ops

    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=cpu_replicas)

    dataset = keras.utils.image_dataset_from_directory(
        os.path.join(workdir, "celeba_gan"),
        label_mode=None,
        image_size=(16, 16),
        batch_size=16,
        shuffle=False,
    )
    dataset = dataset.map(lambda x: x / 255.0)
    with np.load(os.path.join(workdir, "draws.npz")) as f:
        draws = tf.data.Dataset.from_tensor_slices((f["latent"], f["label_noise"])).batch(16)
    dataset = tf.data.Dataset.zip(dataset, draws)

    with strategy.scope():
        discriminator = keras.Sequential(
            [
                keras.Input(shape=(16, 16, 3)),
                layers.Conv2D(8, kernel_size=4, strides=2, padding="same"),
                layers.LeakyReLU(negative_slope=0.2),
                layers.Conv2D(16, kernel_size=4, strides=2, padding="same"),
                layers.LeakyReLU(negative_slope=0.2),
                layers.Flatten(),
                layers.Dropout(DROPOUT),
                layers.Dense(1, activation="sigmoid"),
            ],
            name="discriminator",
        )
        latent_dim = LATENT_DIM
        generator = keras.Sequential(
            [
                keras.Input(shape=(latent_dim,)),
                layers.Dense(4 * 4 * 16),
                layers.Reshape((4, 4, 16)),
                layers.Conv2DTranspose(16, kernel_size=4, strides=2, padding="same"),
                layers.LeakyReLU(negative_slope=0.2),
                layers.Conv2DTranspose(8, kernel_size=4, strides=2, padding="same"),
                layers.LeakyReLU(negative_slope=0.2),
                layers.Conv2D(3, kernel_size=5, padding="same", activation="sigmoid"),
            ],
            name="generator",
        )

    class GAN(keras.Model):
        def __init__(self, discriminator, generator, latent_dim):
            super().__init__()
            self.discriminator = discriminator
            self.generator = generator
            self.latent_dim = latent_dim

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
            real_images, (latent, label_noise) = data
            # Sample random points in the latent space
            batch_size = ops.shape(real_images)[0]
            random_latent_vectors = latent[:, 0]

            # Decode them to fake images
            generated_images = self.generator(random_latent_vectors)

            # Combine them with real images
            combined_images = ops.concatenate([generated_images, real_images], axis=0)

            # Assemble labels discriminating real from fake images
            labels = ops.concatenate(
                [ops.ones((batch_size, 1)), ops.zeros((batch_size, 1))], axis=0
            )
            # Add random noise to the labels - important trick!
            labels += 0.05 * ops.concatenate([label_noise[:, 0], label_noise[:, 1]], axis=0)

            # Train the discriminator
            with tf.GradientTape() as tape:
                predictions = self.discriminator(combined_images)
                d_loss = self.loss_fn(labels, predictions)
            grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
            self.d_optimizer.apply_gradients(
                zip(grads, self.discriminator.trainable_weights, strict=True)
            )

            # Sample random points in the latent space
            random_latent_vectors = latent[:, 1]

            # Assemble labels that say "all real images"
            misleading_labels = ops.zeros((batch_size, 1))

            # Train the generator (note that we should *not* update the weights
            # of the discriminator)!
            with tf.GradientTape() as tape:
                predictions = self.discriminator(self.generator(random_latent_vectors))
                g_loss = self.loss_fn(misleading_labels, predictions)
            grads = tape.gradient(g_loss, self.generator.trainable_weights)
            self.g_optimizer.apply_gradients(
                zip(grads, self.generator.trainable_weights, strict=True)
            )

            # Update metrics
            self.d_loss_metric.update_state(d_loss)
            self.g_loss_metric.update_state(g_loss)
            return {
                "d_loss": self.d_loss_metric.result(),
                "g_loss": self.g_loss_metric.result(),
            }

    epochs = 2

    with strategy.scope():
        gan = GAN(discriminator=discriminator, generator=generator, latent_dim=latent_dim)
        gan.compile(
            d_optimizer=keras.optimizers.Adam(learning_rate=0.0001),
            g_optimizer=keras.optimizers.Adam(learning_rate=0.0001),
            loss_fn=keras.losses.BinaryCrossentropy(),
        )

    history = gan.fit(mk.distribute(dataset, strategy), epochs=epochs)

    from keras_io import outcome

    return outcome(gan, history)
