# Sequential retrieval (GRU4Rec), ported to mirrorkit.
#
# Original: https://keras.io/keras_rs/examples/sequential_retrieval/
# (keras-io examples/keras_rs/sequential_retrieval.py): MovieLens rating sequences cut into
# (context of 10 movie ids, next movie id) examples, a tf.data pipeline batched and cached, a
# two-tower keras.Model (query tower: Embedding + GRU; candidate tower: Embedding) whose
# overridden compute_loss scores each query against every candidate of the batch (in-batch
# negatives: labels ops.eye(num_queries, num_candidates)), keras_rs.layers.BruteForceRetrieval
# for predictions, AdamW, fit with validation_data.
#
# Changed in both functions (not for mirrorkit): stand-in data (`write_data`: 320 sequences drawn
# with NumPy over 60 movie ids, each next id near the last ones, instead of the MovieLens
# download and its pandas processing); 256 training and 64 test examples; embedding dimension
# 16 instead of 32; 2 epochs instead of 5, verbose=0; no prints and no prediction section.
#
# Changed for mirrorkit (`ported` against `original`, LINES_CHANGED, counted by difflib):
# import mirrorkit; strategy = mk.strategy(...); `with strategy.scope():` around the model's
# construction and compile (re-indented); the training set through mk.distribute (its batches
# and order kept); in compute_loss, the candidates gathered from every replica
# (mk.all_gather) and the labels' diagonal moved to this replica's rows (one_hot of
# mk.all_gather_offset(...) + arange: Keras 3.15's ops.eye(n, m, k) has the wrong shape for
# large k on TensorFlow): each replica's queries are scored against the global batch's
# candidates, as one device scores them. Without that change the example trains, but as one
# device on N batches of 1/N the size (tests/test_global_batch_loss.py shows the difference).

import numpy as np

LINES_CHANGED = {"added": 13, "removed": 6, "reindented": 4}
REQUIRES = ("keras_rs",)
MOVIES = 60
CONTEXT = 10
BATCH_SIZE = 64
TEST_BATCH_SIZE = 32


def write_data(workdir):
    import os

    rng = np.random.default_rng(0)
    sequences = np.zeros((320, CONTEXT + 1), "int32")
    sequences[:, 0] = rng.integers(1, MOVIES + 1, 320)
    for t in range(1, CONTEXT + 1):  # each next movie near the last: something to learn
        step = rng.integers(-3, 4, 320)
        sequences[:, t] = (sequences[:, t - 1] - 1 + step) % MOVIES + 1
    np.savez(os.path.join(workdir, "sequences.npz"), train=sequences[:256], test=sequences[256:])


def original(workdir):
    import os

    import keras
    import keras_rs
    import numpy as np
    import tensorflow as tf

    movies_count = MOVIES
    EMBEDDING_DIM = 16
    LEARNING_RATE = 0.005
    NUM_EPOCHS = 2

    with np.load(os.path.join(workdir, "sequences.npz")) as f:
        train, test = f["train"], f["test"]
    train_ds = tf.data.Dataset.from_tensor_slices((train[:, :-1], train[:, -1]))
    test_ds = tf.data.Dataset.from_tensor_slices((test[:, :-1], test[:, -1]))
    train_ds = train_ds.batch(BATCH_SIZE).cache().prefetch(tf.data.AUTOTUNE)
    test_ds = test_ds.batch(TEST_BATCH_SIZE).cache().prefetch(tf.data.AUTOTUNE)

    class SequentialRetrievalModel(keras.Model):
        def __init__(self, movies_count, embedding_dimension=128, **kwargs):
            super().__init__(**kwargs)
            self.query_model = keras.Sequential(
                [
                    keras.layers.Embedding(movies_count + 1, embedding_dimension),
                    keras.layers.GRU(embedding_dimension),
                ]
            )
            self.candidate_model = keras.layers.Embedding(movies_count + 1, embedding_dimension)
            self.retrieval = keras_rs.layers.BruteForceRetrieval(k=10, return_scores=False)
            self.loss_fn = keras.losses.CategoricalCrossentropy(from_logits=True)

        def build(self, input_shape):
            self.query_model.build(input_shape)
            self.candidate_model.build(input_shape)
            self.retrieval.candidate_embeddings = self.candidate_model.embeddings
            self.retrieval.build(input_shape)
            super().build(input_shape)

        def call(self, inputs, training=False):
            query_embeddings = self.query_model(inputs)
            result = {"query_embeddings": query_embeddings}
            if not training:
                result["predictions"] = self.retrieval(query_embeddings)
            return result

        def compute_loss(self, x, y, y_pred, sample_weight, training=True):
            candidate_id = y
            query_embeddings = y_pred["query_embeddings"]
            candidate_embeddings = self.candidate_model(candidate_id)

            num_queries = keras.ops.shape(query_embeddings)[0]
            num_candidates = keras.ops.shape(candidate_embeddings)[0]

            labels = keras.ops.eye(num_queries, num_candidates)

            scores = keras.ops.matmul(query_embeddings, keras.ops.transpose(candidate_embeddings))

            return self.loss_fn(labels, scores, sample_weight)

    model = SequentialRetrievalModel(
        movies_count=movies_count + 1, embedding_dimension=EMBEDDING_DIM
    )
    model.compile(optimizer=keras.optimizers.AdamW(learning_rate=LEARNING_RATE))
    history = model.fit(train_ds, validation_data=test_ds, epochs=NUM_EPOCHS, verbose=0)

    from keras_io import outcome

    return outcome(model, history)


def ported(workdir, cpu_replicas):
    import os

    import keras
    import keras_rs
    import numpy as np
    import tensorflow as tf

    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=cpu_replicas)

    movies_count = MOVIES
    EMBEDDING_DIM = 16
    LEARNING_RATE = 0.005
    NUM_EPOCHS = 2

    with np.load(os.path.join(workdir, "sequences.npz")) as f:
        train, test = f["train"], f["test"]
    train_ds = tf.data.Dataset.from_tensor_slices((train[:, :-1], train[:, -1]))
    test_ds = tf.data.Dataset.from_tensor_slices((test[:, :-1], test[:, -1]))
    train_ds = train_ds.batch(BATCH_SIZE).cache().prefetch(tf.data.AUTOTUNE)
    test_ds = test_ds.batch(TEST_BATCH_SIZE).cache().prefetch(tf.data.AUTOTUNE)
    train_ds = mk.distribute(train_ds, strategy, shuffle=False)

    class SequentialRetrievalModel(keras.Model):
        def __init__(self, movies_count, embedding_dimension=128, **kwargs):
            super().__init__(**kwargs)
            self.query_model = keras.Sequential(
                [
                    keras.layers.Embedding(movies_count + 1, embedding_dimension),
                    keras.layers.GRU(embedding_dimension),
                ]
            )
            self.candidate_model = keras.layers.Embedding(movies_count + 1, embedding_dimension)
            self.retrieval = keras_rs.layers.BruteForceRetrieval(k=10, return_scores=False)
            self.loss_fn = keras.losses.CategoricalCrossentropy(from_logits=True)

        def build(self, input_shape):
            self.query_model.build(input_shape)
            self.candidate_model.build(input_shape)
            self.retrieval.candidate_embeddings = self.candidate_model.embeddings
            self.retrieval.build(input_shape)
            super().build(input_shape)

        def call(self, inputs, training=False):
            query_embeddings = self.query_model(inputs)
            result = {"query_embeddings": query_embeddings}
            if not training:
                result["predictions"] = self.retrieval(query_embeddings)
            return result

        def compute_loss(self, x, y, y_pred, sample_weight, training=True):
            candidate_id = y
            query_embeddings = y_pred["query_embeddings"]
            # every replica's candidates: the global batch's in-batch negatives
            candidate_embeddings = mk.all_gather(self.candidate_model(candidate_id))

            num_queries = keras.ops.shape(query_embeddings)[0]
            num_candidates = keras.ops.shape(candidate_embeddings)[0]

            # the diagonal, moved to this replica's rows among them
            offset = mk.all_gather_offset(query_embeddings)
            labels = keras.ops.one_hot(offset + keras.ops.arange(num_queries), num_candidates)

            scores = keras.ops.matmul(query_embeddings, keras.ops.transpose(candidate_embeddings))

            return self.loss_fn(labels, scores, sample_weight)

    with strategy.scope():
        model = SequentialRetrievalModel(
            movies_count=movies_count + 1, embedding_dimension=EMBEDDING_DIM
        )
        model.compile(optimizer=keras.optimizers.AdamW(learning_rate=LEARNING_RATE))
    history = model.fit(train_ds, validation_data=test_ds, epochs=NUM_EPOCHS, verbose=0)

    from keras_io import outcome

    return outcome(model, history)
