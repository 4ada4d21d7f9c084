"""Hook: every ``fit`` tells mirrorkit which epoch it begins, whatever callbacks it has.

Not a Keras bug: Keras's ``fit`` tells only its callbacks which epoch it
begins (``CallbackList.on_epoch_begin(epoch)``), and the data it iterates is
not told. `mk.distribute` shuffles in-memory arrays in the order of (seed,
epoch) (`mirrorkit.pipeline.epoch_order`), so it must know the epoch Keras is
actually in: after Keras's own ``BackupAndRestore`` restored a backup (the
pattern of TensorFlow's "Multi-worker training with Keras" tutorial),
after ``fit(initial_epoch=...)``, after `mk.resumable` or
`mk.PreemptionCheckpoint`. The replacement of the public
``keras.callbacks.CallbackList.on_epoch_begin`` hands the epoch (and whether
it is the first epoch of this ``fit``) to whoever listens, then calls
Keras's own. It is put in place by the first shuffled `mk.distribute` input
(on any strategy, one device included), not by `mirrorkit.compat.enable`,
and ``REPAIR.remove()`` takes it away. Its account:
docs: compat/#the-epoch-a-resumed-fit-is-in.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from mirrorkit.cluster.workers import every_strategy
from mirrorkit.patching import attached
from mirrorkit.patching.repair import ON_FIRST_USE, Repair

#: Called with (the CallbackList, the epoch Keras begins, whether it is this fit's first).
Listener = Callable[[Any, int, bool], None]
_LISTENERS: list[Listener] = []
_SEEN = "fit_epoch.seen"  # kept for the CallbackList of one fit (mirrorkit.patching.attached)


def listen(listener: Listener) -> None:
    """Calls `listener` at the beginning of every epoch of every ``fit`` from now on.

    Args:
        listener: called as ``listener(callback_list, epoch, first)``, where
            `epoch` is Keras's 0-based epoch and `first` is True for the
            first epoch this ``fit`` runs (``initial_epoch`` or a restored one).

    Example:
    ```python
    from mirrorkit.feeding import fit_epoch

    fit_epoch.listen(lambda callbacks, epoch, first: print("epoch", epoch, first))
    ```
    """
    if listener not in _LISTENERS:
        _LISTENERS.append(listener)
    REPAIR.apply()


def _on_epoch_begin(original):
    @functools.wraps(original)
    def on_epoch_begin(self, epoch, logs=None):
        first = not attached.attached(self, _SEEN, False)
        attached.attach(self, _SEEN, True)
        for listener in list(_LISTENERS):
            listener(self, int(epoch), first)
        return original(self, epoch, logs)

    on_epoch_begin.__wrapped__ = original
    return on_epoch_begin


REPAIR = Repair(  # applied by the first `listen` (a shuffled mk.distribute input)
    name="fit_epoch",
    upstream="none (mirrorkit's own: the data is not told the epoch fit begins)",
    module="keras.callbacks",
    target="CallbackList.on_epoch_begin",
    replacement=_on_epoch_begin,
    applies_to=every_strategy,
    when=ON_FIRST_USE,
    applied_when="with the first shuffled mk.distribute input",
    feature="the epoch each fit begins, for mk.distribute's shuffled orders",
    account="the-epoch-a-resumed-fit-is-in",
    tests=(
        "tests/test_restart.py::test_the_tutorials_keras_backup_resumes_a_shuffled_input_in_its_uninterrupted_orders",
        "tests/test_rescale.py::test_keras_own_backup_and_initial_epoch_resume_a_shuffled_input_in_its_orders",
        "tests/test_rescale.py::test_keras_step_backups_in_a_resumed_epoch_record_that_epoch",
        "tests/test_compat.py::test_the_epoch_hook_a_shuffled_input_puts_in_place_is_listed_and_removed",
    ),
)
