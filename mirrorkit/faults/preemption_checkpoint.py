"""Preemption and rescaling: a checkpoint at one step boundary on SIGTERM, resumed anywhere.

`PreemptionCheckpoint` is a Keras callback around TensorFlow's own
`tf.distribute.experimental.PreemptionCheckpointHandler`, which catches
SIGTERM (a cloud VM being reclaimed, Slurm's signal before the kill) on any
worker, agrees with every worker on the step after the one in flight (through
the cluster's coordination service), and there saves one checkpoint. The
callback adds what Keras's ``fit`` needs from it:

- the check runs before each training step, so the checkpoint holds the
  weights, the optimizer and the count of the steps completed, all at the same
  step boundary on every worker; then every worker exits with status
  `mirrorkit.exit_statuses.PREEMPTED` (42), and `mirrorkit launch` ends with it, saying so;
- the next run restores the checkpoint and resumes at that epoch *and step*:
  the steps already done in that epoch are read from the input but not trained
  (the batches are drawn and dropped), so the remaining steps see the same
  global batches as an uninterrupted run;
- the global batch size is in the checkpoint, and the worker or replica count
  is not: a job preempted on 2 workers (or 4 replicas) resumes on 1 (or 2)
  with the same global batch and the same result, since `mk.distribute` cuts
  the same global batches whatever the replica count. A different global
  batch is refused unless ``new_global_batch=True``.

A SIGTERM in the last steps of ``fit`` (TensorFlow agrees on a boundary a
step or two after the one in flight, and none is left) saves nothing: ``fit``
completes on every worker, which is the uninterrupted run, and the chief says
so (tested on 2 workers, SIGTERM before the last step).

The checkpoint is TensorFlow's (``tf.train.Checkpoint`` of the model and its
optimizer); the chief keeps it in ``checkpoint_dir`` (storage every worker
sees) and deletes it when ``fit`` completes. Resuming at a step needs an input
that gives the same batches each run: ``mk.distribute`` shuffles in-memory
arrays in an order drawn from (seed, epoch) (`mirrorkit.pipeline.epoch_order`),
which this callback sets at each epoch and carries in the checkpoint with the
seed (a drawn seed included), so a shuffled epoch resumes in its order. A
shuffled stream (a tf.data pipeline, tfds files) draws new orders: said once on
resume; ``shuffle=False`` keeps its order.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
from typing import Any

import keras
import tensorflow as tf

from mirrorkit import internals
from mirrorkit.cluster import chief, workers
from mirrorkit.exit_statuses import PREEMPTED
from mirrorkit.faults.preemption_relay import Preempted, local_workers
from mirrorkit.feeding import input_position
from mirrorkit.pipeline import epoch_order

__all__ = ["PreemptionCheckpoint", "Preempted", "local_workers"]


class PreemptionCheckpoint(keras.callbacks.Callback):
    """Saves a checkpoint at one step boundary on SIGTERM and resumes from it at that step.

    Args:
        checkpoint_dir: where the checkpoint lives: storage every worker sees,
            used for nothing else.
        global_batch_size: this run's global batch: an int, or the dataset
            `mk.distribute` returned (it carries ``global_batch_size``).
        new_global_batch: allow resuming a checkpoint saved with another
            global batch (the epoch resumes after the examples already used,
            said once); without it that is refused.

    Raises (at the start of ``fit``):
        ValueError: the checkpoint has another global batch, and
            ``new_global_batch`` is False; ``steps_per_execution`` is not 1.

    Example:
    ```python
    import keras
    import numpy as np
    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=2)

    def make_model():  # compiled inside the strategy's scope, by mk.build
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    model = mk.build(make_model, strategy)
    x, y = np.ones((1024, 4)), np.ones((1024, 1))
    data = mk.distribute((x, y), strategy, global_batch_size=256)  # shuffled: resumes in order
    model.fit(data, epochs=3, callbacks=[mk.PreemptionCheckpoint("run1/preempt", data)])
    # SIGTERM to any worker: every worker saves at the same step, exits 42; run it again
    ```
    """

    def __init__(
        self, checkpoint_dir: str, global_batch_size: Any, *, new_global_batch: bool = False
    ):
        super().__init__()
        if not checkpoint_dir:
            raise ValueError(
                f"PreemptionCheckpoint(checkpoint_dir={checkpoint_dir!r}): give a directory on "
                "storage every worker sees, used for nothing else."
            )
        size = getattr(global_batch_size, "global_batch_size", global_batch_size)
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(
                f"PreemptionCheckpoint(global_batch_size={global_batch_size!r}): give the "
                "global batch size (an int) or the dataset mk.distribute returned."
            )
        self.checkpoint_dir = str(checkpoint_dir)
        self.global_batch_size = size
        self._data = None if isinstance(global_batch_size, int) else global_batch_size
        self.new_global_batch = bool(new_global_batch)
        self._handler = None

    def on_train_begin(self, logs=None):
        """Restores the checkpoint, if any; checks the global batch; starts watching for SIGTERM."""
        model = self.model
        if getattr(model, "steps_per_execution", 1) != 1:
            raise ValueError(
                f"PreemptionCheckpoint needs steps_per_execution=1 (compile() has "
                f"{model.steps_per_execution}): it agrees on the step to save at between steps."
            )
        steps = (self.params or {}).get("steps")
        if not steps:
            raise ValueError(
                "PreemptionCheckpoint needs the epoch length: give fit() steps_per_epoch=, or "
                "data whose length is known (mk.distribute's in-memory arrays)."
            )
        strategy = model.distribute_strategy
        with strategy.scope():
            if model.optimizer is not None and not model.optimizer.built:
                model.optimizer.build(model.trainable_variables)
        self._epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._step = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._batch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._orders = epoch_order.orders(self._data)
        # the seed is carried only for the dataset given (a drawn seed is then replayed)
        carried = self._orders[0] if self._data is not None and self._orders else None
        shuffle = {} if carried is None else {"mirrorkit_shuffle_seed": carried.seed}
        seed = None if carried is None else int(carried.seed.numpy())
        checkpoint = tf.train.Checkpoint(
            model=model,
            optimizer=model.optimizer,
            mirrorkit_epoch=self._epoch,
            mirrorkit_step=self._step,
            mirrorkit_global_batch=self._batch,
            **shuffle,
        )
        held = input_position.pending(model)  # a backup restored earlier in this fit
        kept = _snapshot(model) if held is not None else None
        config = tf.distribute.experimental.TerminationConfig(exit_fn=self._exit)
        self._handler = tf.distribute.experimental.PreemptionCheckpointHandler(
            getattr(strategy, "cluster_resolver", None),
            checkpoint,
            checkpoint_dir=self.checkpoint_dir,
            termination_config=config,
        )
        self._note_sigterm()
        saved_batch = int(self._batch.numpy())
        if saved_batch == 0:  # nothing restored: a fresh start
            self._batch.assign(self.global_batch_size)
            return
        epoch, step = int(self._epoch.numpy()), int(self._step.numpy())
        epoch_order.say_if_not_replayed(self._data)
        if carried is not None:
            carried.seed_drawn = False  # the checkpoint's seed: the interrupted run's
        if carried is not None and int(carried.seed.numpy()) != seed:
            chief.say_once(
                "preempt-shuffle-seed",
                f"resuming with the checkpoint's shuffle seed {int(carried.seed.numpy())} "
                f"(this run's was {seed}), so the epochs keep their uninterrupted orders",
            )
        if saved_batch != self.global_batch_size:
            if not self.new_global_batch:
                raise ValueError(
                    f"The preemption checkpoint in {self.checkpoint_dir} was saved with global "
                    f"batch {saved_batch}, and this run's is {self.global_batch_size}: resuming "
                    "would change the training (another batch, another number of steps). Resume "
                    f"with global_batch_size={saved_batch} (any number of workers or replicas "
                    "that divides it), or pass PreemptionCheckpoint(..., new_global_batch=True) "
                    "to continue with the new batch."
                )
            used = step * saved_batch
            step = used // self.global_batch_size
            chief.say_once(
                f"preempt-new-batch-{saved_batch}-{self.global_batch_size}",
                f"resuming a checkpoint of global batch {saved_batch} with global batch "
                f"{self.global_batch_size} (new_global_batch=True): epoch {epoch + 1} continues "
                f"after {step * self.global_batch_size} of the {used} examples it had used",
            )
            self._batch.assign(self.global_batch_size)
        if step >= steps:
            epoch, step = epoch + 1, 0
        source = f"the preemption checkpoint in {self.checkpoint_dir}"
        if not input_position.resume_at(model, epoch, step, source, always=True, say=False):
            _restore_snapshot(model, kept)  # the backup restored before is later: its weights
            return
        chief.print(
            f"mirrorkit: resuming from the preemption checkpoint at epoch {epoch + 1} step {step} "
            f"(global batch {self.global_batch_size}, {strategy.num_replicas_in_sync} replicas)"
        )

    def on_epoch_begin(self, epoch, logs=None):
        """Notes the epoch (the resumed epoch's first steps are skipped by `input_position`)."""
        self._epoch.assign(epoch)
        for order in self._orders:  # the shuffled order of this epoch, on every run
            order.begin(epoch)

    def on_train_batch_begin(self, batch, logs=None):
        """Between steps: saves and exits here if a worker was preempted (TF's handler)."""
        self._step.assign(batch)
        self._handler.save_checkpoint_if_preempted()

    def on_train_end(self, logs=None):
        """A completed fit needs no checkpoint: the chief deletes it (and says a late SIGTERM)."""
        self._say_if_completed_after_sigterm()
        self._remove_worker_copy()
        if chief.is_chief() and os.path.isdir(self.checkpoint_dir):
            shutil.rmtree(self.checkpoint_dir, ignore_errors=True)

    def _remove_worker_copy(self) -> None:
        """On a worker that is not the chief: removes the directory of its own copy.

        TensorFlow's handler has every worker write the checkpoint, the others into
        ``workertemp_<task>`` beside `checkpoint_dir`, which it makes at the start and never
        removes: only the chief's copy is read back.
        """
        if chief.is_chief():
            return
        manager = internals.optional(
            self._handler,
            "_write_checkpoint_manager",
            name="tf PreemptionCheckpointHandler._write_checkpoint_manager",
            used_for="removing a non-chief worker's copy of the preemption checkpoint "
            "(without it its workertemp_<task> directory is left beside checkpoint_dir)",
        )
        own = os.path.dirname(os.path.normpath(manager.directory)) if manager else ""
        if os.path.basename(own).startswith("workertemp_") and os.path.isdir(own):
            shutil.rmtree(own, ignore_errors=True)

    # -- a SIGTERM after the last step boundary ------------------------------

    _sigterm_seen = False
    _tf_sigterm = None

    def _note_sigterm(self) -> None:
        """Notes a SIGTERM on its way to TensorFlow's handler (public `signal` API only).

        TensorFlow's handler agrees on a step boundary a little after the step in
        flight; a SIGTERM in the last steps of ``fit`` finds no boundary left, and
        ``fit`` completes: `on_train_end` then says so, since nothing is left to resume.
        """
        handler = signal.getsignal(signal.SIGTERM)
        if not callable(handler) or threading.current_thread() is not threading.main_thread():
            return

        def noted(signum, frame):
            self._sigterm_seen = True
            handler(signum, frame)

        self._tf_sigterm = handler
        signal.signal(signal.SIGTERM, noted)

    def _say_if_completed_after_sigterm(self) -> None:
        if self._tf_sigterm is None:
            return
        signal.signal(signal.SIGTERM, self._tf_sigterm)  # TensorFlow's own again
        self._tf_sigterm = None
        strategy = self.model.distribute_strategy
        if workers.num_workers(strategy) > 1:  # every worker calls it: one collective
            table = workers.gather(strategy, [1.0 if self._sigterm_seen else 0.0])
            which = [str(i) for i in range(len(table)) if table[i, 0]]
            who = f"worker {', '.join(which)}"
        else:
            which, who = ["0"] if self._sigterm_seen else [], "this process"
        if not which:
            return
        chief.say(
            f"SIGTERM reached {who} in the last steps of fit, after the last step boundary every "
            "worker could agree on to save at: fit completed instead, so there is nothing to "
            "resume and no preemption checkpoint is kept; the weights are those of the whole run"
        )

    def _exit(self) -> None:
        strategy = self.model.distribute_strategy
        if workers.num_workers(strategy) > 1:
            # every worker leaves once every worker has saved: a launcher that stops the
            # others when the first exits then stops none in the middle of its save
            strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
        self._remove_worker_copy()  # the chief's copy is the one a resumed run reads
        chief.print(
            f"mirrorkit: preempted (SIGTERM): checkpoint saved in {self.checkpoint_dir} at epoch "
            f"{int(self._epoch.numpy()) + 1} step {int(self._step.numpy())}; exiting with status "
            f"{PREEMPTED}. Run the same command again to resume."
        )
        sys.stdout.flush()
        sys.exit(PREEMPTED)


def _snapshot(model: Any) -> list[Any]:
    """The values of `model`'s variables and its optimizer's, to put back (`_restore_snapshot`)."""
    variables = list(model.variables) + list(getattr(model.optimizer, "variables", []) or [])
    return [(variable, variable.numpy()) for variable in variables]


def _restore_snapshot(model: Any, kept: list[Any] | None) -> None:
    for variable, value in kept or []:
        variable.assign(value)
