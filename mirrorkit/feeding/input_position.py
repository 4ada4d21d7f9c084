"""A resumed ``fit`` begins at the step its backup holds, with the batch that step took.

Keras's ``fit`` resumes at an epoch (``Model._initial_epoch``), and always at
that epoch's first step. A backup taken in the middle of an epoch (Keras's
``BackupAndRestore(save_freq=N)``, ``mk.resumable(dir, every=...)``, a
`mk.PreemptionCheckpoint`) also holds the steps completed in it. Its restore
hands that position to `resume_at`; the epoch iterator of the resumed epoch
then reads the batches of those steps and drops them (the replacement of
Keras's ``EpochIterator._enumerate_iterator``), so the first step trained takes
the batch the interrupted run's next step would have taken, and the callbacks
see that step's true index (the progress bar, TensorBoard, the backup's own
count). Where an input gives each epoch the same batches in each process, the
run ends as an uninterrupted one does.

Which inputs give the same batches in a new process (`judge`):

- an `mk.distribute` dataset of in-memory arrays, shuffled or not (its order
  is drawn from (seed, epoch): `mirrorkit.pipeline.epoch_order`), and any
  `mk.distribute` input with ``shuffle=False``;
- NumPy arrays given to ``fit`` with ``shuffle=False``, or shuffled by Keras
  after ``keras.utils.set_random_seed`` (Keras then draws one order, the same
  every epoch and every process);
- a `tf.data` pipeline (distributed by the user or not) with no shuffle and no
  stateful random op in it.

Any other input (a shuffled stream, a generator, a ``PyDataset``, NumPy arrays
shuffled without a seed) would take other batches: a backup's restore resumes
it at the start of that epoch, as Keras does, and says so once with the fix. A
`mk.PreemptionCheckpoint` resumes at its step whatever the input (it says when
the orders are not replayed). When two restores in one ``fit`` hold a position
(a preemption checkpoint and a step backup), the later position wins
(`resume_at` says whether it is the caller's).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import tensorflow as tf

from mirrorkit import distributed_data, internals
from mirrorkit.cluster import chief
from mirrorkit.cluster.workers import every_strategy
from mirrorkit.feeding import fit_epoch
from mirrorkit.patching import attached, instance
from mirrorkit.patching.repair import ON_FIRST_USE, Repair

_PENDING = "input_position.pending"  # the position a restore in this fit handed over
_VERDICT = "input_position.verdict"  # the last training input's `Verdict`
_WATCHED = "input_position.watched"  # judge this model's training input (`watch`)
#: The model whose epoch just began: the next epoch iterator enumerated is its training one.
_BEGUN: list[tuple[Any, int]] = []

#: Ops whose output differs in a new process: a tf.data pipeline with one draws other batches.
_UNREPLAYED_OPS = (
    "Shuffle",  # ShuffleDataset(V2, V3), ShuffleAndRepeatDataset
    "RandomUniform",
    "RandomStandardNormal",
    "TruncatedNormal",
    "RandomShuffle",
    "Multinomial",
    "RandomGamma",
    "RandomPoisson",
    "StatefulUniform",
    "StatefulStandardNormal",
    "StatefulTruncatedNormal",
    "RngReadAndSkip",
    "RngSkip",
)


@dataclasses.dataclass(frozen=True)
class Restored:
    """Where a restored ``fit`` resumes: a 0-based epoch and the steps completed in it.

    Attributes:
        epoch: 0-based epoch.
        step: steps of that epoch already trained.
        source: what holds it, as said to the user (``"the backup in run1/backup"``).
        always: resume at the step whatever the input (a preemption checkpoint).
        say: print where it resumes (False: the caller says it).
    """

    epoch: int
    step: int
    source: str
    always: bool = False
    say: bool = True

    def __str__(self) -> str:
        return f"epoch {self.epoch + 1} step {self.step}"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Whether an input gives the same batches in a new process.

    Attributes:
        positionable: it does, so skipping the first steps' batches positions it.
        what: the input, as said to the user.
        fix: what to change when it does not.
        global_batch: its global batch when known.
    """

    positionable: bool
    what: str
    fix: str = ""
    global_batch: int | None = None


def resume_at(
    model: Any, epoch: int, step: int, source: str, *, always: bool = False, say: bool = True
) -> bool:
    """Resumes `model`'s current ``fit`` at (`epoch`, `step`) unless a later position is held.

    Call it from a restore, in ``on_train_begin``. Sets Keras's initial epoch; the
    first epoch iterator of that epoch reads and drops the batches of `step` steps.

    Args:
        model: the Keras model being fitted.
        epoch: the 0-based epoch to resume.
        step: the steps of it already trained (0: its start).
        source: what holds the position, for what is said (``"the backup in DIR"``).
        always: position the input even where it gives other batches in a new process
            (`mk.PreemptionCheckpoint`); otherwise such an input resumes at the epoch's start.
        say: print where the fit resumes as it begins that epoch (False: the caller says it).

    Returns:
        True: the position is this one. False: a restore earlier in this ``fit`` holds a
        later one, which stays (the caller should keep that restore's weights).

    Example:
    ```python
    import keras
    from mirrorkit.feeding import input_position

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    assert input_position.resume_at(model, 2, 5, "a test backup")
    assert not input_position.resume_at(model, 2, 3, "an older one")
    input_position.forget(model)
    ```
    """
    if held_later(model, epoch, step, source):
        return False
    held = pending(model)
    if held is not None and (held.epoch, held.step) < (epoch, step):
        chief.say_once(
            f"resume-later-{source}",
            f"{source} (epoch {epoch + 1} step {step}) is later than {held.source} (epoch "
            f"{held.epoch + 1} step {held.step}), restored before it: resuming from it",
        )
    internals.require(
        model,
        "_initial_epoch",
        name="keras Model._initial_epoch",
        used_for="resuming fit at a backup's epoch",
    )
    instance.set_on(
        model,
        "_initial_epoch",
        int(epoch),
        name="input_position.initial_epoch",
        reason="a restored fit begins at its backup's epoch (as Keras's BackupAndRestore sets)",
    )
    attached.attach(model, _PENDING, Restored(int(epoch), int(step), source, always, say))
    fit_epoch.listen(_epoch_begins)
    REPAIR.apply()
    return True


def held_later(model: Any, epoch: int, step: int, source: str) -> bool:
    """Whether a restore earlier in `model`'s ``fit`` holds a later position; said once if so.

    Args:
        model: the Keras model being fitted.
        epoch: the 0-based epoch `source` holds.
        step: the steps of it `source` holds.
        source: what holds it, as said (``"the backup in DIR"``).
    """
    held = pending(model)
    if held is None or (held.epoch, held.step) <= (epoch, step):
        return False
    chief.say_once(
        f"resume-earlier-{source}",
        f"{held.source} (epoch {held.epoch + 1} step {held.step}) is later than {source} "
        f"(epoch {epoch + 1} step {step}): resuming from {held.source}",
    )
    return True


def pending(model: Any) -> Restored | None:
    """The position a restore in `model`'s current ``fit`` handed over, until it is used."""
    return attached.attached(model, _PENDING)


def forget(model: Any) -> None:
    """Drops the position handed over for `model` (a ``fit`` that ended before using it)."""
    attached.attach(model, _PENDING, None)


def watch(model: Any) -> None:
    """From now on, `judge` the input of each epoch `model` trains (`training_input`).

    Args:
        model: the Keras model; `mk.resumable` watches the model it backs up, so the
            launcher knows where a step backup resumes before any resume.
    """
    attached.attach(model, _WATCHED, True)
    fit_epoch.listen(_epoch_begins)
    REPAIR.apply()


def training_input(model: Any) -> Verdict | None:
    """What `judge` said of the input of `model`'s last epoch resumed or watched (`watch`)."""
    return attached.attached(model, _VERDICT)


def _epoch_begins(callbacks: Any, epoch: int, first: bool) -> None:
    model = getattr(callbacks, "model", None)
    wanted = model is not None and (
        pending(model) is not None or (first and attached.attached(model, _WATCHED, False))
    )
    _BEGUN[:] = [(model, epoch)] if wanted else []


def judge(epoch_iterator: Any) -> Verdict:
    """Whether the input of Keras's `epoch_iterator` gives each epoch the same batches anew.

    Args:
        epoch_iterator: Keras's ``TFEpochIterator`` of a ``fit``.

    Returns:
        A `Verdict`; the module docstring lists which inputs do.
    """
    used_for = "telling whether fit's input gives the same batches when a backup resumes it"
    dataset = internals.require(
        epoch_iterator,
        "_distributed_dataset",
        name="keras TFEpochIterator._distributed_dataset",
        used_for=used_for,
    )
    found = distributed_data.record(dataset)
    if found is not None:
        if found.shuffle_stream is not None:
            return Verdict(
                False,
                "a shuffled streamed mk.distribute input (a tf.data pipeline, tfds files, or "
                "arrays with cache= or preprocess=) draws new orders in a new process",
                "mk.distribute in-memory arrays, or shuffle=False",
                found.global_batch_size,
            )
        return Verdict(True, "an mk.distribute input", global_batch=found.global_batch_size)
    adapter = epoch_iterator.data_adapter
    kind = type(adapter).__name__
    if kind == "ArrayDataAdapter":
        size = internals.require(
            adapter, "_batch_size", name="keras ArrayDataAdapter._batch_size", used_for=used_for
        )
        shuffled = internals.require(
            adapter, "_shuffle", name="keras ArrayDataAdapter._shuffle", used_for=used_for
        )
        if shuffled and tf.compat.v1.get_seed(None)[0] is None:
            return Verdict(
                False,
                "arrays that Keras's fit shuffles without a seed draw new orders in a new process",
                "call keras.utils.set_random_seed(...) first, pass shuffle=False, or give "
                "fit mk.distribute((x, y), strategy, global_batch_size=..., seed=0)",
                size,
            )
        return Verdict(True, "arrays", global_batch=size)
    if kind == "TFDatasetAdapter":
        unreplayed = _unreplayed_ops(dataset)
        if unreplayed is None:
            return Verdict(
                False,
                "a tf.data pipeline mirrorkit cannot read",
                "give fit mk.distribute(...) with a seed",
            )
        if unreplayed:
            return Verdict(
                False,
                f"a tf.data pipeline with {', '.join(sorted(unreplayed))} draws other batches "
                "in a new process",
                "give it seeds that do not change between runs (e.g. shuffle(..., seed=0, "
                "reshuffle_each_iteration=False), stateless random ops), or give fit "
                "mk.distribute(arrays, strategy, global_batch_size=..., seed=0)",
            )
        return Verdict(True, "a tf.data pipeline")
    return Verdict(
        False,
        f"a {kind.removesuffix('Adapter') or 'Python'} input (a generator or a PyDataset) "
        "starts again in a new process",
        "give fit a tf.data pipeline or mk.distribute(...)",
    )


def _unreplayed_ops(dataset: Any) -> set[str] | None:
    """The ops in `dataset`'s graph whose output differs in a new process; None: unreadable."""
    if isinstance(dataset, tf.distribute.DistributedDataset):
        dataset = internals.optional(
            dataset,
            "_original_dataset",
            name="tf DistributedDataset._original_dataset",
            used_for="telling whether a distributed tf.data pipeline can resume at a step",
        )
    if not isinstance(dataset, tf.data.Dataset):
        return None
    serialized = internals.optional(
        dataset,
        "_as_serialized_graph",
        name="tf Dataset._as_serialized_graph",
        used_for="telling whether a tf.data pipeline can resume at a step (without it, a "
        "step backup resumes it at the epoch's start)",
    )
    if serialized is None:
        return None
    graph = tf.compat.v1.GraphDef()
    try:
        graph.ParseFromString(serialized().numpy())
    except (tf.errors.OpError, ValueError):
        return None
    ops = {node.op for node in graph.node}
    for function in graph.library.function:
        ops.update(node.op for node in function.node_def)
    return {op for op in ops if any(op.startswith(name) for name in _UNREPLAYED_OPS)}


def _enumerate_iterator(original):
    @functools.wraps(original)
    def enumerate_iterator(self):
        items = original(self)
        if not _BEGUN:
            yield from items
            return
        (model, epoch), _BEGUN[:] = _BEGUN[0], []
        held = pending(model)
        forget(model)
        verdict = judge(self)
        attached.attach(model, _VERDICT, verdict)
        skip = held.step if held is not None and held.epoch == epoch else 0
        if skip and not (verdict.positionable or held.always):
            chief.say_once(
                "resume-step-unpositioned",
                f"resuming from {held.source} at the start of epoch {epoch + 1}, not at its step "
                f"{skip}: {verdict.what}, so skipping the steps already trained would train "
                f"other batches; the {skip} step(s) before the backup are trained again. For "
                f"an exact resume: {verdict.fix}",
            )
            skip = 0
        if skip and held.say:
            chief.print(
                f"mirrorkit: resuming from {held.source} at epoch {epoch + 1} step {skip}: the "
                f"batches of its first {skip} step(s) are read and skipped"
            )
        per_call = getattr(self, "steps_per_execution", 1) or 1
        for item in items:
            if item[0] < skip:  # (step, ..., iterator): the batches of a step already trained
                try:
                    for _ in range(per_call):
                        next(item[-1])
                except (StopIteration, tf.errors.OutOfRangeError):
                    return
                continue
            yield item

    enumerate_iterator.__wrapped__ = original
    return enumerate_iterator


REPAIR = Repair(  # applied by the first `resume_at` (a restore that holds a step)
    name="input_position",
    upstream="none (Keras resumes an epoch at its first step: docs: resume/)",
    module="keras.src.trainers.epoch_iterator",
    target="EpochIterator._enumerate_iterator",
    replacement=_enumerate_iterator,
    applies_to=every_strategy,
    when=ON_FIRST_USE,
    applied_when="with the first backup restored in the middle of an epoch",
    feature="a resumed fit begins at its backup's step (mk.resumable, BackupAndRestore)",
    account="a-backup-in-the-middle-of-an-epoch",
    tests=(
        "tests/test_step_backup.py::test_a_step_backup_resumes_at_its_step_equal_to_an_uninterrupted_run",
    ),
)
