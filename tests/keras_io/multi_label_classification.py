# Large-scale multi-label text classification, ported to mirrorkit.
#
# Original: https://keras.io/examples/nlp/multi_label_classification/
# (keras-io examples/nlp/multi_label_classification.py): arXiv abstracts and their lists of
# subject terms; StringLookup(output_mode="multi_hot") for the labels; batched tf.data
# pipelines of raw strings mapped through TextVectorization(ngrams=2, output_mode="tf_idf")
# adapted on the training set; a shallow MLP (Dense 512, 256, sigmoid) with binary
# crossentropy and Adam; fit with validation_data; evaluate on the test set.
#
# Changed in both functions (not for mirrorkit): stand-in data (`write_data`: 384 abstracts of
# 12-30 words drawn from a 300-word vocabulary, each term adding words of its own, instead of
# the arXiv download and its pandas processing; 256 training, 64 validation and 64 test rows,
# in a fixed order, so no stratified split); TextVectorization(..., output_mode="multi_hot",
# sparse=True) and keras.Input((vocabulary,), sparse=True): the sparse variant users write for
# a large vocabulary, which gives the first Dense layer sparse gradient slices (Keras 3.15's
# output_mode="tf_idf" with sparse=True fails in TextVectorization itself, "indices.shape[-1]
# must be <= params.rank"); Dense 64 and 32 instead
# of 512 and 256; batch_size 64 instead of 128; the training set not shuffled (one device and
# the replicas then see the same batches); 2 epochs instead of 20, verbose=0; no plots, prints
# or inference section.
#
# Changed for mirrorkit (`ported` against `original`, LINES_CHANGED, counted by difflib):
# import mirrorkit; strategy = mk.strategy(...); `with strategy.scope():` around the model's
# construction and compile (re-indented); the training set through mk.distribute (its batches
# and order kept). The sparse gradient slices of the first Dense layer reach Adam merged as one
# device has them (mirrorkit.compat.one_device_gradient); without that, 5.1e-3 off here.

import numpy as np

LINES_CHANGED = {"added": 8, "removed": 4, "reindented": 4}
TERMS = ("cs.LG", "cs.CV", "stat.ML", "cs.CL", "eess.IV")
NUM_ROWS = 384


def write_data(workdir):
    import json
    import os

    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(300)]
    rows = []
    for _ in range(NUM_ROWS):
        terms = sorted(set(rng.choice(TERMS, size=rng.integers(1, 3))))
        topical = [w for t in terms for w in words[TERMS.index(t) * 40 : TERMS.index(t) * 40 + 40]]
        text = list(rng.choice(words, size=rng.integers(6, 15))) + list(
            rng.choice(topical, size=rng.integers(6, 15))
        )
        rows.append({"summaries": " ".join(rng.permutation(text)), "terms": terms})
    with open(os.path.join(workdir, "arxiv.json"), "w") as f:
        json.dump(rows, f)


def original(workdir):
    import json
    import os

    import keras
    import tensorflow as tf
    from keras import layers

    with open(os.path.join(workdir, "arxiv.json")) as f:
        rows = json.load(f)
    train_df, val_df, test_df = rows[:256], rows[256:320], rows[320:]

    terms = tf.ragged.constant([row["terms"] for row in train_df])
    lookup = keras.layers.StringLookup(output_mode="multi_hot")
    lookup.adapt(terms)

    batch_size = 64
    auto = tf.data.AUTOTUNE

    def make_dataset(dataframe, is_train=True):
        labels = tf.ragged.constant([row["terms"] for row in dataframe])
        label_binarized = lookup(labels).numpy()
        dataset = tf.data.Dataset.from_tensor_slices(
            ([row["summaries"] for row in dataframe], label_binarized)
        )
        return dataset.batch(batch_size)

    train_dataset = make_dataset(train_df, is_train=True)
    validation_dataset = make_dataset(val_df, is_train=False)
    test_dataset = make_dataset(test_df, is_train=False)

    vocabulary = set()
    for row in train_df:
        vocabulary.update(row["summaries"].lower().split())
    vocabulary_size = len(vocabulary)

    text_vectorizer = layers.TextVectorization(
        max_tokens=vocabulary_size, ngrams=2, output_mode="multi_hot", sparse=True
    )
    with tf.device("/CPU:0"):
        text_vectorizer.adapt(train_dataset.map(lambda text, label: text))

    train_dataset = train_dataset.map(
        lambda text, label: (text_vectorizer(text), label), num_parallel_calls=auto
    ).prefetch(auto)
    validation_dataset = validation_dataset.map(
        lambda text, label: (text_vectorizer(text), label), num_parallel_calls=auto
    ).prefetch(auto)
    test_dataset = test_dataset.map(
        lambda text, label: (text_vectorizer(text), label), num_parallel_calls=auto
    ).prefetch(auto)

    def make_model():
        shallow_mlp_model = keras.Sequential(
            [
                keras.Input((text_vectorizer.vocabulary_size(),), sparse=True),
                layers.Dense(64, activation="relu"),
                layers.Dense(32, activation="relu"),
                layers.Dense(lookup.vocabulary_size(), activation="sigmoid"),
            ]
        )
        return shallow_mlp_model

    epochs = 2

    shallow_mlp_model = make_model()
    shallow_mlp_model.compile(
        loss="binary_crossentropy", optimizer="adam", metrics=["binary_accuracy"]
    )

    history = shallow_mlp_model.fit(
        train_dataset, validation_data=validation_dataset, epochs=epochs, verbose=0
    )

    _, binary_acc = shallow_mlp_model.evaluate(test_dataset, verbose=0)

    from keras_io import outcome

    return outcome(shallow_mlp_model, history, binary_acc=binary_acc)


def ported(workdir, cpu_replicas):
    import json
    import os

    import keras
    import tensorflow as tf
    from keras import layers

    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=cpu_replicas)

    with open(os.path.join(workdir, "arxiv.json")) as f:
        rows = json.load(f)
    train_df, val_df, test_df = rows[:256], rows[256:320], rows[320:]

    terms = tf.ragged.constant([row["terms"] for row in train_df])
    lookup = keras.layers.StringLookup(output_mode="multi_hot")
    lookup.adapt(terms)

    batch_size = 64
    auto = tf.data.AUTOTUNE

    def make_dataset(dataframe, is_train=True):
        labels = tf.ragged.constant([row["terms"] for row in dataframe])
        label_binarized = lookup(labels).numpy()
        dataset = tf.data.Dataset.from_tensor_slices(
            ([row["summaries"] for row in dataframe], label_binarized)
        )
        return dataset.batch(batch_size)

    train_dataset = make_dataset(train_df, is_train=True)
    validation_dataset = make_dataset(val_df, is_train=False)
    test_dataset = make_dataset(test_df, is_train=False)

    vocabulary = set()
    for row in train_df:
        vocabulary.update(row["summaries"].lower().split())
    vocabulary_size = len(vocabulary)

    text_vectorizer = layers.TextVectorization(
        max_tokens=vocabulary_size, ngrams=2, output_mode="multi_hot", sparse=True
    )
    with tf.device("/CPU:0"):
        text_vectorizer.adapt(train_dataset.map(lambda text, label: text))

    train_dataset = train_dataset.map(
        lambda text, label: (text_vectorizer(text), label), num_parallel_calls=auto
    ).prefetch(auto)
    validation_dataset = validation_dataset.map(
        lambda text, label: (text_vectorizer(text), label), num_parallel_calls=auto
    ).prefetch(auto)
    test_dataset = test_dataset.map(
        lambda text, label: (text_vectorizer(text), label), num_parallel_calls=auto
    ).prefetch(auto)
    train_dataset = mk.distribute(train_dataset, strategy, shuffle=False)

    def make_model():
        shallow_mlp_model = keras.Sequential(
            [
                keras.Input((text_vectorizer.vocabulary_size(),), sparse=True),
                layers.Dense(64, activation="relu"),
                layers.Dense(32, activation="relu"),
                layers.Dense(lookup.vocabulary_size(), activation="sigmoid"),
            ]
        )
        return shallow_mlp_model

    epochs = 2

    with strategy.scope():
        shallow_mlp_model = make_model()
        shallow_mlp_model.compile(
            loss="binary_crossentropy", optimizer="adam", metrics=["binary_accuracy"]
        )

    history = shallow_mlp_model.fit(
        train_dataset, validation_data=validation_dataset, epochs=epochs, verbose=0
    )

    _, binary_acc = shallow_mlp_model.evaluate(test_dataset, verbose=0)

    from keras_io import outcome

    return outcome(shallow_mlp_model, history, binary_acc=binary_acc)
