# Simple MNIST convnet, ported to mirrorkit.
#
# Original: https://keras.io/examples/vision/mnist_convnet/
# (keras-io examples/vision/mnist_convnet.py): NumPy arrays, to_categorical labels, a
# Conv2D/MaxPooling2D Sequential model with Dropout, Adam, fit(validation_split=0.1).
#
# Changed in both functions (not for mirrorkit): stand-in data (`write_data`: an mnist.npz in
# keras.datasets.mnist's layout, made of mirrorkit's bundled 8x8 UCI digits scaled up to 16x16,
# instead of the MNIST download), so input_shape (16, 16, 1); 640 training images; batch_size 64
# instead of 128; 2 epochs instead of 15; fit(shuffle=False) so that one device and the
# replicas see the same batches; Dropout rate DROPOUT = 0.0 instead of 0.5 (a dropout mask is
# drawn per replica, so N replicas cannot equal one device with it); no model.summary() or
# prints.
#
# Changed for mirrorkit (`ported` against `original`, LINES_CHANGED, counted by difflib):
# import mirrorkit; strategy = mk.strategy(...); `with strategy.scope():` around the lines
# from the Sequential model to compile (re-indented); the training set through mk.distribute,
# and validation_split=0.1 written out as the split Keras makes (Keras refuses
# validation_split for a dataset; it takes the last 10% without shuffling).

import numpy as np

LINES_CHANGED = {"added": 24, "removed": 16, "reindented": 15}
DROPOUT = 0.0


def write_data(workdir):
    import os

    from mirrorkit.demo.data import load_digits

    images, labels = load_digits()
    images = np.kron(images, np.ones((2, 2), "uint8")) * 15  # 8x8 in 0..16 -> 16x16 in 0..240
    np.savez(
        os.path.join(workdir, "mnist.npz"),
        x_train=images[:640],
        y_train=labels[:640],
        x_test=images[640:800],
        y_test=labels[640:800],
    )


def original(workdir):
    import os

    import keras
    import numpy as np
    from keras import layers

    # Model / data parameters
    num_classes = 10
    input_shape = (16, 16, 1)

    # Load the data and split it between train and test sets
    with np.load(os.path.join(workdir, "mnist.npz")) as f:
        x_train, y_train = f["x_train"], f["y_train"]
        x_test, y_test = f["x_test"], f["y_test"]

    # Scale images to the [0, 1] range
    x_train = x_train.astype("float32") / 255
    x_test = x_test.astype("float32") / 255
    # Make sure images have shape (16, 16, 1)
    x_train = np.expand_dims(x_train, -1)
    x_test = np.expand_dims(x_test, -1)

    # convert class vectors to binary class matrices
    y_train = keras.utils.to_categorical(y_train, num_classes)
    y_test = keras.utils.to_categorical(y_test, num_classes)

    model = keras.Sequential(
        [
            keras.Input(shape=input_shape),
            layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Flatten(),
            layers.Dropout(DROPOUT),
            layers.Dense(num_classes, activation="softmax"),
        ]
    )

    batch_size = 64
    epochs = 2

    model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])

    history = model.fit(
        x_train, y_train, batch_size=batch_size, epochs=epochs, validation_split=0.1, shuffle=False
    )

    score = model.evaluate(x_test, y_test, verbose=0)

    from keras_io import outcome

    return outcome(model, history, score=score)


def ported(workdir, cpu_replicas):
    import os

    import keras
    import numpy as np
    from keras import layers

    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=cpu_replicas)

    # Model / data parameters
    num_classes = 10
    input_shape = (16, 16, 1)

    # Load the data and split it between train and test sets
    with np.load(os.path.join(workdir, "mnist.npz")) as f:
        x_train, y_train = f["x_train"], f["y_train"]
        x_test, y_test = f["x_test"], f["y_test"]

    # Scale images to the [0, 1] range
    x_train = x_train.astype("float32") / 255
    x_test = x_test.astype("float32") / 255
    # Make sure images have shape (16, 16, 1)
    x_train = np.expand_dims(x_train, -1)
    x_test = np.expand_dims(x_test, -1)

    # convert class vectors to binary class matrices
    y_train = keras.utils.to_categorical(y_train, num_classes)
    y_test = keras.utils.to_categorical(y_test, num_classes)

    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input(shape=input_shape),
                layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
                layers.MaxPooling2D(pool_size=(2, 2)),
                layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
                layers.MaxPooling2D(pool_size=(2, 2)),
                layers.Flatten(),
                layers.Dropout(DROPOUT),
                layers.Dense(num_classes, activation="softmax"),
            ]
        )

        batch_size = 64
        epochs = 2

        model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])

    split_at = int(len(x_train) * 0.9)  # validation_split=0.1: the last 10%, as Keras splits
    train = (x_train[:split_at], y_train[:split_at])
    val = (x_train[split_at:], y_train[split_at:])
    history = model.fit(
        mk.distribute(train, strategy, global_batch_size=batch_size, shuffle=False),
        epochs=epochs,
        validation_data=val,
    )

    score = model.evaluate(x_test, y_test, verbose=0)

    from keras_io import outcome

    return outcome(model, history, score=score)
