"""Train on a Slurm cluster: ``sbatch examples/slurm/train.sbatch``.

The same script runs either way Slurm can start the workers:

- one Slurm task per worker (``mk.strategy()`` reads the step's SLURM_*
  variables: nodes, tasks per node, this task's node and local id)::

      srun --nodes=2 --ntasks-per-node=1 python examples/slurm/train.py --out w.npy

- one ``mirrorkit launch`` per node, each starting K workers (here K=1;
  output lines carry the job-wide worker rank, ``[w1]`` on the second node)::

      srun --nodes=2 --ntasks-per-node=1 mirrorkit launch -n 1 examples/slurm/train.py

Without Slurm it trains on one device, to the same weights:
``python examples/slurm/train.py --out one.npy``. The chief writes the final
weights to ``--out`` (a path every node sees, e.g. on the shared file system).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

GLOBAL_BATCH = 64


def make_data():
    """Four classes of 16 features, 1024 examples, the same on every worker."""
    import numpy as np

    rng = np.random.default_rng(0)
    centres = rng.normal(scale=0.5, size=(4, 16))
    y = rng.integers(0, 4, size=1024).astype("int32")
    x = (centres[y] + rng.normal(size=(1024, 16))).astype("float32")
    return x, y


def make_model():
    import keras

    keras.utils.set_random_seed(0)  # the same initial weights on every worker
    model = keras.Sequential(
        [keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(4)]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", default=None, help="the chief writes the final weights here")
    args = parser.parse_args(argv)

    import numpy as np

    import mirrorkit as mk

    strategy = mk.strategy()  # MultiWorkerMirroredStrategy under a Slurm step of several tasks
    here = mk.describe(strategy)
    print(
        f"worker {here.worker_index} of {here.num_workers} on {os.uname().nodename}: "
        f"{', '.join(here.local_devices)}",
        flush=True,
    )
    model = mk.build(make_model, strategy)
    data = mk.distribute(make_data(), strategy, global_batch_size=GLOBAL_BATCH, seed=0)
    history = model.fit(data, epochs=args.epochs, verbose=2 if mk.is_chief() else 0)
    mk.print(f"trained: loss {history.history['loss'][-1]:.4f}")
    if args.out and mk.is_chief():
        np.save(args.out, np.concatenate([w.ravel() for w in model.get_weights()]))


if __name__ == "__main__":
    main()
