"""ResNet on a global batch: 8 replicas x 32 = 256, bucketed gradients, learning rate scaled.

What it shows: the classic large-batch recipe (Goyal et al., 2017, "Accurate,
Large Minibatch SGD"). Each of 8 replicas takes 32 examples per step, so one
step sees a global batch of 256; gradients are packed into 25 MB all-reduce
buckets (PyTorch DDP's default) so the all-reduce starts before the backward
pass ends; and the learning rate follows the linear scaling rule, 0.1 per 256
examples, reached by a linear warm-up (`mk.scale_learning_rate`). The model is
a small ResNet (basic residual blocks with batch normalisation) on the 1,797
UCI digits that ship with mirrorkit (8x8 images, CC BY 4.0), upsampled to 16x16.

Batch normalisation here is per replica (32 examples each), as in the paper;
``--sync_bn`` makes it use the statistics of the whole global batch instead, at
the price of one all-reduce per layer.

Real hardware (8 GPUs; change --per_replica_batch_size, the learning rate follows)::

    python examples/resnet_global_batch.py --num_gpus 8 --epochs 30

On a CPU (8 simulated replicas)::

    python examples/resnet_global_batch.py --cpu_replicas 8
    python examples/resnet_global_batch.py --smoke
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
from absl import app, flags, logging  # noqa: E402

import mirrorkit as mk  # noqa: E402
from mirrorkit import flags as mk_flags  # noqa: E402
from mirrorkit.demo.data import split_digits  # noqa: E402

mk_flags.define_flags(per_replica_batch_size=32, bucket_mb=25)
flags.DEFINE_integer("epochs", 20, "Passes over the training images.")
flags.DEFINE_float("base_lr", 0.1, "Learning rate tuned for --base_batch examples per step.")
flags.DEFINE_integer("base_batch", 256, "The global batch that --base_lr was tuned for.")
flags.DEFINE_float("warmup_epochs", 2, "Epochs of linear learning-rate warm-up.")
flags.DEFINE_integer("blocks_per_stage", 2, "Residual blocks in each of the 3 stages.")
flags.DEFINE_bool("sync_bn", False, "Batch-norm statistics over the global batch, not per replica.")
flags.DEFINE_bool("smoke", False, "Run a few steps only (CI, on CPU).")
FLAGS = flags.FLAGS

REPLICAS_ON_CPU = 8


def residual_block(x, filters, stride, sync_bn):
    shortcut = x
    y = keras.layers.Conv2D(filters, 3, stride, padding="same", use_bias=False)(x)
    y = keras.layers.BatchNormalization(synchronized=sync_bn)(y)
    y = keras.layers.ReLU()(y)
    y = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)(y)
    y = keras.layers.BatchNormalization(synchronized=sync_bn, gamma_initializer="zeros")(y)
    if stride != 1 or shortcut.shape[-1] != filters:
        shortcut = keras.layers.Conv2D(filters, 1, stride, use_bias=False)(shortcut)
        shortcut = keras.layers.BatchNormalization(synchronized=sync_bn)(shortcut)
    return keras.layers.ReLU()(keras.layers.Add()([y, shortcut]))


def make_resnet(learning_rate, sync_bn, blocks=2, width=16, stages=3):
    """A small ResNet: a stem, then `stages` stages of `blocks` basic blocks (width x 1, 2, 4)."""
    inputs = keras.Input((8, 8, 1))
    x = keras.layers.Rescaling(1 / 16)(inputs)
    x = keras.layers.Resizing(16, 16)(x)
    x = keras.layers.Conv2D(width, 3, padding="same", use_bias=False)(x)
    x = keras.layers.ReLU()(keras.layers.BatchNormalization(synchronized=sync_bn)(x))
    for filters, stride in ((width, 1), (2 * width, 2), (4 * width, 2))[:stages]:
        x = residual_block(x, filters, stride, sync_bn)
        for _ in range(blocks - 1):
            x = residual_block(x, filters, 1, sync_bn)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(10)(x), name=f"resnet{2 * stages * blocks + 2}")
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate, momentum=0.9, nesterov=True),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def main(argv):
    del argv
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    keras.utils.set_random_seed(0)
    strategy = mk_flags.strategy_from_flags(default_cpu_replicas=REPLICAS_ON_CPU)
    (x_train, y_train), (x_test, y_test) = split_digits()
    train = mk_flags.distribute_from_flags((x_train, y_train), strategy, seed=0)
    test = mk_flags.distribute_from_flags((x_test, y_test), strategy, for_eval=True)

    # Linear rule: base_lr per base_batch examples, scaled to the global batch, warmed up.
    learning_rate = mk.scale_learning_rate(
        FLAGS.base_lr,
        FLAGS.base_batch,
        train.global_batch_size,
        warmup_epochs=FLAGS.warmup_epochs,
        steps_per_epoch=train.steps_per_epoch,
    )
    blocks, width, stages = (1, 8, 1) if FLAGS.smoke else (FLAGS.blocks_per_stage, 16, 3)
    model = mk_flags.build_from_flags(
        lambda: make_resnet(learning_rate, FLAGS.sync_bn, blocks, width, stages), strategy
    )
    mk.print(
        f"{strategy.num_replicas_in_sync} replicas x {train.per_replica_batch_size} = global "
        f"batch {train.global_batch_size}; {model.name}, {model.count_params():,} parameters"
    )
    throughput = mk_flags.callbacks_from_flags(warmup_steps=1 if FLAGS.smoke else 3, verbose=0)
    model.fit(
        train,
        epochs=1 if FLAGS.smoke else FLAGS.epochs,
        steps_per_epoch=2 if FLAGS.smoke else None,
        verbose=2,
        callbacks=throughput,
    )
    mk.print(throughput[0].report)
    loss, accuracy = model.evaluate(test, steps=1 if FLAGS.smoke else None, verbose=0)
    mk.print(f"test accuracy {accuracy:.4f} (loss {loss:.4f}) on {len(y_test)} held-out digits")


if __name__ == "__main__":
    app.run(main)
