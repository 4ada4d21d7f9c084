"""Recommender across workers: matrix factorisation, each worker reading only its own files.

What it shows: the input side of multi-worker training. The user-item
interactions are written as TFRecord shards first (into ``--data_dir``); each
worker then reads only its own slice of the files (TensorFlow's input context:
worker i of n reads shards i, i+n, ...), and the log shows which files each
worker read. The model is matrix factorisation: a user embedding scored against
every item's embedding plus an item bias, trained with a softmax over all items
(embeddings of the two towers, users and items, meet in a dot product).
Ranking quality is recall@10 on one held-out interaction per user, next to the
popularity baseline (recommend the most popular items the user has not seen).

The interactions are synthetic but structured, from a fixed seed: users and
items have 8 hidden taste factors, item popularity follows a Zipf-like law, and
each user picks ``--per_user`` items with probability rising with taste match
and popularity. Nothing is downloaded.

Two workers on this machine::

    mirrorkit launch -n 2 examples/recommender_multiworker.py
    mirrorkit launch -n 2 examples/recommender_multiworker.py --smoke    # as CI runs it

Several hosts (``--data_dir`` on storage every host reads)::

    python examples/recommender_multiworker.py --worker_hosts h1:2222,h2:2222 --task_index 0 \\
        --data_dir /shared/interactions                                   # and --task_index 1 on h2
"""

import glob
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags, logging  # noqa: E402

import mirrorkit as mk  # noqa: E402
from mirrorkit import flags as mk_flags  # noqa: E402

mk_flags.define_flags(per_replica_batch_size=128)
flags.DEFINE_string("data_dir", None, "Where the TFRecord shards go (default: a temp folder).")
flags.DEFINE_integer("num_shards", 8, "TFRecord files the interactions are written into.")
flags.DEFINE_integer("users", 2000, "Users in the synthetic interaction set.")
flags.DEFINE_integer("items", 400, "Items in the synthetic interaction set.")
flags.DEFINE_integer("per_user", 20, "Interactions per user (one is held out for recall@10).")
flags.DEFINE_integer("dim", 16, "Embedding size of users and items.")
flags.DEFINE_integer("epochs", 8, "Passes over the training interactions.")
flags.DEFINE_bool("smoke", False, "Run a few steps only (CI, on CPU).")
FLAGS = flags.FLAGS

SEED = 0
TASTE_FACTORS = 8


def make_interactions(users, items, per_user, seed=SEED):
    """Synthetic interactions with hidden structure: (train_pairs, held_out_item_per_user)."""
    rng = np.random.default_rng(seed)
    taste = rng.normal(size=(users, TASTE_FACTORS)) @ rng.normal(size=(TASTE_FACTORS, items))
    popularity = -np.log(rng.permutation(np.arange(1, items + 1)))  # Zipf-like, shuffled
    noisy = taste + popularity + rng.gumbel(size=taste.shape)
    picked = np.argsort(-noisy, axis=1)[:, :per_user]  # per_user distinct items, Gumbel-top-k
    held = rng.integers(per_user, size=users)
    held_out = picked[np.arange(users), held]
    train = np.array(
        [(u, i) for u in range(users) for k, i in enumerate(picked[u]) if k != held[u]],
        dtype="int64",
    )
    return train[rng.permutation(len(train))], held_out


def write_shards(pairs, data_dir, num_shards):
    """Writes the pairs as num_shards TFRecord files of tf.train.Example; returns their paths."""
    os.makedirs(data_dir, exist_ok=True)
    paths = []
    for shard, part in enumerate(np.array_split(pairs, num_shards)):
        path = os.path.join(data_dir, f"interactions-{shard:05d}-of-{num_shards:05d}.tfrecord")
        paths.append(path)
        if os.path.exists(path):
            continue
        partial = f"{path}.tmp-{os.getpid()}"  # workers may write at once: rename atomically
        with tf.io.TFRecordWriter(partial) as writer:
            for user, item in part:
                feature = {
                    "user": tf.train.Feature(int64_list=tf.train.Int64List(value=[user])),
                    "item": tf.train.Feature(int64_list=tf.train.Int64List(value=[item])),
                }
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                writer.write(example.SerializeToString())
        os.replace(partial, path)
    return paths


def parse(record):
    spec = {
        "user": tf.io.FixedLenFeature([], tf.int64),
        "item": tf.io.FixedLenFeature([], tf.int64),
    }
    example = tf.io.parse_single_example(record, spec)
    return tf.cast(example["user"], tf.int32), tf.cast(example["item"], tf.int32)


def worker_input(paths, examples_per_shard):
    """tf.data for one worker: only its own shards, shuffled, repeated."""

    def pipeline(context):
        mine = paths[context.input_pipeline_id :: context.num_input_pipelines]
        print(
            f"worker {context.input_pipeline_id} of {context.num_input_pipelines} reads "
            f"{len(mine)} of {len(paths)} files: "
            + ", ".join(os.path.basename(p).split("-of-")[0] for p in mine)
            + f" ({len(mine) * examples_per_shard:,} interactions)",
            flush=True,
        )
        dataset = tf.data.TFRecordDataset(mine).map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        return dataset.shuffle(10_000, seed=SEED + context.input_pipeline_id).repeat()

    return pipeline


class ItemScores(keras.layers.Layer):
    """The item tower: scores a user vector against every item (dot product plus item bias)."""

    def __init__(self, items, dim, **kwargs):
        super().__init__(**kwargs)
        self.items, self.dim = items, dim

    def build(self, input_shape):
        init = keras.initializers.RandomNormal(stddev=0.05)
        self.embeddings = self.add_weight(shape=(self.items, self.dim), initializer=init)
        self.bias = self.add_weight(shape=(self.items,), initializer="zeros")

    def call(self, user_vectors):
        return keras.ops.matmul(user_vectors, keras.ops.transpose(self.embeddings)) + self.bias


def make_model(users, items, dim):
    user = keras.Input((), dtype="int32")
    vector = keras.layers.Embedding(users, dim, name="users")(user)
    scores = ItemScores(items, dim, name="items")(vector)
    model = keras.Model(user, scores, name="matrix_factorisation")
    model.compile(
        optimizer=keras.optimizers.Adam(5e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def recall_at_10(scores, train_pairs, held_out):
    """Share of users whose held-out item is among the 10 best-scored items they have not seen."""
    scores = np.array(scores, dtype="float64")
    scores[train_pairs[:, 0], train_pairs[:, 1]] = -np.inf
    top10 = np.argpartition(-scores, 10, axis=1)[:, :10]
    return float(np.mean((top10 == held_out[:, None]).any(axis=1)))


def main(argv):
    del argv
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    keras.utils.set_random_seed(SEED)
    strategy = mk_flags.strategy_from_flags()  # MultiWorkerMirroredStrategy under a launcher

    pairs, held_out = make_interactions(FLAGS.users, FLAGS.items, FLAGS.per_user)
    name = f"mirrorkit-recommender-{FLAGS.users}x{FLAGS.items}x{FLAGS.per_user}-seed{SEED}"
    data_dir = FLAGS.data_dir or os.path.join(tempfile.gettempdir(), name)
    paths = write_shards(pairs, data_dir, FLAGS.num_shards)
    mk.print(
        f"{len(pairs):,} training interactions of {FLAGS.users:,} users with {FLAGS.items} items "
        f"in {len(paths)} TFRecord files in {data_dir}; one more per user held out"
    )

    train = mk_flags.distribute_from_flags(
        worker_input(
            sorted(glob.glob(os.path.join(data_dir, "*.tfrecord"))), len(pairs) // len(paths)
        ),
        strategy,
    )
    steps = 3 if FLAGS.smoke else len(pairs) // train.global_batch_size
    model = mk_flags.build_from_flags(
        lambda: make_model(FLAGS.users, FLAGS.items, FLAGS.dim), strategy
    )
    throughput = mk_flags.callbacks_from_flags(warmup_steps=1 if FLAGS.smoke else 5, verbose=0)
    model.fit(
        train,
        epochs=1 if FLAGS.smoke else FLAGS.epochs,
        steps_per_epoch=steps,
        verbose=2,
        callbacks=throughput,
    )
    mk.print(throughput[0].report)

    users = model.get_layer("users").embeddings.numpy()
    items = model.get_layer("items")
    scores = users @ items.embeddings.numpy().T + items.bias.numpy()
    popular = np.bincount(pairs[:, 1], minlength=FLAGS.items).astype("float64")
    model_recall = recall_at_10(scores, pairs, held_out)
    popularity_recall = recall_at_10(np.tile(popular, (FLAGS.users, 1)), pairs, held_out)
    mk.print(
        f"recall@10 {model_recall:.4f} (popularity baseline {popularity_recall:.4f}) on "
        f"{FLAGS.users:,} held-out interactions; {strategy.num_replicas_in_sync} replicas, "
        f"global batch {train.global_batch_size}"
    )


if __name__ == "__main__":
    app.run(main)
