"""Repairs for Keras 3 where it breaks under tf.distribute.

Each repair lives in its own module, names its upstream issue, and is applied
only where a strategy needs it: `mk.strategy()` calls `enable` on the strategy
it returns, and users who build their own `tf.distribute` strategies call
`enable()` themselves. Applying is idempotent; the chief says once per process
how many repairs are active (`active()` names them). The Keras repairs page (docs: compat/) gives
each failure's account: symptom, upstream report, repair, the TensorFlow/Keras
pairs it was tested on and the test that reproduces it.

| repair | upstream | what breaks without it |
| --- | --- | --- |
| ``symbolic_build`` | keras#20585, #19246 | multi-worker ``fit``/``evaluate``; a first batch smaller than the replica count; string inputs; a model without ``call()`` (GANs, VAEs) |
| ``multi_worker_reduce`` | keras#20585 | multi-worker losses and metrics (``axis=0`` on scalars) |
| ``step_function`` | keras#21366, tensorflow#56423 | ``steps_per_execution > 1`` and ``jit_compile=True`` with several replicas |
| ``predict_without_xla_build``, ``predict_on_batch_split`` | none found (docs: compat/) | ``predict`` with ``jit_compile=True`` (XLA per replica fails); ``predict_on_batch`` returned N copies of each row |
| ``one_device_*``, ``averaged_gradients`` | keras#19891 | a custom ``train_step`` that reduces its loss by hand trains at N times one device's gradient; Keras's losses log 1/N |
| ``optimizer_variables`` | keras#23085 (fixed by #23087) | optimizers other than ``model.optimizer`` (``d_optimizer``, ``g_optimizer``), ``MultiOptimizer``, custom loops: "You must feed a value for placeholder tensor" |
| ``gradient_accumulation`` | none found (docs: compat/) | optimizer ``gradient_accumulation_steps`` with several replicas |
| ``agreed_loss_scale`` | none found (docs: compat/) | ``mixed_float16``: an overflow on a replica other than the first is applied (NaN weights); across workers, a hang |
| ``chief_backup_*``, ``chief_checkpoint_save`` | none found (docs: compat/) | ``BackupAndRestore``/``ModelCheckpoint`` written by every worker |
| ``chief_tensorboard*``, ``chief_csv_*``, ``chief_progbar`` | tensorboard#1011 | one TensorBoard run, CSV and progress bar per worker |
| ``agreed_stop_*`` | HybridBackend#88 | ``model.stop_training`` set on one worker only: the others hang |
| ``shared_early_stopping``, ``shared_reduce_lr`` | HybridBackend#88 | ``EarlyStopping``/``ReduceLROnPlateau`` deciding on per-worker values |
| ``chief_model_save*``, ``chief_model_export``, ``chief_saved_model`` | none found (docs: compat/) | ``model.save``/``export``/SavedModels written by every worker |
| ``class_weight`` | tensorflow#41290 | ``fit(class_weight=...)`` on an `mk.distribute` dataset |
| ``one_iterator``, ``one_iterator_validation``, ``one_iterator_evaluate``, ``one_iterator_predict``, ``one_iterator_lend`` | Keras's epoch iterator | ``fit`` on an `mk.distribute` dataset made a new distributed iterator every epoch (half the wall time of small epochs), ``evaluate`` and ``predict`` one every call |
| ``keras_hub_inputs`` | keras-hub 0.32 | a keras-hub task's ``fit``/``evaluate``/``predict`` on an `mk.distribute` dataset (applied once keras-hub is imported) |
| ``keras_tuner_ask_together``, ``keras_tuner_same_trial`` | KerasTuner 1.4 | a tuner with a multi-worker ``distribution_strategy``: the job's workers handed different trials build different models (applied once keras-tuner is imported) |
| ``python_logs`` | Keras 3.10 | ``History`` holding a custom metric's variable instead of a number |
| ``fit_notices`` | keras.io guide, keras#20285 | (says once) a custom ``train_step`` sees one device's losses; trainable BatchNormalization trains on each replica's batch |
| ``step_chain`` | mirrorkit's own step hooks | a train function Keras traced again (``make_train_function(force=True)``) dropped the hooks around it: ``ThroughputCallback`` before ``NaNGuard`` read every step as host work |
| ``validation_split_message`` | Keras's own limit | ``fit(validation_split=)`` on a distributed dataset: the error says how to split |
| ``backup_step_epoch`` | none found (docs: compat/) | ``BackupAndRestore(save_freq=N)``'s backups in a resumed epoch record epoch 0 |
| optimizer state built by `mk.build` | keras#23085 | custom ``tf.function`` loops with Adam under a strategy |
"""  # noqa: E501

from __future__ import annotations

import keras
import tensorflow as tf

from mirrorkit import versions
from mirrorkit.cluster import chief
from mirrorkit.cluster.workers import spans_replicas
from mirrorkit.compat import (
    agreed_loss_scale,
    agreed_stop,
    backup_epoch,
    chief_files,
    chief_logs,
    chief_saves,
    class_weight,
    fit_epoch,
    gradient_accumulation,
    keras_hub_inputs,
    keras_tuner_trials,
    multi_worker_reduce,
    one_device_gradient,
    one_device_loss,
    one_iterator,
    optimizer_variables,
    predict_step,
    python_logs,
    shared_monitor,
    step_function,
    symbolic_build,
    validation_split,
)
from mirrorkit.patching import instance as _instance
from mirrorkit.patching import repair as _repair
from mirrorkit.patching.repair import SCOPED, Repair

REPAIRS: tuple[Repair, ...] = (
    symbolic_build.REPAIR,
    multi_worker_reduce.REPAIR,
    step_function.REPAIR,
    *predict_step.REPAIRS,
    *one_device_loss.REPAIRS,
    *one_device_gradient.REPAIRS,
    optimizer_variables.REPAIR,
    gradient_accumulation.REPAIR,
    agreed_loss_scale.REPAIR,
    *chief_files.REPAIRS,
    *chief_logs.REPAIRS,
    *agreed_stop.REPAIRS,
    *shared_monitor.REPAIRS,
    *chief_saves.REPAIRS,
    class_weight.REPAIR,
    *one_iterator.REPAIRS,
    keras_hub_inputs.REPAIR,
    *keras_tuner_trials.REPAIRS,
    python_logs.REPAIR,
    backup_epoch.REPAIR,
    validation_split.REPAIR,
)

#: Repairs a part of mirrorkit applies when it is first used, and keeps for the process:
#: ``fit_epoch`` (the epoch each ``fit`` begins, for `mk.distribute`'s shuffled order), put in
#: place by the first shuffled `mk.distribute` input. The step hooks apply their own
#: (``step_chain``, `mirrorkit.training.step_chain`) when the first hook is registered.
#: `active` lists every one in place, `disable` removes them.
ON_DEMAND: tuple[Repair, ...] = (fit_epoch.REPAIR,)


def enable(strategy: tf.distribute.Strategy | None = None) -> list[str]:
    """Applies mirrorkit's Keras repairs for tf.distribute.

    Args:
        strategy: apply only the repairs this strategy needs; None applies all.

    Returns:
        The names of the repairs now in place.

    Example:
    ```python
    import tensorflow as tf
    import mirrorkit as mk

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    mk.compat.enable(strategy)  # then build and fit as usual
    ```
    """
    _check_keras_version()
    for repair in REPAIRS:
        if strategy is None or repair.applies_to(strategy):
            repair.apply()
    _repair.enable_declared(strategy)  # what parts of mirrorkit declared for such strategies
    names = active()
    if names:
        repairs = "repair" if len(names) == 1 else "repairs"
        chief.say_once(
            "compat-repairs",
            f"{len(names)} Keras {repairs} active (keras {keras.__version__}); "
            "mirrorkit.compat.active() lists them",
        )
    return names


def disable() -> None:
    """Restores every Keras and TensorFlow attribute mirrorkit replaced (all `describe` lists).

    The patches of single objects first (a model's train function under the step hooks,
    `NaNGuard`'s loss record, ``mk.resumable``'s backup), then the scoped ones
    (``ThroughputCallback``'s input clock), then the process-wide repairs. Repairs that
    replace the same internal wrap one another in the order they were applied (which
    `enable` for one strategy, then another, or a part of mirrorkit used first, decides),
    so they come off in the reverse order. A callback still installed keeps its state but
    no longer acts on Keras: call ``disable`` between ``fit`` calls, not inside one.
    """
    _instance.remove_all()
    for scoped in reversed(list(SCOPED)):
        _repair.remove_scoped(scoped)
    _repair.remove_all()


def active() -> list[str]:
    """Names of the Keras-wide patches in place: `enable`'s, then the others, the scoped ones.

    The patches of single objects (a model's, an optimizer's, a callback's) are not
    counted here: `describe` lists them too.

    `enable` applies the repairs a strategy needs. A part of mirrorkit applies its own
    when it is first used, and they stay (``fit_epoch`` for a shuffled `mk.distribute`
    input, ``step_chain`` for the first step hook). A scoped repair is in place while a
    part of mirrorkit needs it (``input_clock.*`` while a ``ThroughputCallback`` is
    installed); `describe` says why each is there.
    """
    return [repair.name for repair in _in_place()] + [repair.name for repair in SCOPED]


def _in_place() -> list[Repair]:
    """The repairs in place: `REPAIRS`' first, in its order, then the others as applied."""
    applied = _repair.applied()
    return [r for r in REPAIRS if r in applied] + [r for r in applied if r not in REPAIRS]


def describe() -> list[dict[str, str]]:
    """Every patch in place now, with its target, its upstream cause and when it applies.

    Returns:
        One dict per patch of `active`, in the same order, then one per patch of a single
        object (a model's train function under the step hooks, a callback's method):
        ``name``, ``target`` (``module.Class.attribute``, and which instance), ``upstream``
        (the issue, or why mirrorkit patches it), ``applies`` (the Keras versions: where a
        canary reads Keras's code, only while the bug is there; a scoped repair, only for a
        while; an object's, on that object).

    Example:
    ```python
    import mirrorkit as mk

    mk.strategy(cpu_replicas=2)
    for patch in mk.compat.describe()[:3]:
        print(patch["name"], "-", patch["target"], "-", patch["upstream"])
    ```
    """
    rows = []
    for repair in _in_place() + list(SCOPED):
        if repair in SCOPED:
            applies = "while the part of mirrorkit that needs it runs"
        elif repair.applied_when:
            applies = repair.applied_when
        elif repair not in REPAIRS:
            applies = "from the first use of the part of mirrorkit that needs it"
        elif repair.package not in ("keras", "tensorflow"):
            applies = f"once {repair.package} is imported"
        elif repair.checks_keras:
            applies = f"Keras {keras.__version__} still has the bug (its canary read the code)"
        else:
            applies = f"every Keras mirrorkit supports (now {keras.__version__})"
        rows.append(
            {
                "name": repair.name,
                "target": f"{repair.module}.{repair.target}",
                "upstream": repair.upstream,
                "applies": applies,
            }
        )
    for patch in _instance.in_place():
        rows.append(
            {
                "name": patch.name,
                "target": patch.target,
                "upstream": patch.reason,
                "applies": "on this one object, until the part of mirrorkit that needs it ends",
            }
        )
    return rows


def prepare_model(model: keras.Model, strategy: tf.distribute.Strategy) -> None:
    """Builds the optimizer's state under `strategy`'s scope (keras#23085).

    See docs: compat/#optimizers-built-inside-the-step.

    Keras 3.15.1 and earlier fail in a custom ``tf.function`` training loop
    with a stateful optimizer (Adam) under a strategy, because the optimizer
    creates its slot variables lazily inside the traced function. Building
    them here, eagerly and under the scope, is what `mk.build` does; ``fit``
    is unaffected, since it would build the same variables at its start.

    Args:
        model: the model just built.
        strategy: the strategy in whose scope it was built.
    """
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or getattr(optimizer, "built", True) or not model.built:
        return
    if spans_replicas(strategy):
        optimizer.build(model.trainable_variables)


def _check_keras_version() -> None:
    found = versions.installed()
    if found.newer_than_tested and not found.is_next:  # CI's "next" leg runs the nightly pair
        chief.warn_once(
            "untested-keras",
            f"TensorFlow {found.tensorflow} / Keras {found.keras} is newer than mirrorkit's "
            f"tested range ({versions.tested_range()}); its repairs are applied where their "
            "targets exist. Run mirrorkit's compat tests (docs: compat/) to learn which are "
            "still needed.",
        )
