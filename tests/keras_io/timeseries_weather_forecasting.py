# Timeseries forecasting for weather prediction, ported to mirrorkit.
#
# Original: https://keras.io/examples/timeseries/timeseries_weather_forecasting/
# (keras-io examples/timeseries/timeseries_weather_forecasting.py): the Jena climate CSV,
# seven features normalised with training statistics, windows cut by
# keras.utils.timeseries_dataset_from_array (batched, unshuffled), an LSTM(32) regressor,
# EarlyStopping and ModelCheckpoint(save_best_only) on val_loss, fit with validation_data.
#
# Changed in both functions (not for mirrorkit): stand-in data (`write_data`: a
# jena_climate_2009_2016.csv with the same 15 columns and 568 rows of smooth daily cycles plus
# noise, instead of the 420,551-row download); the CSV read with the csv module (pandas is not
# installed; the example's DataFrame indexing becomes NumPy slicing); past 60 instead of 720,
# future 6 instead of 72 (sequence_length 10); batch_size 32 instead of 256; 2 epochs instead
# of 10; no plots, prints or prediction section; the checkpoint written under workdir (as
# .weights.h5, which Keras 3 requires for save_weights_only).
#
# Changed for mirrorkit (`ported` against `original`, LINES_CHANGED, counted by difflib):
# import mirrorkit; strategy = mk.strategy(...); `with strategy.scope():` around the lines
# from the model's Input to compile (re-indented); the training set through mk.distribute.

import numpy as np

LINES_CHANGED = {"added": 9, "removed": 6, "reindented": 5}
NUM_ROWS = 568
FEATURE_KEYS = [
    "p (mbar)",
    "T (degC)",
    "Tpot (K)",
    "Tdew (degC)",
    "rh (%)",
    "VPmax (mbar)",
    "VPact (mbar)",
    "VPdef (mbar)",
    "sh (g/kg)",
    "H2OC (mmol/mol)",
    "rho (g/m**3)",
    "wv (m/s)",
    "max. wv (m/s)",
    "wd (deg)",
]


def write_data(workdir):
    import os

    rng = np.random.default_rng(0)
    t = np.arange(NUM_ROWS)
    day = np.sin(2 * np.pi * t / 144)
    with open(os.path.join(workdir, "jena_climate_2009_2016.csv"), "w") as f:
        f.write(",".join(['"Date Time"'] + [f'"{k}"' for k in FEATURE_KEYS]) + "\n")
        for i in range(NUM_ROWS):
            stamp = f"{1 + i // 144:02d}.01.2009 {(i % 144) // 6:02d}:{(i % 6) * 10:02d}:00"
            values = [
                (j + 1) * 10 + 5 * day[i] * (1 + j % 3) + rng.normal()
                for j in range(len(FEATURE_KEYS))
            ]
            f.write(",".join([stamp] + [f"{v:.2f}" for v in values]) + "\n")


def read_csv(path):
    """The CSV as a dict of columns: floats where they parse, else strings."""
    import csv

    with open(path) as f:
        rows = list(csv.DictReader(f))
    columns = {}
    for name in rows[0]:
        values = [row[name] for row in rows]
        try:
            columns[name] = np.array(values, dtype="float64")
        except ValueError:
            columns[name] = np.array(values)
    return columns


def original(workdir):
    import os

    import keras
    import numpy as np

    from keras_io.timeseries_weather_forecasting import FEATURE_KEYS, read_csv

    csv_path = os.path.join(workdir, "jena_climate_2009_2016.csv")

    df = read_csv(csv_path)

    feature_keys = FEATURE_KEYS

    split_fraction = 0.715
    train_split = int(split_fraction * len(df["Date Time"]))
    step = 6

    past = 60
    future = 6
    learning_rate = 0.001
    batch_size = 32
    epochs = 2

    def normalize(data, train_split):
        data_mean = data[:train_split].mean(axis=0)
        data_std = data[:train_split].std(axis=0)
        return (data - data_mean) / data_std

    selected_features = [feature_keys[i] for i in [0, 1, 5, 7, 8, 10, 11]]
    features = np.stack([df[key] for key in selected_features], axis=1)

    features = normalize(features, train_split)

    train_data = features[0:train_split]
    val_data = features[train_split:]

    start = past + future
    end = start + train_split

    x_train = train_data[:, :7]
    y_train = features[start:end][:, [1]]

    sequence_length = int(past / step)

    dataset_train = keras.utils.timeseries_dataset_from_array(
        x_train,
        y_train,
        sequence_length=sequence_length,
        sampling_rate=step,
        batch_size=batch_size,
    )

    x_end = len(val_data) - past - future

    label_start = train_split + past + future

    x_val = val_data[:x_end][:, :7]
    y_val = features[label_start:][:, [1]]

    dataset_val = keras.utils.timeseries_dataset_from_array(
        x_val,
        y_val,
        sequence_length=sequence_length,
        sampling_rate=step,
        batch_size=batch_size,
    )

    for batch in dataset_train.take(1):
        inputs, targets = batch

    inputs = keras.layers.Input(shape=(inputs.shape[1], inputs.shape[2]))
    lstm_out = keras.layers.LSTM(32)(inputs)
    outputs = keras.layers.Dense(1)(lstm_out)

    model = keras.Model(inputs=inputs, outputs=outputs)
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=learning_rate), loss="mse")

    path_checkpoint = os.path.join(workdir, "model_checkpoint.weights.h5")
    es_callback = keras.callbacks.EarlyStopping(monitor="val_loss", min_delta=0, patience=5)

    modelckpt_callback = keras.callbacks.ModelCheckpoint(
        monitor="val_loss",
        filepath=path_checkpoint,
        verbose=1,
        save_weights_only=True,
        save_best_only=True,
    )

    history = model.fit(
        dataset_train,
        epochs=epochs,
        validation_data=dataset_val,
        callbacks=[es_callback, modelckpt_callback],
    )

    from keras_io import outcome

    return outcome(model, history)


def ported(workdir, cpu_replicas):
    import os

    import keras
    import numpy as np

    import mirrorkit as mk
    from keras_io.timeseries_weather_forecasting import FEATURE_KEYS, read_csv

    strategy = mk.strategy(cpu_replicas=cpu_replicas)

    csv_path = os.path.join(workdir, "jena_climate_2009_2016.csv")

    df = read_csv(csv_path)

    feature_keys = FEATURE_KEYS

    split_fraction = 0.715
    train_split = int(split_fraction * len(df["Date Time"]))
    step = 6

    past = 60
    future = 6
    learning_rate = 0.001
    batch_size = 32
    epochs = 2

    def normalize(data, train_split):
        data_mean = data[:train_split].mean(axis=0)
        data_std = data[:train_split].std(axis=0)
        return (data - data_mean) / data_std

    selected_features = [feature_keys[i] for i in [0, 1, 5, 7, 8, 10, 11]]
    features = np.stack([df[key] for key in selected_features], axis=1)

    features = normalize(features, train_split)

    train_data = features[0:train_split]
    val_data = features[train_split:]

    start = past + future
    end = start + train_split

    x_train = train_data[:, :7]
    y_train = features[start:end][:, [1]]

    sequence_length = int(past / step)

    dataset_train = keras.utils.timeseries_dataset_from_array(
        x_train,
        y_train,
        sequence_length=sequence_length,
        sampling_rate=step,
        batch_size=batch_size,
    )

    x_end = len(val_data) - past - future

    label_start = train_split + past + future

    x_val = val_data[:x_end][:, :7]
    y_val = features[label_start:][:, [1]]

    dataset_val = keras.utils.timeseries_dataset_from_array(
        x_val,
        y_val,
        sequence_length=sequence_length,
        sampling_rate=step,
        batch_size=batch_size,
    )

    for batch in dataset_train.take(1):
        inputs, targets = batch

    with strategy.scope():
        inputs = keras.layers.Input(shape=(inputs.shape[1], inputs.shape[2]))
        lstm_out = keras.layers.LSTM(32)(inputs)
        outputs = keras.layers.Dense(1)(lstm_out)

        model = keras.Model(inputs=inputs, outputs=outputs)
        model.compile(optimizer=keras.optimizers.Adam(learning_rate=learning_rate), loss="mse")

    path_checkpoint = os.path.join(workdir, "model_checkpoint.weights.h5")
    es_callback = keras.callbacks.EarlyStopping(monitor="val_loss", min_delta=0, patience=5)

    modelckpt_callback = keras.callbacks.ModelCheckpoint(
        monitor="val_loss",
        filepath=path_checkpoint,
        verbose=1,
        save_weights_only=True,
        save_best_only=True,
    )

    history = model.fit(
        mk.distribute(dataset_train),
        epochs=epochs,
        validation_data=dataset_val,
        callbacks=[es_callback, modelckpt_callback],
    )

    from keras_io import outcome

    return outcome(model, history)
