"""BERT-style masked-language-model pretraining of a small Transformer encoder, across workers.

What it shows: multi-worker data parallelism (MultiWorkerMirroredStrategy)
on real English text, with the gradients all-reduced on the ring every step.
The text is the documentation that ships inside Python's standard library
(``pydoc_data.topics``: 79 help topics, about 64,000 words), so nothing is
downloaded. It is tokenised simply (lower-case words; the most frequent
``--vocab_size`` words plus [PAD], [UNK] and [MASK]), cut into sequences of
``--seq_len`` words, and 15% of the words of each sequence are chosen for
prediction as in BERT (80% replaced by [MASK], 10% by a random word, 10% kept).
Every worker builds the same sequences and TensorFlow gives each its share of
each global batch. The chief reports the masked-token accuracy on held-out
sequences next to the unigram baseline (always predicting the most frequent
word): the model has to learn from context to rise above it.

Two workers on this machine (TF_CONFIG on loopback, set by the launcher)::

    mirrorkit launch -n 2 examples/bert_multiworker.py
    mirrorkit launch -n 2 examples/bert_multiworker.py --smoke      # as CI runs it

Several hosts (the same command on every host; GPU workers: --all_reduce_alg nccl)::

    python examples/bert_multiworker.py --worker_hosts h1:2222,h2:2222 --task_index 0  # on h1
    python examples/bert_multiworker.py --worker_hosts h1:2222,h2:2222 --task_index 1  # on h2
"""

import collections
import os
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags, logging  # noqa: E402

import mirrorkit as mk  # noqa: E402
from mirrorkit import flags as mk_flags  # noqa: E402

mk_flags.define_flags(per_replica_batch_size=32, all_reduce_alg="ring")
flags.DEFINE_integer("epochs", 3, "Passes over the training sequences.")
flags.DEFINE_integer("vocab_size", 2000, "Most frequent words kept; the rest become [UNK].")
flags.DEFINE_integer("seq_len", 32, "Words per sequence.")
flags.DEFINE_integer("dupe_factor", 8, "Differently masked copies of each training sequence.")
flags.DEFINE_float("learning_rate", 3e-3, "Adam learning rate.")
flags.DEFINE_bool("smoke", False, "Run a few steps only (CI, on CPU).")
FLAGS = flags.FLAGS

PAD, UNK, MASK = 0, 1, 2
SPECIALS = ("[PAD]", "[UNK]", "[MASK]")
MASK_RATE = 0.15


def load_words():
    """Lower-case words of the help topics that ship with Python (pydoc_data)."""
    from pydoc_data.topics import topics

    return [re.findall(r"[a-z]+", topics[key].lower()) for key in sorted(topics)]


def make_vocabulary(documents, size):
    counts = collections.Counter(word for doc in documents for word in doc)
    words = list(SPECIALS) + [word for word, _ in counts.most_common(size)]
    return {word: index for index, word in enumerate(words)}


def make_sequences(documents, vocab, seq_len):
    """Cuts each document into sequences of seq_len token ids (the last, shorter piece dropped)."""
    sequences = []
    for doc in documents:
        ids = [vocab.get(word, UNK) for word in doc]
        sequences += [ids[i : i + seq_len] for i in range(0, len(ids) - seq_len + 1, seq_len)]
    return np.array(sequences, dtype="int32")


def mask_tokens(sequences, vocab_size, rng):
    """BERT's masking: (inputs, labels, weights), weight 1 where a word is to be predicted."""
    chosen = (rng.random(sequences.shape) < MASK_RATE) & (sequences != UNK)
    action = rng.random(sequences.shape)
    inputs = sequences.copy()
    inputs[chosen & (action < 0.8)] = MASK
    randomized = chosen & (action >= 0.8) & (action < 0.9)
    inputs[randomized] = rng.integers(len(SPECIALS), vocab_size, randomized.sum())
    return inputs, sequences, chosen.astype("float32")


class PositionEmbedding(keras.layers.Layer):
    """Adds a learned embedding of each position to the token embeddings."""

    def build(self, input_shape):
        self.positions = self.add_weight(
            shape=tuple(input_shape[1:]), initializer=keras.initializers.RandomNormal(stddev=0.02)
        )

    def call(self, x):
        return x + self.positions


def make_encoder(vocab_size, seq_len, learning_rate, dim=64, heads=4, layers=2, ffn=128):
    """A small Transformer encoder with a masked-language-model head over the vocabulary."""
    tokens = keras.Input((seq_len,), dtype="int32")
    x = keras.layers.Embedding(vocab_size, dim)(tokens)
    x = keras.layers.LayerNormalization()(PositionEmbedding()(x))
    for _ in range(layers):
        attention = keras.layers.MultiHeadAttention(heads, dim // heads, dropout=0.1)(x, x)
        x = keras.layers.LayerNormalization()(x + keras.layers.Dropout(0.1)(attention))
        hidden = keras.layers.Dense(ffn, activation="gelu")(x)
        x = keras.layers.LayerNormalization()(x + keras.layers.Dense(dim)(hidden))
    logits = keras.layers.Dense(vocab_size)(x)
    model = keras.Model(tokens, logits, name="mini_bert")
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="masked_accuracy")],
    )
    return model


def main(argv):
    del argv
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    keras.utils.set_random_seed(0)
    strategy = mk_flags.strategy_from_flags()  # MultiWorkerMirroredStrategy under a launcher

    documents = load_words()
    vocab = make_vocabulary(documents, FLAGS.vocab_size)
    sequences = make_sequences(documents, vocab, FLAGS.seq_len)
    held_out = np.arange(len(sequences)) % 5 == 0  # every 5th sequence is for evaluation
    rng = np.random.default_rng(0)  # the same masks on every worker
    train = [mask_tokens(sequences[~held_out], len(vocab), rng) for _ in range(FLAGS.dupe_factor)]
    train = tuple(np.concatenate(parts) for parts in zip(*train, strict=True))
    test = mask_tokens(sequences[held_out], len(vocab), rng)

    # The unigram baseline: always predict the most frequent word among training targets.
    targets = train[1][train[2] > 0]
    most_frequent = np.bincount(targets, minlength=len(vocab)).argmax()
    baseline = float(np.mean(test[1][test[2] > 0] == most_frequent))
    words = {index: word for word, index in vocab.items()}
    mk.print(
        f"{sum(map(len, documents)):,} words in {len(documents)} topics; vocabulary "
        f"{len(vocab):,}; {len(train[0]):,} training and {len(test[0]):,} held-out sequences "
        f"of {FLAGS.seq_len}; {int(test[2].sum()):,} held-out masked words"
    )

    model = mk_flags.build_from_flags(
        lambda: make_encoder(len(vocab), FLAGS.seq_len, FLAGS.learning_rate), strategy
    )
    train_data = mk_flags.distribute_from_flags(train, strategy, seed=0)
    test_data = mk_flags.distribute_from_flags(test, strategy, for_eval=True)
    throughput = mk_flags.callbacks_from_flags(warmup_steps=1 if FLAGS.smoke else 5, verbose=0)
    model.fit(
        train_data,
        epochs=1 if FLAGS.smoke else FLAGS.epochs,
        steps_per_epoch=3 if FLAGS.smoke else None,
        validation_data=None if FLAGS.smoke else test_data,
        verbose=2,
        callbacks=throughput,
    )
    mk.print(throughput[0].report)
    _, accuracy = model.evaluate(test_data, verbose=0)
    mk.print(
        f"held-out masked-token accuracy {accuracy:.4f}; unigram baseline {baseline:.4f} "
        f"(always {words[most_frequent]!r}); {strategy.num_replicas_in_sync} replicas, global "
        f"batch {train_data.global_batch_size}"
    )


if __name__ == "__main__":
    app.run(main)
