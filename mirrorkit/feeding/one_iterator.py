"""Hook: ``fit`` on an `mk.distribute` dataset keeps one distributed iterator for all its epochs.

Not a Keras bug; docs: compat/#one-iterator-per-fit. Keras's ``fit``
makes a new iterator over its training data every epoch (and over its
validation data at every validation) unless it is given ``steps_per_epoch``
(``validation_steps``) and an endless input. Making a distributed iterator
costs a thread and a prefetch buffer per device and a restart of the input
pipeline: on 2 CPU replicas it was half the wall time of a 32-step epoch
(docs: benchmarks/). The replacement of ``TensorFlowTrainer.fit`` hands
Keras, for training data or validation data that `mk.distribute` made and
whose epoch length it knows, the dataset's repeating twin
(`mirrorkit.pipeline.repeating`) with that length as ``steps_per_epoch``
(``validation_steps``), unless the caller gave one. Every epoch sees what it
saw before: the same examples in the same order, the same dropped remainder,
the same number of steps. Any other input, and any ``fit`` given its own
steps, reaches Keras unchanged.

The validation data gets one iterator too: Keras's ``evaluate`` resets its
epoch iterator before every pass (``EpochIterator.reset``), which drops the
iterator; over a repeating twin that has read whole epochs the replacement
of ``reset`` keeps it (the next element is the next epoch's first).

``evaluate`` and ``predict`` called on their own keep one iterator across calls
on the same dataset, where every epoch of it is the same (no shuffle): each call
reads the twin for one epoch through the iterator the last call left at an
epoch boundary (``TFEpochIterator._get_iterator`` lends it). A call that did not
read its whole epoch (an error, a callback that stopped it, Keras reading one
batch to build the model) gives its iterator up, and the next call makes a new
one. A shuffled dataset keeps an iterator per call, as before (each call reads
the next epoch's order). Nor is the twin read where an epoch is not whole
executions of ``steps_per_execution``: Keras's last call of the epoch would read
on into the next one.
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
from typing import Any

import tensorflow as tf

from mirrorkit import distributed_data, internals
from mirrorkit.cluster import chief
from mirrorkit.cluster.workers import every_strategy
from mirrorkit.patching.repair import Repair

_USED_FOR = "the one_iterator repair (one validation iterator per fit)"
_TRAINER = "keras.src.backend.tensorflow.trainer"


def _one_iterator(bound: inspect.BoundArguments, data: str, steps: str) -> None:
    """Swaps `data` for its repeating twin and sets `steps`, where mirrorkit can."""
    arguments = bound.arguments
    length = distributed_data.epoch_length(arguments.get(data))
    if length is None and arguments.get(steps) is None and arguments.get("epochs", 1) > 1:
        _say_if_distributed_elsewhere(arguments.get(data), data)
    if length is None or arguments.get(steps) is not None:
        return
    if not _whole_executions(arguments["self"], length):
        return
    arguments[data] = distributed_data.twin(arguments[data])
    arguments[steps] = length


def _whole_executions(model: Any, length: int) -> bool:
    """Whether an epoch of `length` steps is whole executions of ``model.steps_per_execution``.

    Keras runs ``steps_per_execution`` steps in each call of its compiled function
    whatever ``steps_per_epoch`` says: over the endless twin the last call of an
    epoch would read the next epoch's first batches, so such an epoch keeps
    Keras's iterator per epoch (which ends that call at the end of the data).
    """
    return length % max(1, int(getattr(model, "steps_per_execution", 1) or 1)) == 0


def _say_if_distributed_elsewhere(dataset: Any, argument: str) -> None:
    """Says once that a dataset distributed without mirrorkit gets an iterator per epoch."""
    if not isinstance(dataset, tf.distribute.DistributedDataset):
        return
    if distributed_data.made_here(dataset):
        return
    chief.say_once(
        f"iterator-per-epoch-{argument}",
        f"fit's {argument} is a dataset distributed without mk.distribute: Keras makes a new "
        "distributed iterator over it every epoch, which can cost half the wall time of small "
        "epochs; mirrorkit leaves it as it is. mk.distribute(data, strategy, ...) keeps one "
        "iterator for the whole fit, as does a dataset repeated before it is distributed, with "
        "steps_per_epoch (validation_steps) given",
    )


def _replacement(original):
    signature = inspect.signature(original)

    def fit(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        _one_iterator(bound, "x", "steps_per_epoch")
        _one_iterator(bound, "validation_data", "validation_steps")
        return original(*bound.args, **bound.kwargs)

    fit.__wrapped__ = original
    fit.__doc__ = original.__doc__
    return fit


def _keeps_its_iterator(epoch_iterator) -> bool:
    """Whether `epoch_iterator` reads a repeating twin and has read whole epochs of it."""
    tf_epoch_iterator = internals.load(_TRAINER, "TFEpochIterator", used_for=_USED_FOR)
    if not isinstance(epoch_iterator, tf_epoch_iterator):
        return False
    dataset = internals.require(
        epoch_iterator, "_distributed_dataset", name="keras TFEpochIterator._distributed_dataset",
        used_for=_USED_FOR,
    )  # fmt: skip
    # read as it is: never a new pipeline for an array input
    if not distributed_data.is_twin(dataset):
        return False
    seen = internals.require(
        epoch_iterator, "_steps_seen", name="keras EpochIterator._steps_seen", used_for=_USED_FOR
    )
    steps = epoch_iterator.steps_per_epoch
    return bool(steps) and seen > 0 and seen % steps == 0


def _reset_replacement(original):
    def reset(self):
        keep = _keeps_its_iterator(self)
        iterator = internals.require(
            self, "_current_iterator", name="keras EpochIterator._current_iterator",
            used_for=_USED_FOR,
        )  # fmt: skip
        original(self)
        if keep:
            self._current_iterator = iterator

    reset.__wrapped__ = original
    return reset


@dataclasses.dataclass
class _Loan:
    """One ``evaluate`` / ``predict`` call's use of a twin's kept iterator."""

    twin: Any
    iterator: Any = None  # what the last _get_iterator handed out; None: nothing yet


_loan: contextvars.ContextVar[_Loan | None] = contextvars.ContextVar("mirrorkit_loan", default=None)


def _across_calls_replacement(original, stopped: str):
    """``evaluate`` / ``predict``: one epoch of the twin through the kept iterator.

    Args:
        original: Keras's method.
        stopped: the model attribute a callback sets to stop the call early.
    """
    signature = inspect.signature(original)

    def call(self, *args, **kwargs):
        if kwargs.get("_use_cached_eval_dataset"):  # fit's validation: one_iterator_validation
            return original(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        arguments = bound.arguments
        data = arguments.get("x")
        length = distributed_data.epoch_length(data)
        if length is None or arguments.get("steps") is not None:
            return original(*bound.args, **bound.kwargs)
        if not distributed_data.same_every_epoch(data) or not _whole_executions(self, length):
            return original(*bound.args, **bound.kwargs)
        twin = distributed_data.twin(data)
        arguments["x"] = twin
        arguments["steps"] = length
        loan = _Loan(twin)
        token = _loan.set(loan)
        whole_epoch = False
        try:
            result = original(*bound.args, **bound.kwargs)
            whole_epoch = not getattr(self, stopped, False)
            return result
        finally:
            _loan.reset(token)
            # Kept only at an epoch boundary: the next call reads the next (the same) epoch.
            distributed_data.keep_iterator(twin, loan.iterator if whole_epoch else None)

    call.__wrapped__ = original
    call.__doc__ = original.__doc__
    return call


def _get_iterator_replacement(original):
    def _get_iterator(self):
        dataset = original(self)
        loan = _loan.get()
        if loan is None or dataset is not loan.twin:
            return dataset
        kept = distributed_data.take_kept_iterator(dataset) if loan.iterator is None else None
        if kept is not None:  # the kept one, once per call at most; lent: a nested call on the
            loan.iterator = kept  # same data makes its own
        else:  # none kept, or a second request in one call (the first may be part-way)
            loan.iterator = iter(dataset)
        return loan.iterator

    _get_iterator.__wrapped__ = original
    return _get_iterator


_UPSTREAM = "Keras's EpochIterator (one iterator only with steps_per_epoch)"

#: Why mirrorkit patches fit here: none of these repairs a Keras bug.
_FEATURE = "one distributed iterator per fit (and across evaluate/predict calls)"

REPAIRS = (  # compat.enable applies them, on every strategy (mirrorkit.patching.catalogue)
    Repair(
        name="one_iterator",
        upstream=_UPSTREAM,
        module=_TRAINER,
        target="TensorFlowTrainer.fit",
        replacement=_replacement,
        applies_to=every_strategy,  # mk.distribute's input is distributed everywhere
        feature=_FEATURE,
        account="one-iterator-per-fit",
        tests=(
            "tests/test_one_iterator.py::test_fit_made_an_iterator_per_epoch_before",
            "tests/test_one_iterator.py::test_fit_makes_one_training_and_one_validation_iterator",
            "tests/test_one_iterator.py::test_one_iterator_trains_as_an_iterator_per_epoch",
            "tests/test_one_iterator.py::test_steps_per_execution_never_reads_into_the_next_epoch",
            "tests/test_one_iterator.py::test_the_twin_gives_each_epoch_the_order_of_that_epoch",
            "tests/test_one_iterator.py::test_a_fit_given_its_own_steps_and_a_plain_dataset_are_left_alone",
        ),
    ),
    Repair(
        name="one_iterator_validation",
        upstream=_UPSTREAM,
        module="keras.src.trainers.epoch_iterator",
        target="EpochIterator.reset",
        replacement=_reset_replacement,
        applies_to=every_strategy,
        feature=_FEATURE,
        account="one-iterator-per-fit",
        tests=(
            "tests/test_one_iterator.py::test_fit_made_an_iterator_per_epoch_before",
            "tests/test_one_iterator.py::test_fit_makes_one_training_and_one_validation_iterator",
        ),
    ),
    Repair(
        name="one_iterator_evaluate",
        upstream=_UPSTREAM,
        module=_TRAINER,
        target="TensorFlowTrainer.evaluate",
        replacement=lambda original: _across_calls_replacement(original, "stop_evaluating"),
        applies_to=every_strategy,
        feature=_FEATURE,
        account="one-iterator-per-fit",
        tests=(
            "tests/test_one_iterator.py::test_evaluate_and_predict_keep_one_iterator_across_calls",
            "tests/test_one_iterator.py::test_a_call_stopped_part_way_gives_its_iterator_up",
            "tests/test_one_iterator.py::test_a_shuffled_dataset_and_given_steps_keep_an_iterator_per_call",
        ),
    ),
    Repair(
        name="one_iterator_predict",
        upstream=_UPSTREAM,
        module=_TRAINER,
        target="TensorFlowTrainer.predict",
        replacement=lambda original: _across_calls_replacement(original, "stop_predicting"),
        applies_to=every_strategy,
        feature=_FEATURE,
        account="one-iterator-per-fit",
        tests=(
            "tests/test_one_iterator.py::test_evaluate_and_predict_keep_one_iterator_across_calls",
            "tests/test_one_iterator.py::test_a_call_stopped_part_way_gives_its_iterator_up",
        ),
    ),
    Repair(
        name="one_iterator_lend",
        upstream=_UPSTREAM,
        module=_TRAINER,
        target="TFEpochIterator._get_iterator",
        replacement=_get_iterator_replacement,
        applies_to=every_strategy,
        feature=_FEATURE,
        account="one-iterator-per-fit",
        tests=(
            "tests/test_one_iterator.py::test_an_unbuilt_model_reading_a_batch_to_build_itself_misses_nothing",
            "tests/test_one_iterator.py::test_an_iterator_left_reading_does_not_move_the_next_fits_orders",
            "tests/test_one_iterator.py::test_evaluate_and_predict_keep_one_iterator_across_calls",
        ),
    ),
)
