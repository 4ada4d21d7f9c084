# Imbalanced classification: credit card fraud detection, ported to mirrorkit.
#
# Original: https://keras.io/examples/structured_data/imbalanced_classification/
# (keras-io examples/structured_data/imbalanced_classification.py): a CSV read by hand into
# NumPy arrays, the last 20% as validation set, normalisation with training statistics, a
# Dense/Dropout model, six confusion-matrix metrics, ModelCheckpoint, fit(class_weight=...).
#
# Changed in both functions (not for mirrorkit): stand-in data (`write_data`: a creditcard.csv
# in the Kaggle file's layout, "Time", V1..V28, "Amount" and a quoted "Class", 1,280 rows of
# which ~5% positive, instead of the Kaggle download); Dense 256 -> 32 units; batch_size 128
# instead of 2048; 2 epochs instead of 30; verbose=0; fit(shuffle=False) so that one device
# and the replicas see the same batches; Dropout rate DROPOUT = 0.0 instead of 0.3 (a dropout
# mask is drawn per replica, so N replicas cannot equal one device with it); no prints;
# checkpoints written under workdir.
#
# Changed for mirrorkit (`ported` against `original`, LINES_CHANGED, counted by difflib):
# import mirrorkit; strategy = mk.strategy(...); `with strategy.scope():` around the lines
# from the Sequential model to compile (re-indented); the training arrays through
# mk.distribute (batch_size becomes its global_batch_size).

import numpy as np

LINES_CHANGED = {"added": 27, "removed": 25, "reindented": 21}
DROPOUT = 0.0
NUM_ROWS = 1280


def write_data(workdir):
    import os

    rng = np.random.default_rng(0)
    header = ['"Time"'] + [f'"V{i}"' for i in range(1, 29)] + ['"Amount"', '"Class"']
    fraud = rng.random(NUM_ROWS) < 0.05
    features = rng.normal(size=(NUM_ROWS, 30)) + fraud[:, None] * rng.normal(size=30)
    features[:, 0] = np.arange(NUM_ROWS) * 7.0  # "Time": seconds since the first row
    features[:, -1] = np.abs(features[:, -1]) * 80  # "Amount"
    with open(os.path.join(workdir, "creditcard.csv"), "w") as f:
        f.write(",".join(header) + "\n")
        for row, label in zip(features, fraud, strict=True):
            f.write(",".join(f"{v:.6f}" for v in row) + f',"{int(label)}"\n')


def original(workdir):
    import os

    import numpy as np

    fname = os.path.join(workdir, "creditcard.csv")

    all_features = []
    all_targets = []
    with open(fname) as f:
        for i, line in enumerate(f):
            if i == 0:
                continue  # Skip header
            fields = line.strip().split(",")
            all_features.append([float(v.replace('"', "")) for v in fields[:-1]])
            all_targets.append([int(fields[-1].replace('"', ""))])

    features = np.array(all_features, dtype="float32")
    targets = np.array(all_targets, dtype="uint8")

    num_val_samples = int(len(features) * 0.2)
    train_features = features[:-num_val_samples]
    train_targets = targets[:-num_val_samples]
    val_features = features[-num_val_samples:]
    val_targets = targets[-num_val_samples:]

    counts = np.bincount(train_targets[:, 0])

    weight_for_0 = 1.0 / counts[0]
    weight_for_1 = 1.0 / counts[1]

    mean = np.mean(train_features, axis=0)
    train_features -= mean
    val_features -= mean
    std = np.std(train_features, axis=0)
    train_features /= std
    val_features /= std

    import keras

    model = keras.Sequential(
        [
            keras.Input(shape=train_features.shape[1:]),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dropout(DROPOUT),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dropout(DROPOUT),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )

    metrics = [
        keras.metrics.FalseNegatives(name="fn"),
        keras.metrics.FalsePositives(name="fp"),
        keras.metrics.TrueNegatives(name="tn"),
        keras.metrics.TruePositives(name="tp"),
        keras.metrics.Precision(name="precision"),
        keras.metrics.Recall(name="recall"),
    ]

    model.compile(
        optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy", metrics=metrics
    )

    callbacks = [
        keras.callbacks.ModelCheckpoint(os.path.join(workdir, "fraud_model_at_epoch_{epoch}.keras"))
    ]
    class_weight = {0: weight_for_0, 1: weight_for_1}

    history = model.fit(
        train_features,
        train_targets,
        batch_size=128,
        epochs=2,
        verbose=0,
        callbacks=callbacks,
        validation_data=(val_features, val_targets),
        class_weight=class_weight,
        shuffle=False,
    )

    from keras_io import outcome

    return outcome(model, history)


def ported(workdir, cpu_replicas):
    import os

    import numpy as np

    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=cpu_replicas)

    fname = os.path.join(workdir, "creditcard.csv")

    all_features = []
    all_targets = []
    with open(fname) as f:
        for i, line in enumerate(f):
            if i == 0:
                continue  # Skip header
            fields = line.strip().split(",")
            all_features.append([float(v.replace('"', "")) for v in fields[:-1]])
            all_targets.append([int(fields[-1].replace('"', ""))])

    features = np.array(all_features, dtype="float32")
    targets = np.array(all_targets, dtype="uint8")

    num_val_samples = int(len(features) * 0.2)
    train_features = features[:-num_val_samples]
    train_targets = targets[:-num_val_samples]
    val_features = features[-num_val_samples:]
    val_targets = targets[-num_val_samples:]

    counts = np.bincount(train_targets[:, 0])

    weight_for_0 = 1.0 / counts[0]
    weight_for_1 = 1.0 / counts[1]

    mean = np.mean(train_features, axis=0)
    train_features -= mean
    val_features -= mean
    std = np.std(train_features, axis=0)
    train_features /= std
    val_features /= std

    import keras

    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input(shape=train_features.shape[1:]),
                keras.layers.Dense(32, activation="relu"),
                keras.layers.Dense(32, activation="relu"),
                keras.layers.Dropout(DROPOUT),
                keras.layers.Dense(32, activation="relu"),
                keras.layers.Dropout(DROPOUT),
                keras.layers.Dense(1, activation="sigmoid"),
            ]
        )

        metrics = [
            keras.metrics.FalseNegatives(name="fn"),
            keras.metrics.FalsePositives(name="fp"),
            keras.metrics.TrueNegatives(name="tn"),
            keras.metrics.TruePositives(name="tp"),
            keras.metrics.Precision(name="precision"),
            keras.metrics.Recall(name="recall"),
        ]

        model.compile(
            optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy", metrics=metrics
        )

    callbacks = [
        keras.callbacks.ModelCheckpoint(os.path.join(workdir, "fraud_model_at_epoch_{epoch}.keras"))
    ]
    class_weight = {0: weight_for_0, 1: weight_for_1}

    history = model.fit(
        mk.distribute(
            (train_features, train_targets), strategy, global_batch_size=128, shuffle=False
        ),
        epochs=2,
        verbose=0,
        callbacks=callbacks,
        validation_data=(val_features, val_targets),
        class_weight=class_weight,
    )

    from keras_io import outcome

    return outcome(model, history)
