"""`NaNGuard`: a non-finite loss or gradient on any replica stops every worker at that step.

Keras's ``TerminateOnNaN`` reads the averaged loss in ``on_batch_end``: it
cannot say which replica or worker went wrong, misses a gradient that is
non-finite while the loss is finite, and (as any callback that acts in
``on_train_batch_end``) runs after the callbacks listed before it, so a
``ModelCheckpoint(save_freq=1)`` listed first has already written the
non-finite weights.

`NaNGuard` checks inside the training step instead. Each replica computes one
flag for its own loss and one for its own gradients, before they are
all-reduced; the flags travel in the same all-reduce as the gradients (a few
bytes more, no extra collective), so every replica of every worker holds the
same verdict after the step. Each worker reads it from its own memory right
after the step, before any callback sees the step, and every worker raises
the same `NonFiniteError` at the same step: nobody goes on training, nobody
waits in a collective for a peer that stopped, and no callback saves the
non-finite state.

The check and the verdict are two hooks of
`mirrorkit.training.gradient_hooks`: ``"nan_guard.check"`` (stage
``"before"``, after the step clock) adds the flags as a rider of the
all-reduce, ``"nan_guard.verdict"`` (stage ``"after"``) reads their sum, with
or without gradient compression in between.
"""

from __future__ import annotations

import threading
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from mirrorkit import internals
from mirrorkit.cluster import cluster_info, workers
from mirrorkit.compat import loss_scale_check, optimizer_step
from mirrorkit.patching import instance
from mirrorkit.training import gradient_hooks, step_hooks

_USED_FOR = "NaNGuard's per-replica gradient check"


class NonFiniteError(FloatingPointError):
    """A replica's loss or gradients were NaN or infinite; raised on every worker at once.

    Attributes:
        step: the training step (the optimizer's iteration count before it, from 0).
        epoch: the epoch, from 1 as Keras prints it.
        replicas: the global replica ids (in the sync group) that went non-finite.
        workers: the workers those replicas belong to.
        what: ``{replica: "loss" | "gradient" | "loss and gradient"}``.
    """

    def __init__(self, message: str, *, step: int, epoch: int, replicas, workers, what):
        super().__init__(message)
        self.step = step
        self.epoch = epoch
        self.replicas = list(replicas)
        self.workers = list(workers)
        self.what = dict(what)


class NaNGuard(keras.callbacks.Callback):
    """Stops every worker at the step where any replica's loss or gradient is not finite.

    Each replica checks its own loss and gradients inside the step, before the
    gradient all-reduce, and the verdict rides in that all-reduce, so every
    worker learns it at the same step. Then every worker raises the same
    `NonFiniteError`, naming the step, the worker(s) and the replica(s).

    Checkpoints: the check runs right after the step, before any callback's
    ``on_train_batch_end``, so no callback sees the bad step, wherever the
    guard sits in the callback list. ``fit`` ends with the error, so
    ``on_epoch_end`` and ``on_train_end`` do not run either: a
    ``ModelCheckpoint`` keeps the last file it wrote before the bad step, and a
    ``BackupAndRestore`` keeps its backup (it deletes it only when training
    ends well), so the next ``fit`` resumes from the last good state. The
    model's weights in memory are those after the bad step (already
    non-finite): restore them from that checkpoint.

    Cost: each ``fit`` traces the step once more (the check is compiled into
    it), and each step checks every gradient and reads the verdict (measured
    +9% step time on 2 CPU replicas with a 200k-parameter MLP; see
    docs: guards/, ``benchmarks/guards_cost.py``). ``steps_per_execution > 1``
    still names the exact step.

    With ``gradient_accumulation_steps=K`` the gradients are all-reduced once per
    optimizer step, on every K-th micro-step, and the check rides there: a
    non-finite micro-step stops ``fit`` at the last micro-step of its optimizer
    step (the error names the optimizer step, as ``iterations`` counts them),
    before the weights take it.

    With a ``LossScaleOptimizer`` (``mixed_float16``) it checks each
    replica's loss only: a non-finite gradient is how dynamic loss scaling
    finds its scale, and that step is skipped on every replica together
    (docs: compat/#mixed-precision-across-replicas); a non-finite loss, which no loss
    scale can fix, stops every worker. The loss flags travel in the loss
    scale's own finite check, not in the gradient all-reduce, which a
    skipped step never reaches.

    Args:
        check_loss: also check each replica's loss (the gradients are always
            checked). A loss without gradients (e.g. only non-trainable
            terms) is caught only by this.

    Example:
    ```python
    import keras
    import mirrorkit as mk

    import numpy as np

    strategy = mk.strategy(cpu_replicas=2)

    def make_model():  # compiled inside the strategy's scope, by mk.build
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    model = mk.build(make_model, strategy)
    x, y = np.ones((256, 4), "float32"), np.ones((256, 1), "float32")
    x[100] = np.nan  # step 3 (global batch 32), first half of its batch: replica 0
    try:
        model.fit(
            mk.distribute((x, y), global_batch_size=32, shuffle=False),
            callbacks=[
                keras.callbacks.BackupAndRestore("backup"),
                mk.callbacks.NaNGuard(),
            ],
        )
    except mk.callbacks.NonFiniteError as err:
        print(err.step, err.workers, err.replicas)  # 3 [0] [0]
    ```
    """

    def __init__(self, check_loss: bool = True):
        super().__init__()
        self.check_loss = check_loss
        self._state: dict[str, Any] | None = None
        self._epoch = 0
        self._losses: dict[tuple[int, int], Any] = {}

    # -- Keras hooks -------------------------------------------------------

    def on_train_begin(self, logs=None):
        """Puts the check into the step (traced again) and the read-out after it."""
        model = self.model
        optimizer = gradient_hooks.innermost_optimizer(model)
        if optimizer is None:
            raise ValueError("NaNGuard needs a compiled model; compile it before fit")
        loss_scaled = optimizer is not getattr(model, "optimizer", None)  # a LossScaleOptimizer
        if loss_scaled and not self.check_loss:
            raise ValueError(
                "NaNGuard(check_loss=False) with a LossScaleOptimizer (mixed_float16) would check "
                "nothing: non-finite gradients are how dynamic loss scaling finds its scale, and "
                "it skips those steps on every replica itself. Keep check_loss=True (the default) "
                "to stop on a non-finite loss."
            )
        if not loss_scaled:
            gradient_hooks.require(optimizer, used_for=_USED_FOR)
        self._uninstall()
        strategy = model.distribute_strategy
        replicas = strategy.num_replicas_in_sync
        with strategy.scope():
            bad = tf.Variable(tf.zeros([2 * replicas]), trainable=False, **_REPLICA_LOCAL)
            first = tf.Variable(tf.constant(-1, tf.int64), trainable=False, **_REPLICA_LOCAL)
        self._state = {
            "strategy": strategy,
            "replicas": replicas,
            "workers": workers.num_workers(strategy),
            "optimizer": optimizer,
            "hooks": (
                gradient_hooks.GradientHook("nan_guard.check", self._check_local),
                gradient_hooks.GradientHook("nan_guard.verdict", self._record_verdict),
            ),
            "bad": bad,
            "first": first,
            "checked": False,  # set when the check is traced (or run eagerly) into the step
            "verdict": step_hooks.StepHook("nan_guard.verdict", self._guarded_step),
        }
        if loss_scaled:  # the loss flags ride in the loss scale's finite check
            self._state["hooks"] = ()
            self._state["loss_scale"] = model.optimizer
            # in place already where the strategy spans replicas; on one replica, for the rider
            optimizer_step.LOSS_SCALE.apply()
            loss_scale_check.add_rider(
                model.optimizer, "nan_guard", self._loss_flags, self._record_loss_verdict
            )
        for hook in self._state["hooks"]:
            gradient_hooks.register(optimizer, hook, used_for=_USED_FOR)
        if self.check_loss:
            compute_loss = internals.require(
                model, "_compute_loss", name="keras Trainer._compute_loss", used_for=_USED_FOR
            )
            self._state["compute_loss"] = compute_loss
            instance.set_on(
                model,
                "_compute_loss",
                self._compute_loss_recorded,
                name="nan_guard.compute_loss",
                reason="NaNGuard records each replica's loss, to check it is finite",
            )
        step_hooks.retrace(model)  # traced again, now with the check inside
        step_hooks.register(model, self._state["verdict"])

    def on_epoch_begin(self, epoch, logs=None):
        """Remembers the epoch, for the error."""
        self._epoch = epoch

    def on_train_end(self, logs=None):
        """Takes the check out again."""
        self._uninstall()

    def _guarded_step(self, call_next, *args, **kwargs):
        logs = call_next(*args, **kwargs)
        self._raise_if_check_missing()
        self._raise_if_non_finite()
        return logs

    # -- in the step -------------------------------------------------------

    def _compute_loss_recorded(self, *args, **kwargs):
        loss = self._state["compute_loss"](*args, **kwargs)
        self._losses[_trace_key()] = loss
        return loss

    def _check_local(self, step: gradient_hooks.Gradients) -> None:
        """Before the all-reduce: this replica's flags ride in it."""
        self._state["checked"] = True
        grads = [g for g, _ in step.grads_and_vars]
        step.riders["nan_guard"] = self._local_flags(grads, self._losses.pop(_trace_key(), None))

    def _loss_flags(self) -> tf.Tensor:
        """With a LossScaleOptimizer: this replica's loss flag, summed in its finite check."""
        self._state["checked"] = True
        flags = self._local_flags([], self._losses.pop(_trace_key(), None))
        return flags[: self._state["replicas"]]

    def _record_loss_verdict(self, summed: tf.Tensor) -> None:
        """Every replica's loss flags (no gradient flags: overflows are loss scaling's)."""
        self._record(tf.concat([summed, tf.zeros_like(summed)], axis=0))

    def _record_verdict(self, step: gradient_hooks.Gradients) -> None:
        """After the all-reduce: every replica's flags, summed, kept with the first bad step."""
        self._record(tf.cast(step.riders.pop("nan_guard"), tf.float32))

    def _record(self, verdict: tf.Tensor) -> None:
        """Keeps the summed flags, and the iteration of the first step that had any."""
        state = self._state
        iteration = tf.cast(tf.convert_to_tensor(state["optimizer"].iterations), tf.int64)
        first = state["first"]
        newly = tf.logical_and(tf.reduce_any(verdict > 0), first < 0)
        state["bad"].assign(tf.maximum(state["bad"], verdict))
        first.assign(tf.where(newly, iteration, first))

    def _local_flags(self, grads, loss) -> tf.Tensor:
        replicas = self._state["replicas"]
        context = tf.distribute.get_replica_context()
        replica = context.replica_id_in_sync_group if context is not None else 0
        mine = tf.one_hot(tf.cast(replica, tf.int32), replicas, dtype=tf.float32)
        grads_ok = _all_finite([g for g in grads if g is not None])
        loss_ok = _all_finite([loss]) if loss is not None else tf.constant(True)
        return tf.concat(
            [
                mine * (1.0 - tf.cast(loss_ok, tf.float32)),
                mine * (1.0 - tf.cast(grads_ok, tf.float32)),
            ],
            axis=0,
        )

    # -- after the step ----------------------------------------------------

    def _raise_if_check_missing(self) -> None:
        """Never a silent no-op: the step must have gone through the checked all-reduce."""
        if self._state["checked"]:
            return
        optimizer = self._state["optimizer"]
        self._uninstall()
        raise RuntimeError(
            f"NaNGuard could not check this training step: the step never called "
            f"{type(optimizer).__name__}.{gradient_hooks.ALL_REDUCE}, where NaNGuard checks each "
            "replica's gradients (a custom train_step that updates the weights itself does not "
            "reach it). Apply the gradients with the model's optimizer, or use "
            "keras.callbacks.TerminateOnNaN there, which checks only the averaged loss."
        )

    def _raise_if_non_finite(self) -> None:
        state = self._state
        bad = np.asarray(state["bad"].numpy())
        if not bad.any():
            return
        step = int(state["first"].numpy())
        replicas = state["replicas"]
        per_worker = max(1, replicas // state["workers"])
        loss_bad, grad_bad = bad[:replicas] > 0, bad[replicas:] > 0
        what = {}
        for r in range(replicas):
            parts = [
                name for name, flag in (("loss", loss_bad[r]), ("gradient", grad_bad[r])) if flag
            ]
            if parts:
                what[r] = " and ".join(parts)
        named = [
            f"worker {r // per_worker} replica {r % per_worker} (global replica {r}: {kind})"
            for r, kind in what.items()
        ]
        me = cluster_info.from_environment().worker_index if state["workers"] > 1 else 0
        self.model.stop_training = True
        self._uninstall()
        raise NonFiniteError(
            f"NaNGuard: non-finite {' / '.join(sorted(set(what.values())))} at step {step} "
            f"(optimizer iterations before the step; epoch {self._epoch + 1}) on "
            f"{', '.join(named)}, of {replicas} replica(s) on {state['workers']} worker(s). "
            f"Every worker stopped at this step (this is worker {me}). No callback saw the step: "
            "checkpoints and backups written before it are intact; the weights in memory are "
            "non-finite, so restore the last checkpoint (BackupAndRestore resumes from it on the "
            "next fit) and look at that step's input batch and the learning rate.",
            step=step,
            epoch=self._epoch + 1,
            replicas=list(what),
            workers=sorted({r // per_worker for r in what}),
            what=what,
        )

    def _uninstall(self) -> None:
        state, self._state = self._state, None
        self._losses.clear()
        if state is None:
            return
        optimizer, model = state["optimizer"], self.model
        for hook in state["hooks"]:
            gradient_hooks.remove(optimizer, hook)
        if "loss_scale" in state:
            loss_scale_check.remove_rider(state["loss_scale"], "nan_guard")
        step_hooks.remove(model, state["verdict"])
        if "compute_loss" in state:
            instance.restore_on(model, "_compute_loss")
        model.train_function = None  # the traced step holds the check; trace again next fit


#: A variable each replica writes on its own, with no collective (all hold the same values).
_REPLICA_LOCAL = {
    "synchronization": tf.VariableSynchronization.ON_WRITE,
    "aggregation": tf.VariableAggregation.NONE,
}


def _trace_key() -> tuple[int, int]:
    """Tells the replicas' traces apart (MirroredStrategy traces each in its own thread)."""
    return threading.get_ident(), id(tf.compat.v1.get_default_graph())


def _all_finite(tensors) -> tf.Tensor:
    checks = []
    for tensor in tensors:
        if isinstance(tensor, tf.IndexedSlices):
            tensor = tensor.values
        tensor = tf.convert_to_tensor(tensor)
        if tensor.dtype.is_floating:
            checks.append(tf.reduce_all(tf.math.is_finite(tensor)))
    return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)
