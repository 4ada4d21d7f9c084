"""Repairs for Keras 3 where it breaks under tf.distribute.

Each repair lives in its own module of this package, which defines it (``REPAIR``, or
``REPAIRS`` for several) with its target, its upstream issue and the strategies it applies
to; mirrorkit's catalogue of patches reads every module of this package and the modules of
the parts of mirrorkit that patch Keras (`REPAIRS` is what it found), so a new repair is
its module, its canary test and its account on the Keras repairs page (docs: compat/),
which gives each failure's symptom, upstream report and repair. A repair is applied only
where a strategy needs it: `mk.strategy()` calls `enable` on the strategy it returns, and
users who build their own `tf.distribute` strategies call `enable()` themselves, with the
same result. Applying is idempotent; the chief says once per process that the repairs are
active (`active()` names them, `describe()` says what each replaces and why).
"""

from __future__ import annotations

import sys
from typing import Any

import keras
import tensorflow as tf

from mirrorkit import versions
from mirrorkit.cluster import chief
from mirrorkit.cluster.workers import spans_replicas
from mirrorkit.compat import step_record
from mirrorkit.patching import catalogue, post_import
from mirrorkit.patching import instance as _instance
from mirrorkit.patching import repair as _repair
from mirrorkit.patching.repair import SCOPED, WITH_ENABLE, Repair


def __getattr__(name: str) -> Any:
    """``REPAIRS``: every repair `mirrorkit.patching.catalogue` names, read when first asked."""
    if name == "REPAIRS":
        return catalogue.repairs()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    for repair in catalogue.repairs():
        if repair.when == WITH_ENABLE and (strategy is None or repair.applies_to(strategy)):
            apply_when_imported(repair)
    names = active()
    if names:
        chief.say_once(
            "compat-repairs",
            f"Keras {keras.__version__} repaired for tf.distribute; "
            "mirrorkit.compat.active() lists the repairs",
        )
    return names


#: Repairs of another package (keras_tuner, keras_hub) that a strategy or a part of mirrorkit
#: needs, waiting for that package's import: `apply_when_imported`.
_WAITING_FOR_IMPORT: list[Repair] = []


def apply_when_imported(repair: Repair) -> None:
    """Applies `repair` now, or once the package it repairs is imported, whenever that is.

    A repair of another package than Keras (KerasTuner's trials, keras-hub's inputs) is
    needed only once that package is imported; a user may import it before or after
    ``mk.strategy()``. A post-import hook applies it then, and the chief says so.

    Args:
        repair: a declared repair, which the strategy or the part of mirrorkit asking needs.

    Example:
    ```python
    import mirrorkit as mk
    from mirrorkit.compat import keras_tuner_trials

    mk.compat.apply_when_imported(keras_tuner_trials.REPAIRS[0])  # now, or at the import
    ```
    """
    if repair.apply() or repair.active or repair.package in sys.modules:
        return
    if repair not in _WAITING_FOR_IMPORT:
        _WAITING_FOR_IMPORT.append(repair)
    post_import.when_imported((repair.package,), f"{__name__}:_apply_imported")


def _apply_imported() -> None:
    """A package was imported: applies the repairs that waited for it, and says which."""
    imported = [repair for repair in _WAITING_FOR_IMPORT if repair.package in sys.modules]
    applied = [repair.name for repair in imported if repair.apply()]
    for repair in imported:
        _WAITING_FOR_IMPORT.remove(repair)
    if applied:
        packages = ", ".join(sorted({repair.package for repair in imported}))
        chief.say(f"{packages} imported: {', '.join(applied)} now in place")


def disable() -> None:
    """Restores every Keras and TensorFlow attribute mirrorkit replaced (all `describe` lists).

    The patches of single objects first (a model's train function under the step hooks,
    `NaNGuard`'s loss record, ``mk.resumable``'s backup), then the scoped ones
    (``ThroughputCallback``'s input clock), then the process-wide repairs. A callback still
    installed keeps its state but no longer acts on Keras: call ``disable`` between ``fit``
    calls, not inside one.
    """
    _instance.remove_all()
    _WAITING_FOR_IMPORT.clear()  # a later import applies nothing
    _repair.remove_all()  # the scoped ones first


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
    return [repair.name for repair in _in_place()]


def _in_place() -> list[Repair]:
    """The repairs in place: in the catalogue's order, then others applied, then the scoped."""
    lasting = [repair for repair in catalogue.repairs() if repair.active]
    others = [r for r in _repair.applied() if not any(r is k for k in lasting)]
    return lasting + others + list(SCOPED)


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
    for repair in _in_place():
        if repair in SCOPED:
            applies = "while the part of mirrorkit that needs it runs"
        elif repair.applied_when:
            applies = repair.applied_when
        elif repair.when != WITH_ENABLE:
            applies = "from the first use of the part of mirrorkit that needs it"
        elif repair.package not in ("keras", "tensorflow"):
            applies = f"once {repair.package} is imported"
        elif repair.fixed_in:
            applies = f"Keras before {repair.fixed_in}, which fixed it (now {keras.__version__})"
        elif repair.feature:
            applies = f"mirrorkit's own, with mk.strategy() or compat.enable: {repair.feature}"
        elif repair.checks_keras:
            applies = f"Keras {keras.__version__} still has the bug (mirrorkit checks its code)"
        else:
            applies = f"every Keras mirrorkit supports (now {keras.__version__})"
        if not repair.in_place:  # read from the attribute itself
            applies += "; wrapped or replaced since by code that is not mirrorkit's"
        if repair.name == "optimizer_step" and step_record.runs():
            applies += f"; the last steps ran: {step_record.runs()}"
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
