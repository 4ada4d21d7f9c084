# WGAN-GP overriding Model.train_step, ported to mirrorkit.
#
# Original: https://keras.io/examples/generative/wgan_gp/ (keras-io examples/generative/
# wgan_gp.py): a Conv2D critic and an UpSampling2D generator with BatchNormalization built from
# conv_block/upsample_block helpers; a WGAN keras.Model with no call(), whose compile() takes
# d_optimizer, g_optimizer, d_loss_fn and g_loss_fn (tf.reduce_mean expressions) and whose
# train_step trains the critic discriminator_extra_steps times, each with a gradient penalty
# from a nested GradientTape, then the generator; Adam(beta_1=0.5, beta_2=0.9); fit on NumPy
# images with batch_size.
#
# Changed in both functions (not for mirrorkit): stand-in data (`write_data`: mirrorkit's bundled
# 8x8 UCI digits scaled up to 16x16 in [-1, 1], instead of the Fashion-MNIST download), so
# IMG_SHAPE (16, 16, 1), no ZeroPadding2D/Cropping2D, and smaller layers (filters 8-32,
# noise_dim 8); the random draws (each critic step's latent batch and interpolation weights,
# and the generator's latent batch) made once with NumPy and passed with the images (fit(x, y)
# with y a dict of draws) instead of tf.random.normal/uniform in train_step (each replica would
# draw its own); the Dropout rate DROPOUT = 0.0 instead of 0.3/0.2; 128 images, BATCH_SIZE 32,
# 2 epochs instead of 20; shuffle=False so that one device and the replicas see the same batches;
# no GANMonitor callback (it plots).
#
# Changed for mirrorkit (`ported` against `original`, LINES_CHANGED, counted by difflib):
# import mirrorkit; strategy = mk.strategy(...); `with strategy.scope():` around the models'
# construction and the WGAN's compile (re-indented); mk.synchronize_batch_norm(g_model), which
# mirrorkit's notice at fit names (the generator's BatchNormalization layers would otherwise
# normalise each replica's 16 images, not the global 32); the arrays through mk.distribute.
# The train_step is unchanged: inside fit its hand-reduced losses are one device's and the
# gradients are averaged (plain Keras under a strategy trains it at N times the gradient).

import numpy as np

LINES_CHANGED = {"added": 33, "removed": 21, "reindented": 21}
DROPOUT = 0.0
NUM_IMAGES = 128
NOISE_DIM = 8
D_STEPS = 3


def write_data(workdir):
    import os

    from mirrorkit.demo.data import load_digits

    images, _ = load_digits()
    images = np.kron(images[:NUM_IMAGES], np.ones((2, 2), "uint8")) * 15  # 16x16 in 0..240
    rng = np.random.default_rng(0)
    np.savez(
        os.path.join(workdir, "images.npz"),
        train_images=images,
        latent=rng.normal(size=(NUM_IMAGES, D_STEPS + 1, NOISE_DIM)),
        alpha=rng.uniform(size=(NUM_IMAGES, D_STEPS, 1, 1, 1)),
    )


def original(workdir):
    import os

    import keras
    import numpy as np
    import tensorflow as tf
    from keras import layers

    IMG_SHAPE = (16, 16, 1)
    BATCH_SIZE = 32
    noise_dim = NOISE_DIM

    with np.load(os.path.join(workdir, "images.npz")) as f:
        train_images = f["train_images"]
        draws = {"latent": f["latent"].astype("float32"), "alpha": f["alpha"].astype("float32")}
    train_images = train_images.reshape(train_images.shape[0], *IMG_SHAPE).astype("float32")
    train_images = (train_images - 127.5) / 127.5

    def conv_block(
        x,
        filters,
        activation,
        kernel_size=(3, 3),
        strides=(1, 1),
        padding="same",
        use_bias=True,
        use_bn=False,
        use_dropout=False,
        drop_value=0.5,
    ):
        x = layers.Conv2D(
            filters, kernel_size, strides=strides, padding=padding, use_bias=use_bias
        )(x)
        if use_bn:
            x = layers.BatchNormalization()(x)
        x = activation(x)
        if use_dropout:
            x = layers.Dropout(drop_value)(x)
        return x

    def get_discriminator_model():
        img_input = layers.Input(shape=IMG_SHAPE)
        x = conv_block(
            img_input,
            8,
            kernel_size=(5, 5),
            strides=(2, 2),
            use_bn=False,
            use_bias=True,
            activation=layers.LeakyReLU(0.2),
            use_dropout=False,
            drop_value=DROPOUT,
        )
        x = conv_block(
            x,
            16,
            kernel_size=(5, 5),
            strides=(2, 2),
            use_bn=False,
            activation=layers.LeakyReLU(0.2),
            use_bias=True,
            use_dropout=True,
            drop_value=DROPOUT,
        )
        x = layers.Flatten()(x)
        x = layers.Dropout(DROPOUT)(x)
        x = layers.Dense(1)(x)
        d_model = keras.models.Model(img_input, x, name="discriminator")
        return d_model

    d_model = get_discriminator_model()

    def upsample_block(
        x,
        filters,
        activation,
        kernel_size=(3, 3),
        strides=(1, 1),
        up_size=(2, 2),
        padding="same",
        use_bn=False,
        use_bias=True,
        use_dropout=False,
        drop_value=0.3,
    ):
        x = layers.UpSampling2D(up_size)(x)
        x = layers.Conv2D(
            filters, kernel_size, strides=strides, padding=padding, use_bias=use_bias
        )(x)
        if use_bn:
            x = layers.BatchNormalization()(x)
        if activation:
            x = activation(x)
        if use_dropout:
            x = layers.Dropout(drop_value)(x)
        return x

    def get_generator_model():
        noise = layers.Input(shape=(noise_dim,))
        x = layers.Dense(4 * 4 * 32, use_bias=False)(noise)
        x = layers.BatchNormalization()(x)
        x = layers.LeakyReLU(0.2)(x)
        x = layers.Reshape((4, 4, 32))(x)
        x = upsample_block(
            x,
            16,
            layers.LeakyReLU(0.2),
            strides=(1, 1),
            use_bias=False,
            use_bn=True,
            padding="same",
            use_dropout=False,
        )
        x = upsample_block(
            x, 1, layers.Activation("tanh"), strides=(1, 1), use_bias=False, use_bn=True
        )
        g_model = keras.models.Model(noise, x, name="generator")
        return g_model

    g_model = get_generator_model()

    class WGAN(keras.Model):
        def __init__(
            self,
            discriminator,
            generator,
            latent_dim,
            discriminator_extra_steps=3,
            gp_weight=10.0,
        ):
            super().__init__()
            self.discriminator = discriminator
            self.generator = generator
            self.latent_dim = latent_dim
            self.d_steps = discriminator_extra_steps
            self.gp_weight = gp_weight

        def compile(self, d_optimizer, g_optimizer, d_loss_fn, g_loss_fn):
            super().compile()
            self.d_optimizer = d_optimizer
            self.g_optimizer = g_optimizer
            self.d_loss_fn = d_loss_fn
            self.g_loss_fn = g_loss_fn

        def gradient_penalty(self, batch_size, real_images, fake_images, alpha):
            """Calculates the gradient penalty.

            This loss is calculated on an interpolated image
            and added to the discriminator loss.
            """
            # Get the interpolated image
            diff = fake_images - real_images
            interpolated = real_images + alpha * diff

            with tf.GradientTape() as gp_tape:
                gp_tape.watch(interpolated)
                # 1. Get the discriminator output for this interpolated image.
                pred = self.discriminator(interpolated, training=True)

            # 2. Calculate the gradients w.r.t to this interpolated image.
            grads = gp_tape.gradient(pred, [interpolated])[0]
            # 3. Calculate the norm of the gradients.
            norm = tf.sqrt(tf.reduce_sum(tf.square(grads), axis=[1, 2, 3]))
            gp = tf.reduce_mean((norm - 1.0) ** 2)
            return gp

        def train_step(self, data):
            real_images, draws = data

            # Get the batch size
            batch_size = tf.shape(real_images)[0]

            # For each batch, we are going to perform the
            # following steps as laid out in the original paper:
            # 1. Train the generator and get the generator loss
            # 2. Train the discriminator and get the discriminator loss
            # 3. Calculate the gradient penalty
            # 4. Multiply this gradient penalty with a constant weight factor
            # 5. Add the gradient penalty to the discriminator loss
            # 6. Return the generator and discriminator losses as a loss dictionary

            # Train the discriminator first. The original paper recommends training
            # the discriminator for `x` more steps (typically 5) as compared to
            # one step of the generator. Here we will train it for 3 extra steps
            # as compared to 5 to reduce the training time.
            for i in range(self.d_steps):
                # Get the latent vector
                random_latent_vectors = draws["latent"][:, i]
                with tf.GradientTape() as tape:
                    # Generate fake images from the latent vector
                    fake_images = self.generator(random_latent_vectors, training=True)
                    # Get the logits for the fake images
                    fake_logits = self.discriminator(fake_images, training=True)
                    # Get the logits for the real images
                    real_logits = self.discriminator(real_images, training=True)

                    # Calculate the discriminator loss using the fake and real image logits
                    d_cost = self.d_loss_fn(real_img=real_logits, fake_img=fake_logits)
                    # Calculate the gradient penalty
                    gp = self.gradient_penalty(
                        batch_size, real_images, fake_images, draws["alpha"][:, i]
                    )
                    # Add the gradient penalty to the original discriminator loss
                    d_loss = d_cost + gp * self.gp_weight

                # Get the gradients w.r.t the discriminator loss
                d_gradient = tape.gradient(d_loss, self.discriminator.trainable_variables)
                # Update the weights of the discriminator using the discriminator optimizer
                self.d_optimizer.apply_gradients(
                    zip(d_gradient, self.discriminator.trainable_variables, strict=True)
                )

            # Train the generator
            # Get the latent vector
            random_latent_vectors = draws["latent"][:, self.d_steps]
            with tf.GradientTape() as tape:
                # Generate fake images using the generator
                generated_images = self.generator(random_latent_vectors, training=True)
                # Get the discriminator logits for fake images
                gen_img_logits = self.discriminator(generated_images, training=True)
                # Calculate the generator loss
                g_loss = self.g_loss_fn(gen_img_logits)

            # Get the gradients w.r.t the generator loss
            gen_gradient = tape.gradient(g_loss, self.generator.trainable_variables)
            # Update the weights of the generator using the generator optimizer
            self.g_optimizer.apply_gradients(
                zip(gen_gradient, self.generator.trainable_variables, strict=True)
            )
            return {"d_loss": d_loss, "g_loss": g_loss}

    # Instantiate the optimizer for both networks
    # (learning_rate=0.0002, beta_1=0.5 are recommended)
    generator_optimizer = keras.optimizers.Adam(learning_rate=0.0002, beta_1=0.5, beta_2=0.9)
    discriminator_optimizer = keras.optimizers.Adam(learning_rate=0.0002, beta_1=0.5, beta_2=0.9)

    # Define the loss functions for the discriminator,
    # which should be (fake_loss - real_loss).
    # We will add the gradient penalty later to this loss function.
    def discriminator_loss(real_img, fake_img):
        real_loss = tf.reduce_mean(real_img)
        fake_loss = tf.reduce_mean(fake_img)
        return fake_loss - real_loss

    # Define the loss functions for the generator.
    def generator_loss(fake_img):
        return -tf.reduce_mean(fake_img)

    # Set the number of epochs for training.
    epochs = 2

    # Get the wgan model
    wgan = WGAN(
        discriminator=d_model,
        generator=g_model,
        latent_dim=noise_dim,
        discriminator_extra_steps=D_STEPS,
    )

    # Compile the wgan model
    wgan.compile(
        d_optimizer=discriminator_optimizer,
        g_optimizer=generator_optimizer,
        g_loss_fn=generator_loss,
        d_loss_fn=discriminator_loss,
    )

    # Start training
    history = wgan.fit(train_images, draws, batch_size=BATCH_SIZE, epochs=epochs, shuffle=False)

    from keras_io import outcome

    return outcome(wgan, history)


def ported(workdir, cpu_replicas):
    import os

    import keras
    import numpy as np
    import tensorflow as tf
    from keras import layers

    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=cpu_replicas)

    IMG_SHAPE = (16, 16, 1)
    BATCH_SIZE = 32
    noise_dim = NOISE_DIM

    with np.load(os.path.join(workdir, "images.npz")) as f:
        train_images = f["train_images"]
        draws = {"latent": f["latent"].astype("float32"), "alpha": f["alpha"].astype("float32")}
    train_images = train_images.reshape(train_images.shape[0], *IMG_SHAPE).astype("float32")
    train_images = (train_images - 127.5) / 127.5

    def conv_block(
        x,
        filters,
        activation,
        kernel_size=(3, 3),
        strides=(1, 1),
        padding="same",
        use_bias=True,
        use_bn=False,
        use_dropout=False,
        drop_value=0.5,
    ):
        x = layers.Conv2D(
            filters, kernel_size, strides=strides, padding=padding, use_bias=use_bias
        )(x)
        if use_bn:
            x = layers.BatchNormalization()(x)
        x = activation(x)
        if use_dropout:
            x = layers.Dropout(drop_value)(x)
        return x

    def get_discriminator_model():
        img_input = layers.Input(shape=IMG_SHAPE)
        x = conv_block(
            img_input,
            8,
            kernel_size=(5, 5),
            strides=(2, 2),
            use_bn=False,
            use_bias=True,
            activation=layers.LeakyReLU(0.2),
            use_dropout=False,
            drop_value=DROPOUT,
        )
        x = conv_block(
            x,
            16,
            kernel_size=(5, 5),
            strides=(2, 2),
            use_bn=False,
            activation=layers.LeakyReLU(0.2),
            use_bias=True,
            use_dropout=True,
            drop_value=DROPOUT,
        )
        x = layers.Flatten()(x)
        x = layers.Dropout(DROPOUT)(x)
        x = layers.Dense(1)(x)
        d_model = keras.models.Model(img_input, x, name="discriminator")
        return d_model

    with strategy.scope():
        d_model = get_discriminator_model()

    def upsample_block(
        x,
        filters,
        activation,
        kernel_size=(3, 3),
        strides=(1, 1),
        up_size=(2, 2),
        padding="same",
        use_bn=False,
        use_bias=True,
        use_dropout=False,
        drop_value=0.3,
    ):
        x = layers.UpSampling2D(up_size)(x)
        x = layers.Conv2D(
            filters, kernel_size, strides=strides, padding=padding, use_bias=use_bias
        )(x)
        if use_bn:
            x = layers.BatchNormalization()(x)
        if activation:
            x = activation(x)
        if use_dropout:
            x = layers.Dropout(drop_value)(x)
        return x

    def get_generator_model():
        noise = layers.Input(shape=(noise_dim,))
        x = layers.Dense(4 * 4 * 32, use_bias=False)(noise)
        x = layers.BatchNormalization()(x)
        x = layers.LeakyReLU(0.2)(x)
        x = layers.Reshape((4, 4, 32))(x)
        x = upsample_block(
            x,
            16,
            layers.LeakyReLU(0.2),
            strides=(1, 1),
            use_bias=False,
            use_bn=True,
            padding="same",
            use_dropout=False,
        )
        x = upsample_block(
            x, 1, layers.Activation("tanh"), strides=(1, 1), use_bias=False, use_bn=True
        )
        g_model = keras.models.Model(noise, x, name="generator")
        return g_model

    with strategy.scope():
        g_model = get_generator_model()
    mk.synchronize_batch_norm(g_model)

    class WGAN(keras.Model):
        def __init__(
            self,
            discriminator,
            generator,
            latent_dim,
            discriminator_extra_steps=3,
            gp_weight=10.0,
        ):
            super().__init__()
            self.discriminator = discriminator
            self.generator = generator
            self.latent_dim = latent_dim
            self.d_steps = discriminator_extra_steps
            self.gp_weight = gp_weight

        def compile(self, d_optimizer, g_optimizer, d_loss_fn, g_loss_fn):
            super().compile()
            self.d_optimizer = d_optimizer
            self.g_optimizer = g_optimizer
            self.d_loss_fn = d_loss_fn
            self.g_loss_fn = g_loss_fn

        def gradient_penalty(self, batch_size, real_images, fake_images, alpha):
            """Calculates the gradient penalty.

            This loss is calculated on an interpolated image
            and added to the discriminator loss.
            """
            # Get the interpolated image
            diff = fake_images - real_images
            interpolated = real_images + alpha * diff

            with tf.GradientTape() as gp_tape:
                gp_tape.watch(interpolated)
                # 1. Get the discriminator output for this interpolated image.
                pred = self.discriminator(interpolated, training=True)

            # 2. Calculate the gradients w.r.t to this interpolated image.
            grads = gp_tape.gradient(pred, [interpolated])[0]
            # 3. Calculate the norm of the gradients.
            norm = tf.sqrt(tf.reduce_sum(tf.square(grads), axis=[1, 2, 3]))
            gp = tf.reduce_mean((norm - 1.0) ** 2)
            return gp

        def train_step(self, data):
            real_images, draws = data

            # Get the batch size
            batch_size = tf.shape(real_images)[0]

            # For each batch, we are going to perform the
            # following steps as laid out in the original paper:
            # 1. Train the generator and get the generator loss
            # 2. Train the discriminator and get the discriminator loss
            # 3. Calculate the gradient penalty
            # 4. Multiply this gradient penalty with a constant weight factor
            # 5. Add the gradient penalty to the discriminator loss
            # 6. Return the generator and discriminator losses as a loss dictionary

            # Train the discriminator first. The original paper recommends training
            # the discriminator for `x` more steps (typically 5) as compared to
            # one step of the generator. Here we will train it for 3 extra steps
            # as compared to 5 to reduce the training time.
            for i in range(self.d_steps):
                # Get the latent vector
                random_latent_vectors = draws["latent"][:, i]
                with tf.GradientTape() as tape:
                    # Generate fake images from the latent vector
                    fake_images = self.generator(random_latent_vectors, training=True)
                    # Get the logits for the fake images
                    fake_logits = self.discriminator(fake_images, training=True)
                    # Get the logits for the real images
                    real_logits = self.discriminator(real_images, training=True)

                    # Calculate the discriminator loss using the fake and real image logits
                    d_cost = self.d_loss_fn(real_img=real_logits, fake_img=fake_logits)
                    # Calculate the gradient penalty
                    gp = self.gradient_penalty(
                        batch_size, real_images, fake_images, draws["alpha"][:, i]
                    )
                    # Add the gradient penalty to the original discriminator loss
                    d_loss = d_cost + gp * self.gp_weight

                # Get the gradients w.r.t the discriminator loss
                d_gradient = tape.gradient(d_loss, self.discriminator.trainable_variables)
                # Update the weights of the discriminator using the discriminator optimizer
                self.d_optimizer.apply_gradients(
                    zip(d_gradient, self.discriminator.trainable_variables, strict=True)
                )

            # Train the generator
            # Get the latent vector
            random_latent_vectors = draws["latent"][:, self.d_steps]
            with tf.GradientTape() as tape:
                # Generate fake images using the generator
                generated_images = self.generator(random_latent_vectors, training=True)
                # Get the discriminator logits for fake images
                gen_img_logits = self.discriminator(generated_images, training=True)
                # Calculate the generator loss
                g_loss = self.g_loss_fn(gen_img_logits)

            # Get the gradients w.r.t the generator loss
            gen_gradient = tape.gradient(g_loss, self.generator.trainable_variables)
            # Update the weights of the generator using the generator optimizer
            self.g_optimizer.apply_gradients(
                zip(gen_gradient, self.generator.trainable_variables, strict=True)
            )
            return {"d_loss": d_loss, "g_loss": g_loss}

    with strategy.scope():
        # Instantiate the optimizer for both networks
        # (learning_rate=0.0002, beta_1=0.5 are recommended)
        generator_optimizer = keras.optimizers.Adam(learning_rate=0.0002, beta_1=0.5, beta_2=0.9)
        discriminator_optimizer = keras.optimizers.Adam(
            learning_rate=0.0002, beta_1=0.5, beta_2=0.9
        )

    # Define the loss functions for the discriminator,
    # which should be (fake_loss - real_loss).
    # We will add the gradient penalty later to this loss function.
    def discriminator_loss(real_img, fake_img):
        real_loss = tf.reduce_mean(real_img)
        fake_loss = tf.reduce_mean(fake_img)
        return fake_loss - real_loss

    # Define the loss functions for the generator.
    def generator_loss(fake_img):
        return -tf.reduce_mean(fake_img)

    # Set the number of epochs for training.
    epochs = 2

    with strategy.scope():
        # Get the wgan model
        wgan = WGAN(
            discriminator=d_model,
            generator=g_model,
            latent_dim=noise_dim,
            discriminator_extra_steps=D_STEPS,
        )

        # Compile the wgan model
        wgan.compile(
            d_optimizer=discriminator_optimizer,
            g_optimizer=generator_optimizer,
            g_loss_fn=generator_loss,
            d_loss_fn=discriminator_loss,
        )

    # Start training
    train = mk.distribute(
        (train_images, draws), strategy, global_batch_size=BATCH_SIZE, shuffle=False
    )
    history = wgan.fit(train, epochs=epochs)

    from keras_io import outcome

    return outcome(wgan, history)
