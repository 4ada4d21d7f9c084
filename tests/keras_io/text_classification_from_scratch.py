# Text classification from scratch, ported to mirrorkit.
#
# Original: https://keras.io/examples/nlp/text_classification_from_scratch/
# (keras-io examples/nlp/text_classification_from_scratch.py): text_dataset_from_directory
# with validation_split and subset "training"/"validation", a custom standardization, a
# TextVectorization layer adapted on the text and mapped over the batches, .cache().prefetch(),
# an Embedding + Conv1D model with Dropout, fit with validation_data, evaluate on the test set.
#
# Changed in both functions (not for mirrorkit): stand-in data (`write_data`: 100 training and
# 40 test reviews in aclImdb/{train,test}/{pos,neg}, made of words that lean positive or
# negative, with "<br />" tags, instead of the IMDB download); max_features 2000 instead of
# 20000, embedding_dim 16 instead of 128, sequence_length 60 instead of 500, Conv1D and Dense
# 128 -> 16 units; 2 epochs instead of 3; Dropout rate DROPOUT = 0.0 instead of 0.5 (a
# dropout mask is drawn per replica, so N replicas cannot equal one device with it); no
# printed previews, no end-to-end model section.
#
# Changed for mirrorkit (`ported` against `original`, LINES_CHANGED, counted by difflib):
# import mirrorkit; strategy = mk.strategy(...); `with strategy.scope():` around the lines
# from the model's Input to compile (re-indented); the training set through mk.distribute
# (its batches, order and shuffle kept: its batch is the global batch).

import numpy as np

LINES_CHANGED = {"added": 26, "removed": 19, "reindented": 18}
DROPOUT = 0.0

_WORDS = {
    "pos": "great wonderful moving superb loved brilliant charming".split(),
    "neg": "awful boring dull terrible hated weak clumsy".split(),
    "any": "the film a movie plot actors story and it was of scenes director".split(),
}


def write_data(workdir):
    import os

    rng = np.random.default_rng(0)
    for split, count in (("train", 50), ("test", 20)):
        for label in ("pos", "neg"):
            folder = os.path.join(workdir, "aclImdb", split, label)
            os.makedirs(folder)
            for i in range(count):
                words = list(rng.choice(_WORDS["any"], size=int(rng.integers(20, 70))))
                for _ in range(int(rng.integers(2, 6))):
                    words.insert(int(rng.integers(len(words))), str(rng.choice(_WORDS[label])))
                text = " ".join(words).capitalize() + ".<br /><br />" + " ".join(words[:5]) + "!"
                with open(os.path.join(folder, f"{i}_{rng.integers(1, 10)}.txt"), "w") as f:
                    f.write(text)


def original(workdir):
    import os
    import re
    import string

    import keras
    import tensorflow as tf
    from keras import layers

    dataset_dir = os.path.join(workdir, "aclImdb")

    batch_size = 32
    train_dir = os.path.join(dataset_dir, "train")
    test_dir = os.path.join(dataset_dir, "test")

    raw_train_ds = keras.utils.text_dataset_from_directory(
        train_dir,
        batch_size=batch_size,
        validation_split=0.2,
        subset="training",
        seed=1337,
        class_names=["pos", "neg"],
    )
    raw_val_ds = keras.utils.text_dataset_from_directory(
        train_dir,
        batch_size=batch_size,
        validation_split=0.2,
        subset="validation",
        seed=1337,
        class_names=["pos", "neg"],
    )
    raw_test_ds = keras.utils.text_dataset_from_directory(test_dir, batch_size=batch_size)

    def custom_standardization(input_data):
        lowercase = tf.strings.lower(input_data)
        stripped_html = tf.strings.regex_replace(lowercase, "<br />", " ")
        return tf.strings.regex_replace(stripped_html, f"[{re.escape(string.punctuation)}]", "")

    # Model constants.
    max_features = 2000
    embedding_dim = 16
    sequence_length = 60

    vectorize_layer = keras.layers.TextVectorization(
        standardize=custom_standardization,
        max_tokens=max_features,
        output_mode="int",
        output_sequence_length=sequence_length,
    )

    # Let's make a text-only dataset (no labels):
    text_ds = raw_train_ds.map(lambda x, y: x)
    # Let's call `adapt`:
    vectorize_layer.adapt(text_ds)

    def vectorize_text(text, label):
        text = tf.expand_dims(text, -1)
        return vectorize_layer(text), label

    # Vectorize the data.
    train_ds = raw_train_ds.map(vectorize_text)
    val_ds = raw_val_ds.map(vectorize_text)
    test_ds = raw_test_ds.map(vectorize_text)

    # Do async prefetching / buffering of the data for best performance on GPU.
    train_ds = train_ds.cache().prefetch(buffer_size=10)
    val_ds = val_ds.cache().prefetch(buffer_size=10)
    test_ds = test_ds.cache().prefetch(buffer_size=10)

    # A integer input for vocab indices.
    inputs = keras.Input(shape=(None,), dtype="int64")

    # Next, we add a layer to map those vocab indices into a space of dimensionality
    # 'embedding_dim'.
    x = layers.Embedding(max_features, embedding_dim)(inputs)
    x = layers.Dropout(DROPOUT)(x)

    # Conv1D + global max pooling
    x = layers.Conv1D(16, 7, padding="valid", activation="relu", strides=3)(x)
    x = layers.Conv1D(16, 7, padding="valid", activation="relu", strides=3)(x)
    x = layers.GlobalMaxPooling1D()(x)

    # We add a vanilla hidden layer:
    x = layers.Dense(16, activation="relu")(x)
    x = layers.Dropout(DROPOUT)(x)

    # We project onto a single unit output layer, and squash it with a sigmoid:
    predictions = layers.Dense(1, activation="sigmoid", name="predictions")(x)

    model = keras.Model(inputs, predictions)

    # Compile the model with binary crossentropy loss and an adam optimizer.
    model.compile(loss="binary_crossentropy", optimizer="adam", metrics=["accuracy"])

    epochs = 2

    # Fit the model using the train and test datasets.
    history = model.fit(train_ds, validation_data=val_ds, epochs=epochs)

    test = model.evaluate(test_ds)

    from keras_io import outcome

    return outcome(model, history, test=test)


def ported(workdir, cpu_replicas):
    import os
    import re
    import string

    import keras
    import tensorflow as tf
    from keras import layers

    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=cpu_replicas)

    dataset_dir = os.path.join(workdir, "aclImdb")

    batch_size = 32
    train_dir = os.path.join(dataset_dir, "train")
    test_dir = os.path.join(dataset_dir, "test")

    raw_train_ds = keras.utils.text_dataset_from_directory(
        train_dir,
        batch_size=batch_size,
        validation_split=0.2,
        subset="training",
        seed=1337,
        class_names=["pos", "neg"],
    )
    raw_val_ds = keras.utils.text_dataset_from_directory(
        train_dir,
        batch_size=batch_size,
        validation_split=0.2,
        subset="validation",
        seed=1337,
        class_names=["pos", "neg"],
    )
    raw_test_ds = keras.utils.text_dataset_from_directory(test_dir, batch_size=batch_size)

    def custom_standardization(input_data):
        lowercase = tf.strings.lower(input_data)
        stripped_html = tf.strings.regex_replace(lowercase, "<br />", " ")
        return tf.strings.regex_replace(stripped_html, f"[{re.escape(string.punctuation)}]", "")

    # Model constants.
    max_features = 2000
    embedding_dim = 16
    sequence_length = 60

    vectorize_layer = keras.layers.TextVectorization(
        standardize=custom_standardization,
        max_tokens=max_features,
        output_mode="int",
        output_sequence_length=sequence_length,
    )

    # Let's make a text-only dataset (no labels):
    text_ds = raw_train_ds.map(lambda x, y: x)
    # Let's call `adapt`:
    vectorize_layer.adapt(text_ds)

    def vectorize_text(text, label):
        text = tf.expand_dims(text, -1)
        return vectorize_layer(text), label

    # Vectorize the data.
    train_ds = raw_train_ds.map(vectorize_text)
    val_ds = raw_val_ds.map(vectorize_text)
    test_ds = raw_test_ds.map(vectorize_text)

    # Do async prefetching / buffering of the data for best performance on GPU.
    train_ds = train_ds.cache().prefetch(buffer_size=10)
    val_ds = val_ds.cache().prefetch(buffer_size=10)
    test_ds = test_ds.cache().prefetch(buffer_size=10)

    with strategy.scope():
        # A integer input for vocab indices.
        inputs = keras.Input(shape=(None,), dtype="int64")

        # Next, we add a layer to map those vocab indices into a space of dimensionality
        # 'embedding_dim'.
        x = layers.Embedding(max_features, embedding_dim)(inputs)
        x = layers.Dropout(DROPOUT)(x)

        # Conv1D + global max pooling
        x = layers.Conv1D(16, 7, padding="valid", activation="relu", strides=3)(x)
        x = layers.Conv1D(16, 7, padding="valid", activation="relu", strides=3)(x)
        x = layers.GlobalMaxPooling1D()(x)

        # We add a vanilla hidden layer:
        x = layers.Dense(16, activation="relu")(x)
        x = layers.Dropout(DROPOUT)(x)

        # We project onto a single unit output layer, and squash it with a sigmoid:
        predictions = layers.Dense(1, activation="sigmoid", name="predictions")(x)

        model = keras.Model(inputs, predictions)

        # Compile the model with binary crossentropy loss and an adam optimizer.
        model.compile(loss="binary_crossentropy", optimizer="adam", metrics=["accuracy"])

    epochs = 2

    # Fit the model using the train and test datasets.
    history = model.fit(
        mk.distribute(train_ds),
        validation_data=val_ds,
        epochs=epochs,
    )

    test = model.evaluate(test_ds)

    from keras_io import outcome

    return outcome(model, history, test=test)
