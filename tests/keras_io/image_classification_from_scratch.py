# Image classification from scratch, ported to mirrorkit.
#
# Original: https://keras.io/examples/vision/image_classification_from_scratch/
# (keras-io examples/vision/image_classification_from_scratch.py, the Keras 3 version):
# image_dataset_from_directory(validation_split=0.2, subset="both"), RandomFlip and
# RandomRotation mapped over the training batches in tf.data, a small Xception-like network
# with BatchNormalization and Dropout, Adam, ModelCheckpoint, fit with validation_data.
#
# Changed in both functions (not for mirrorkit): stand-in data (`write_data`: 80 small JPEGs
# in PetImages/Cat and PetImages/Dog instead of the 786 MB Kaggle download, so no corrupted-file
# filter); image_size (32, 32) instead of (180, 180); batch_size 16 instead of 128; filters
# 128/256/512/728/1024 -> 8/16/24/32/48; 2 epochs instead of 25; no plots, no plot_model, no
# inference section; checkpoints written under workdir; Dropout rate DROPOUT = 0.0 instead of
# 0.25 (a dropout mask is drawn per replica, so N replicas cannot equal one device with it).
#
# Changed for mirrorkit (`ported` against `original`, LINES_CHANGED, counted by difflib):
# import mirrorkit; strategy = mk.strategy(...); `with strategy.scope():` around the lines
# from make_model to compile (re-indented); BatchNormalization(synchronized=True) in the four
# BatchNormalization lines (unsynchronized, each replica normalises its own half-batch); the
# training set through mk.distribute (its batches, order and shuffle kept: its batch is
# the global batch).

import numpy as np

LINES_CHANGED = {"added": 18, "removed": 15, "reindented": 10}
DROPOUT = 0.0
NUM_IMAGES = 40  # per class


def write_data(workdir):
    import os

    from PIL import Image

    rng = np.random.default_rng(0)
    for label, folder in enumerate(("Cat", "Dog")):
        os.makedirs(os.path.join(workdir, "PetImages", folder))
        for i in range(NUM_IMAGES):
            pixels = rng.normal(96 + 64 * label, 40, size=(40, 40, 3)).clip(0, 255)
            image = Image.fromarray(pixels.astype("uint8"))
            image.save(os.path.join(workdir, "PetImages", folder, f"{i}.jpg"), quality=90)


def original(workdir):
    import os

    import keras
    from keras import layers
    from tensorflow import data as tf_data

    image_size = (32, 32)
    batch_size = 16

    train_ds, val_ds = keras.utils.image_dataset_from_directory(
        os.path.join(workdir, "PetImages"),
        validation_split=0.2,
        subset="both",
        seed=1337,
        image_size=image_size,
        batch_size=batch_size,
    )

    data_augmentation_layers = [
        layers.RandomFlip("horizontal"),
        layers.RandomRotation(0.1),
    ]

    def data_augmentation(images):
        for layer in data_augmentation_layers:
            images = layer(images)
        return images

    # Apply `data_augmentation` to the training images.
    train_ds = train_ds.map(
        lambda img, label: (data_augmentation(img), label),
        num_parallel_calls=tf_data.AUTOTUNE,
    )
    # Prefetching samples in GPU memory helps maximize GPU utilization.
    train_ds = train_ds.prefetch(tf_data.AUTOTUNE)
    val_ds = val_ds.prefetch(tf_data.AUTOTUNE)

    def make_model(input_shape, num_classes):
        inputs = keras.Input(shape=input_shape)

        # Entry block
        x = layers.Rescaling(1.0 / 255)(inputs)
        x = layers.Conv2D(8, 3, strides=2, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.Activation("relu")(x)

        previous_block_activation = x  # Set aside residual

        for size in [16, 24, 32]:
            x = layers.Activation("relu")(x)
            x = layers.SeparableConv2D(size, 3, padding="same")(x)
            x = layers.BatchNormalization()(x)

            x = layers.Activation("relu")(x)
            x = layers.SeparableConv2D(size, 3, padding="same")(x)
            x = layers.BatchNormalization()(x)

            x = layers.MaxPooling2D(3, strides=2, padding="same")(x)

            # Project residual
            residual = layers.Conv2D(size, 1, strides=2, padding="same")(previous_block_activation)
            x = layers.add([x, residual])  # Add back residual
            previous_block_activation = x  # Set aside next residual

        x = layers.SeparableConv2D(48, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.Activation("relu")(x)

        x = layers.GlobalAveragePooling2D()(x)
        if num_classes == 2:
            units = 1
        else:
            units = num_classes

        x = layers.Dropout(DROPOUT)(x)
        # We specify activation=None so as to return logits
        outputs = layers.Dense(units, activation=None)(x)
        return keras.Model(inputs, outputs)

    model = make_model(input_shape=image_size + (3,), num_classes=2)

    epochs = 2

    callbacks = [
        keras.callbacks.ModelCheckpoint(os.path.join(workdir, "save_at_{epoch}.keras")),
    ]
    model.compile(
        optimizer=keras.optimizers.Adam(3e-4),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
        metrics=[keras.metrics.BinaryAccuracy(name="acc")],
    )
    history = model.fit(
        train_ds,
        epochs=epochs,
        callbacks=callbacks,
        validation_data=val_ds,
    )

    from keras_io import outcome

    return outcome(model, history)


def ported(workdir, cpu_replicas):
    import os

    import keras
    from keras import layers
    from tensorflow import data as tf_data

    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=cpu_replicas)

    image_size = (32, 32)
    batch_size = 16

    train_ds, val_ds = keras.utils.image_dataset_from_directory(
        os.path.join(workdir, "PetImages"),
        validation_split=0.2,
        subset="both",
        seed=1337,
        image_size=image_size,
        batch_size=batch_size,
    )

    data_augmentation_layers = [
        layers.RandomFlip("horizontal"),
        layers.RandomRotation(0.1),
    ]

    def data_augmentation(images):
        for layer in data_augmentation_layers:
            images = layer(images)
        return images

    # Apply `data_augmentation` to the training images.
    train_ds = train_ds.map(
        lambda img, label: (data_augmentation(img), label),
        num_parallel_calls=tf_data.AUTOTUNE,
    )
    # Prefetching samples in GPU memory helps maximize GPU utilization.
    train_ds = train_ds.prefetch(tf_data.AUTOTUNE)
    val_ds = val_ds.prefetch(tf_data.AUTOTUNE)

    def make_model(input_shape, num_classes):
        inputs = keras.Input(shape=input_shape)

        # Entry block
        x = layers.Rescaling(1.0 / 255)(inputs)
        x = layers.Conv2D(8, 3, strides=2, padding="same")(x)
        x = layers.BatchNormalization(synchronized=True)(x)
        x = layers.Activation("relu")(x)

        previous_block_activation = x  # Set aside residual

        for size in [16, 24, 32]:
            x = layers.Activation("relu")(x)
            x = layers.SeparableConv2D(size, 3, padding="same")(x)
            x = layers.BatchNormalization(synchronized=True)(x)

            x = layers.Activation("relu")(x)
            x = layers.SeparableConv2D(size, 3, padding="same")(x)
            x = layers.BatchNormalization(synchronized=True)(x)

            x = layers.MaxPooling2D(3, strides=2, padding="same")(x)

            # Project residual
            residual = layers.Conv2D(size, 1, strides=2, padding="same")(previous_block_activation)
            x = layers.add([x, residual])  # Add back residual
            previous_block_activation = x  # Set aside next residual

        x = layers.SeparableConv2D(48, 3, padding="same")(x)
        x = layers.BatchNormalization(synchronized=True)(x)
        x = layers.Activation("relu")(x)

        x = layers.GlobalAveragePooling2D()(x)
        if num_classes == 2:
            units = 1
        else:
            units = num_classes

        x = layers.Dropout(DROPOUT)(x)
        # We specify activation=None so as to return logits
        outputs = layers.Dense(units, activation=None)(x)
        return keras.Model(inputs, outputs)

    with strategy.scope():
        model = make_model(input_shape=image_size + (3,), num_classes=2)

        epochs = 2

        callbacks = [
            keras.callbacks.ModelCheckpoint(os.path.join(workdir, "save_at_{epoch}.keras")),
        ]
        model.compile(
            optimizer=keras.optimizers.Adam(3e-4),
            loss=keras.losses.BinaryCrossentropy(from_logits=True),
            metrics=[keras.metrics.BinaryAccuracy(name="acc")],
        )
    history = model.fit(
        mk.distribute(train_ds),
        epochs=epochs,
        callbacks=callbacks,
        validation_data=val_ds,
    )

    from keras_io import outcome

    return outcome(model, history)
