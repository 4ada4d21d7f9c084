# Structured data classification with FeatureSpace, ported to mirrorkit.
#
# Original: https://keras.io/examples/structured_data/structured_data_classification_with_feature_space/
# (keras-io examples/structured_data/structured_data_classification_with_feature_space.py):
# a CSV of mixed integer, float and string columns as a dict tf.data pipeline, shuffled and
# batched, a keras.utils.FeatureSpace adapted on it and mapped over the batches
# (.map(lambda x, y: (feature_space(x), y))), a Dense/Dropout model on the encoded features,
# fit with validation_data.
#
# Changed in both functions (not for mirrorkit): stand-in data (`write_data`: a heart.csv with
# the Cleveland heart-disease columns, 303 rows, instead of the download); the CSV read with
# the csv module into a dict of NumPy columns and the 20% validation sample drawn with NumPy
# (pandas is not installed; the example's dataframe.sample(frac=0.2, random_state=1337)
# and dict(dataframe) become their NumPy equivalents); 2 epochs instead of 20, verbose=0;
# Dropout rate DROPOUT = 0.0 instead of 0.5 (a dropout mask is drawn per replica, so N
# replicas cannot equal one device with it); only the second (customized) FeatureSpace; no
# prints and no inference section.
#
# Changed for mirrorkit (`ported` against `original`, LINES_CHANGED, counted by difflib):
# import mirrorkit; strategy = mk.strategy(...); `with strategy.scope():` around the lines
# from the first Dense to compile (re-indented); the training set through mk.distribute
# (its batches, order and shuffle kept: its batch is the global batch).

import numpy as np

LINES_CHANGED = {"added": 12, "removed": 6, "reindented": 5}
DROPOUT = 0.0
NUM_ROWS = 303


def write_data(workdir):
    import os

    rng = np.random.default_rng(0)
    target = rng.random(NUM_ROWS) < 0.45
    columns = {
        "age": rng.integers(29, 78, NUM_ROWS) + 5 * target,
        "sex": rng.integers(0, 2, NUM_ROWS),
        "cp": np.where(target, rng.integers(0, 5, NUM_ROWS), rng.integers(0, 3, NUM_ROWS)),
        "trestbps": rng.integers(94, 200, NUM_ROWS),
        "chol": rng.integers(126, 564, NUM_ROWS),
        "fbs": rng.integers(0, 2, NUM_ROWS),
        "restecg": rng.integers(0, 3, NUM_ROWS),
        "thalach": rng.integers(71, 202, NUM_ROWS) - 20 * target,
        "exang": (rng.random(NUM_ROWS) < 0.2 + 0.4 * target).astype(int),
        "oldpeak": np.round(rng.random(NUM_ROWS) * 4 + target, 1),
        "slope": rng.integers(1, 4, NUM_ROWS),
        "ca": rng.integers(0, 4, NUM_ROWS),
        "thal": np.where(target, rng.choice(["fixed", "reversible"], NUM_ROWS), "normal"),
        "target": target.astype(int),
    }
    with open(os.path.join(workdir, "heart.csv"), "w") as f:
        f.write(",".join(columns) + "\n")
        for i in range(NUM_ROWS):
            f.write(",".join(str(values[i]) for values in columns.values()) + "\n")


def read_csv(path):
    """The CSV as a dict of columns, typed as pandas.read_csv types them (int, float, str)."""
    import csv

    with open(path) as f:
        rows = list(csv.DictReader(f))
    columns = {}
    for name in rows[0]:
        values = [row[name] for row in rows]
        for dtype in ("int64", "float64", "str"):
            try:
                columns[name] = np.array(values).astype(dtype)
                break
            except ValueError:
                continue
    return columns


def original(workdir):
    import os

    import keras
    import numpy as np
    import tensorflow as tf

    from keras_io.structured_data_feature_space import read_csv

    dataframe = read_csv(os.path.join(workdir, "heart.csv"))

    num_rows = len(dataframe["target"])
    val_rows = np.random.RandomState(1337).permutation(num_rows)[: round(0.2 * num_rows)]
    val_dataframe = {name: column[np.sort(val_rows)] for name, column in dataframe.items()}
    train_rows = np.setdiff1d(np.arange(num_rows), val_rows)
    train_dataframe = {name: column[train_rows] for name, column in dataframe.items()}

    def dataframe_to_dataset(dataframe):
        dataframe = dict(dataframe)
        labels = dataframe.pop("target")
        ds = tf.data.Dataset.from_tensor_slices((dict(dataframe), labels))
        ds = ds.shuffle(buffer_size=len(labels))
        return ds

    train_ds = dataframe_to_dataset(train_dataframe)
    val_ds = dataframe_to_dataset(val_dataframe)

    train_ds = train_ds.batch(32)
    val_ds = val_ds.batch(32)

    from keras.utils import FeatureSpace

    feature_space = FeatureSpace(
        features={
            # Categorical features encoded as integers
            "sex": FeatureSpace.integer_categorical(num_oov_indices=0),
            "cp": FeatureSpace.integer_categorical(num_oov_indices=0),
            "fbs": FeatureSpace.integer_categorical(num_oov_indices=0),
            "restecg": FeatureSpace.integer_categorical(num_oov_indices=0),
            "exang": FeatureSpace.integer_categorical(num_oov_indices=0),
            "ca": FeatureSpace.integer_categorical(num_oov_indices=0),
            # Categorical feature encoded as string
            "thal": FeatureSpace.string_categorical(num_oov_indices=0),
            # Numerical features to discretize
            "age": FeatureSpace.float_discretized(num_bins=30),
            # Numerical features to normalize
            "trestbps": FeatureSpace.float_normalized(),
            "chol": FeatureSpace.float_normalized(),
            "thalach": FeatureSpace.float_normalized(),
            "oldpeak": FeatureSpace.float_normalized(),
            "slope": FeatureSpace.float_normalized(),
        },
        # Specify feature cross with a custom crossing dim.
        crosses=[
            FeatureSpace.cross(feature_names=("sex", "age"), crossing_dim=64),
            FeatureSpace.cross(
                feature_names=("thal", "ca"),
                crossing_dim=16,
            ),
        ],
        output_mode="concat",
    )

    train_ds_with_no_labels = train_ds.map(lambda x, _: x)
    feature_space.adapt(train_ds_with_no_labels)

    preprocessed_train_ds = train_ds.map(
        lambda x, y: (feature_space(x), y), num_parallel_calls=tf.data.AUTOTUNE
    )
    preprocessed_train_ds = preprocessed_train_ds.prefetch(tf.data.AUTOTUNE)

    preprocessed_val_ds = val_ds.map(
        lambda x, y: (feature_space(x), y), num_parallel_calls=tf.data.AUTOTUNE
    )
    preprocessed_val_ds = preprocessed_val_ds.prefetch(tf.data.AUTOTUNE)

    dict_inputs = feature_space.get_inputs()
    encoded_features = feature_space.get_encoded_features()

    x = keras.layers.Dense(32, activation="relu")(encoded_features)
    x = keras.layers.Dropout(DROPOUT)(x)
    predictions = keras.layers.Dense(1, activation="sigmoid")(x)

    training_model = keras.Model(inputs=encoded_features, outputs=predictions)
    training_model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])

    inference_model = keras.Model(inputs=dict_inputs, outputs=predictions)

    history = training_model.fit(
        preprocessed_train_ds, epochs=2, validation_data=preprocessed_val_ds, verbose=0
    )

    from keras_io import outcome

    return outcome(training_model, history, inference_outputs=len(inference_model.outputs))


def ported(workdir, cpu_replicas):
    import os

    import keras
    import numpy as np
    import tensorflow as tf

    import mirrorkit as mk
    from keras_io.structured_data_feature_space import read_csv

    strategy = mk.strategy(cpu_replicas=cpu_replicas)

    dataframe = read_csv(os.path.join(workdir, "heart.csv"))

    num_rows = len(dataframe["target"])
    val_rows = np.random.RandomState(1337).permutation(num_rows)[: round(0.2 * num_rows)]
    val_dataframe = {name: column[np.sort(val_rows)] for name, column in dataframe.items()}
    train_rows = np.setdiff1d(np.arange(num_rows), val_rows)
    train_dataframe = {name: column[train_rows] for name, column in dataframe.items()}

    def dataframe_to_dataset(dataframe):
        dataframe = dict(dataframe)
        labels = dataframe.pop("target")
        ds = tf.data.Dataset.from_tensor_slices((dict(dataframe), labels))
        ds = ds.shuffle(buffer_size=len(labels))
        return ds

    train_ds = dataframe_to_dataset(train_dataframe)
    val_ds = dataframe_to_dataset(val_dataframe)

    train_ds = train_ds.batch(32)
    val_ds = val_ds.batch(32)

    from keras.utils import FeatureSpace

    feature_space = FeatureSpace(
        features={
            # Categorical features encoded as integers
            "sex": FeatureSpace.integer_categorical(num_oov_indices=0),
            "cp": FeatureSpace.integer_categorical(num_oov_indices=0),
            "fbs": FeatureSpace.integer_categorical(num_oov_indices=0),
            "restecg": FeatureSpace.integer_categorical(num_oov_indices=0),
            "exang": FeatureSpace.integer_categorical(num_oov_indices=0),
            "ca": FeatureSpace.integer_categorical(num_oov_indices=0),
            # Categorical feature encoded as string
            "thal": FeatureSpace.string_categorical(num_oov_indices=0),
            # Numerical features to discretize
            "age": FeatureSpace.float_discretized(num_bins=30),
            # Numerical features to normalize
            "trestbps": FeatureSpace.float_normalized(),
            "chol": FeatureSpace.float_normalized(),
            "thalach": FeatureSpace.float_normalized(),
            "oldpeak": FeatureSpace.float_normalized(),
            "slope": FeatureSpace.float_normalized(),
        },
        # Specify feature cross with a custom crossing dim.
        crosses=[
            FeatureSpace.cross(feature_names=("sex", "age"), crossing_dim=64),
            FeatureSpace.cross(
                feature_names=("thal", "ca"),
                crossing_dim=16,
            ),
        ],
        output_mode="concat",
    )

    train_ds_with_no_labels = train_ds.map(lambda x, _: x)
    feature_space.adapt(train_ds_with_no_labels)

    preprocessed_train_ds = train_ds.map(
        lambda x, y: (feature_space(x), y), num_parallel_calls=tf.data.AUTOTUNE
    )
    preprocessed_train_ds = preprocessed_train_ds.prefetch(tf.data.AUTOTUNE)

    preprocessed_val_ds = val_ds.map(
        lambda x, y: (feature_space(x), y), num_parallel_calls=tf.data.AUTOTUNE
    )
    preprocessed_val_ds = preprocessed_val_ds.prefetch(tf.data.AUTOTUNE)

    dict_inputs = feature_space.get_inputs()
    encoded_features = feature_space.get_encoded_features()

    with strategy.scope():
        x = keras.layers.Dense(32, activation="relu")(encoded_features)
        x = keras.layers.Dropout(DROPOUT)(x)
        predictions = keras.layers.Dense(1, activation="sigmoid")(x)

        training_model = keras.Model(inputs=encoded_features, outputs=predictions)
        training_model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])

    inference_model = keras.Model(inputs=dict_inputs, outputs=predictions)

    history = training_model.fit(
        mk.distribute(preprocessed_train_ds),
        epochs=2,
        validation_data=preprocessed_val_ds,
        verbose=0,
    )

    from keras_io import outcome

    return outcome(training_model, history, inference_outputs=len(inference_model.outputs))
