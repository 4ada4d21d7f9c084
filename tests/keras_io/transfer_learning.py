# Transfer learning & fine-tuning: its end-to-end example, ported to mirrorkit.
#
# Original: https://keras.io/guides/transfer_learning/ (keras-io guides/transfer_learning.py),
# "An end-to-end example: fine-tuning an image classification model on a cats vs. dogs
# dataset": tf.data pipelines batched, prefetched and cached; a pretrained base model frozen
# (base_model.trainable = False) and called with training=False under a new head (Rescaling,
# GlobalAveragePooling2D, Dropout, Dense); compile and fit with validation_data; then
# base_model.trainable = True, compile again with a low learning rate, fit again (fine-tuning);
# evaluate.
#
# Changed in both functions (not for mirrorkit): stand-in data (`write_data`: mirrorkit's bundled
# 8x8 UCI digits scaled up to 16x16, as 3-channel images labelled "is it a digit below 5",
# instead of tfds cats_vs_dogs) and no data augmentation layers (RandomFlip and RandomRotation
# draw per replica); a small stand-in base model with BatchNormalization (two Conv2D blocks,
# seeded initial weights) instead of Xception with ImageNet weights, so input shape
# (16, 16, 3); batch_size 32 instead of 64; the Dropout rate DROPOUT = 0.0 instead of 0.2.
#
# Changed for mirrorkit (`ported` against `original`, LINES_CHANGED, counted by difflib):
# import mirrorkit; strategy = mk.strategy(...); `with strategy.scope():` around the models'
# construction and each compile (re-indented); the pipelines through mk.distribute; and
# mk.synchronize_batch_norm(base_model) after base_model.trainable = True, the fix mirrorkit's
# notice names at that fit: an unfrozen base's BatchNormalization layers train on batch
# statistics (even under base_model(x, training=False), keras-team/keras#20285), each replica's
# 16 images instead of the global 32.

import numpy as np

LINES_CHANGED = {"added": 49, "removed": 39, "reindented": 37}
DROPOUT = 0.0


def write_data(workdir):
    import os

    from mirrorkit.demo.data import load_digits

    images, labels = load_digits()
    images = np.kron(images[:448], np.ones((2, 2), "uint8")) * 15  # 8x8 in 0..16 -> 16x16
    images = np.stack([images] * 3, axis=-1)
    np.savez(
        os.path.join(workdir, "pets.npz"),
        images=images,
        labels=(labels[:448] < 5).astype("float32"),
    )


def original(workdir):
    import os

    import keras
    import numpy as np
    from keras import layers
    from tensorflow import data as tf_data

    with np.load(os.path.join(workdir, "pets.npz")) as f:
        images, labels = f["images"].astype("float32"), f["labels"]
    train_ds = tf_data.Dataset.from_tensor_slices((images[:320], labels[:320]))
    validation_ds = tf_data.Dataset.from_tensor_slices((images[320:384], labels[320:384]))
    test_ds = tf_data.Dataset.from_tensor_slices((images[384:], labels[384:]))

    batch_size = 32

    train_ds = train_ds.batch(batch_size).prefetch(tf_data.AUTOTUNE).cache()
    validation_ds = validation_ds.batch(batch_size).prefetch(tf_data.AUTOTUNE).cache()
    test_ds = test_ds.batch(batch_size).prefetch(tf_data.AUTOTUNE).cache()

    base_model = keras.Sequential(
        [
            keras.Input(shape=(16, 16, 3)),
            layers.Conv2D(8, 3, padding="same", use_bias=False),
            layers.BatchNormalization(),
            layers.Activation("relu"),
            layers.Conv2D(16, 3, strides=2, padding="same", use_bias=False),
            layers.BatchNormalization(),
            layers.Activation("relu"),
        ],
        name="base_model",
    )  # a stand-in for keras.applications.Xception(weights="imagenet", include_top=False)

    # Freeze the base_model
    base_model.trainable = False

    # Create new model on top
    inputs = keras.Input(shape=(16, 16, 3))

    # Pre-trained Xception weights requires that input be scaled
    # from (0, 255) to a range of (-1., +1.), the rescaling layer
    # outputs: `(inputs * scale) + offset`
    scale_layer = keras.layers.Rescaling(scale=1 / 127.5, offset=-1)
    x = scale_layer(inputs)

    # The base model contains batchnorm layers. We want to keep them in inference mode
    # when we unfreeze the base model for fine-tuning, so we make sure that the
    # base_model is running in inference mode here.
    x = base_model(x, training=False)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dropout(DROPOUT)(x)  # Regularize with dropout
    outputs = keras.layers.Dense(1)(x)
    model = keras.Model(inputs, outputs)

    model.compile(
        optimizer=keras.optimizers.Adam(),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
        metrics=[keras.metrics.BinaryAccuracy()],
    )

    epochs = 2
    first = model.fit(train_ds, epochs=epochs, validation_data=validation_ds)

    # Unfreeze the base_model. Note that it keeps running in inference mode
    # since we passed `training=False` when calling it. This means that
    # the batchnorm layers will not update their batch statistics.
    # This prevents the batchnorm layers from undoing all the training
    # we've done so far.
    base_model.trainable = True

    model.compile(
        optimizer=keras.optimizers.Adam(1e-5),  # Low learning rate
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
        metrics=[keras.metrics.BinaryAccuracy()],
    )

    epochs = 1
    history = model.fit(train_ds, epochs=epochs, validation_data=validation_ds)
    test = model.evaluate(test_ds)

    from keras_io import outcome

    return outcome(
        model,
        history,
        frozen_loss=first.history["loss"],
        frozen_val_loss=first.history["val_loss"],
        test=test,
    )


def ported(workdir, cpu_replicas):
    import os

    import keras
    import numpy as np
    from keras import layers
    from tensorflow import data as tf_data

    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=cpu_replicas)

    with np.load(os.path.join(workdir, "pets.npz")) as f:
        images, labels = f["images"].astype("float32"), f["labels"]
    train_ds = tf_data.Dataset.from_tensor_slices((images[:320], labels[:320]))
    validation_ds = tf_data.Dataset.from_tensor_slices((images[320:384], labels[320:384]))
    test_ds = tf_data.Dataset.from_tensor_slices((images[384:], labels[384:]))

    batch_size = 32

    train_ds = train_ds.batch(batch_size).prefetch(tf_data.AUTOTUNE).cache()
    validation_ds = validation_ds.batch(batch_size).prefetch(tf_data.AUTOTUNE).cache()
    test_ds = test_ds.batch(batch_size).prefetch(tf_data.AUTOTUNE).cache()

    with strategy.scope():
        base_model = keras.Sequential(
            [
                keras.Input(shape=(16, 16, 3)),
                layers.Conv2D(8, 3, padding="same", use_bias=False),
                layers.BatchNormalization(),
                layers.Activation("relu"),
                layers.Conv2D(16, 3, strides=2, padding="same", use_bias=False),
                layers.BatchNormalization(),
                layers.Activation("relu"),
            ],
            name="base_model",
        )  # a stand-in for keras.applications.Xception(weights="imagenet", include_top=False)

    # Freeze the base_model
    base_model.trainable = False

    with strategy.scope():
        # Create new model on top
        inputs = keras.Input(shape=(16, 16, 3))

        # Pre-trained Xception weights requires that input be scaled
        # from (0, 255) to a range of (-1., +1.), the rescaling layer
        # outputs: `(inputs * scale) + offset`
        scale_layer = keras.layers.Rescaling(scale=1 / 127.5, offset=-1)
        x = scale_layer(inputs)

        # The base model contains batchnorm layers. We want to keep them in inference mode
        # when we unfreeze the base model for fine-tuning, so we make sure that the
        # base_model is running in inference mode here.
        x = base_model(x, training=False)
        x = keras.layers.GlobalAveragePooling2D()(x)
        x = keras.layers.Dropout(DROPOUT)(x)  # Regularize with dropout
        outputs = keras.layers.Dense(1)(x)
        model = keras.Model(inputs, outputs)

        model.compile(
            optimizer=keras.optimizers.Adam(),
            loss=keras.losses.BinaryCrossentropy(from_logits=True),
            metrics=[keras.metrics.BinaryAccuracy()],
        )

    epochs = 2
    first = model.fit(
        mk.distribute(train_ds, strategy), epochs=epochs, validation_data=validation_ds
    )

    # Unfreeze the base_model. Note that it keeps running in inference mode
    # since we passed `training=False` when calling it. This means that
    # the batchnorm layers will not update their batch statistics.
    # This prevents the batchnorm layers from undoing all the training
    # we've done so far.
    base_model.trainable = True
    mk.synchronize_batch_norm(base_model)

    with strategy.scope():
        model.compile(
            optimizer=keras.optimizers.Adam(1e-5),  # Low learning rate
            loss=keras.losses.BinaryCrossentropy(from_logits=True),
            metrics=[keras.metrics.BinaryAccuracy()],
        )

    epochs = 1
    history = model.fit(
        mk.distribute(train_ds, strategy), epochs=epochs, validation_data=validation_ds
    )
    test = model.evaluate(test_ds)

    from keras_io import outcome

    return outcome(
        model,
        history,
        frozen_loss=first.history["loss"],
        frozen_val_loss=first.history["val_loss"],
        test=test,
    )
