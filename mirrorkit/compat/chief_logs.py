"""Repair: one TensorBoard run, one CSV and one progress bar per multi-worker job.

Upstream: no Keras report found; tensorflow/tensorboard#1011 (two writers in
one run directory hide each other's events); docs: compat/#logs-written-by-every-worker.
Keras 3's callbacks have no notion of a chief (tf-keras had
``distributed_file_utils``), so every worker of a job runs the same
``fit(callbacks=[TensorBoard(d), CSVLogger(f)], verbose=1)``: ``d/train`` and
``d/validation`` get one event file per worker (TensorBoard shows interleaved
runs), every worker truncates and appends to ``f``, and every worker prints
its own progress bar.

On a worker that is not the chief of a multi-worker model:

- ``TensorBoard`` writes into a temporary directory of its own, removed when
  training ends (what TensorFlow's multi-worker tutorial recommends): it still
  does all its work, so nothing it reads can leave the workers out of step;
- ``CSVLogger`` opens, writes and closes nothing;
- ``ProgbarLogger`` (``verbose="auto"``, 1 or 2) runs with ``verbose=0``.

``History`` is untouched: every worker's ``fit`` returns the complete history.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile

import keras

from mirrorkit.cluster import chief, workers
from mirrorkit.compat._multi_worker import multi_worker_repair
from mirrorkit.patching import attached

_UPSTREAM = "tensorboard#1011; no chief-aware logging callbacks in Keras 3"
_temporary_dirs: list[str] = []
#: What `mirrorkit.patching.attached` keeps for a TensorBoard callback off the chief: the
#: temporary directory it writes to instead.
WORKER_DIR = "chief_logs.worker_dir"


def multi_worker(model) -> bool:
    """Whether `model` is trained by a multi-worker strategy."""
    strategy = getattr(model, "distribute_strategy", None)
    return strategy is not None and workers.is_multi_worker(strategy)


def not_chief_of(model) -> bool:
    """Whether `model` is trained by a multi-worker strategy and this worker is not its chief."""
    return not chief.is_chief() and multi_worker(model)


def off_the_chief(callback) -> bool:
    """`not_chief_of` for a callback's model."""
    return not_chief_of(getattr(callback, "model", None))


def _chief_only(original):
    @functools.wraps(original)
    def chief_only(self, *args, **kwargs):
        if off_the_chief(self):
            return None
        return original(self, *args, **kwargs)

    return chief_only


def _quiet_progbar(original):
    @functools.wraps(original)
    def set_params(self, params):
        original(self, params)
        if off_the_chief(self):
            self.verbose = 0

    return set_params


def _remove_temporary_dirs() -> None:
    while _temporary_dirs:
        shutil.rmtree(_temporary_dirs.pop(), ignore_errors=True)


def _tensorboard_to_temporary_dir(original):
    @functools.wraps(original)
    def set_model(self, model):
        keras.callbacks.Callback.set_model(self, model)  # `off_the_chief` reads the model
        if multi_worker(model):
            chief.say_once(
                "tensorboard-worker-dirs",
                "TensorBoard writes from the chief only; the other workers write to a "
                "temporary directory removed when training ends "
                "(docs: compat/#logs-written-by-every-worker)",
            )
        if not off_the_chief(self):
            return original(self, model)
        worker_dir = attached.attached(self, WORKER_DIR)
        if not worker_dir:
            worker_dir = tempfile.mkdtemp(prefix="mirrorkit-tensorboard-")
            attached.attach(self, WORKER_DIR, worker_dir)
            if not _temporary_dirs:
                atexit.register(_remove_temporary_dirs)
            _temporary_dirs.append(worker_dir)
        log_dir, self.log_dir = self.log_dir, worker_dir
        try:
            return original(self, model)
        finally:
            self.log_dir = log_dir

    return set_model


def _remove_worker_dir(original):
    @functools.wraps(original)
    def on_train_end(self, logs=None):
        result = original(self, logs)
        directory = attached.attached(self, WORKER_DIR)
        if directory:
            shutil.rmtree(directory, ignore_errors=True)
            if directory in _temporary_dirs:
                _temporary_dirs.remove(directory)
            attached.detach(self, WORKER_DIR)
        return result

    return on_train_end


#: The failure's account on the Keras repairs page (docs: compat/), and the tests of
#: this module's repairs (docs: development/#repairs-and-tests is made from them).
_ACCOUNT = "logs-written-by-every-worker"
_TESTS = (
    "tests/test_keras_callbacks_multiworker.py::test_plain_keras_callbacks_write_twice_and_hang_on_two_workers",
    "tests/test_keras_callbacks_multiworker.py::test_keras_callbacks_act_once_and_stop_together_on_two_workers",
)

REPAIRS = (
    multi_worker_repair(
        "chief_tensorboard",
        _UPSTREAM,
        "TensorBoard.set_model",
        _tensorboard_to_temporary_dir,
        account=_ACCOUNT,
        tests=_TESTS,
        own_canary=True,
    ),
    multi_worker_repair(
        "chief_tensorboard_cleanup",
        _UPSTREAM,
        "TensorBoard.on_train_end",
        _remove_worker_dir,
        account=_ACCOUNT,
        tests=_TESTS,
        own_canary=True,
    ),
    multi_worker_repair(
        "chief_csv_open",
        _UPSTREAM,
        "CSVLogger.on_train_begin",
        _chief_only,
        account=_ACCOUNT,
        tests=_TESTS,
        own_canary=True,
    ),
    multi_worker_repair(
        "chief_csv_rows",
        _UPSTREAM,
        "CSVLogger.on_epoch_end",
        _chief_only,
        account=_ACCOUNT,
        tests=_TESTS,
        own_canary=True,
    ),
    # Keras 3.10's on_train_end closes a file on_train_begin never opened here.
    multi_worker_repair(
        "chief_csv_close",
        _UPSTREAM,
        "CSVLogger.on_train_end",
        _chief_only,
        account=_ACCOUNT,
        tests=_TESTS,
        own_canary=True,
        fixed_in="3.11.0",  # on_train_end closes only an open file from 3.11.0 on
    ),
    multi_worker_repair(
        "chief_progbar",
        _UPSTREAM,
        "ProgbarLogger.set_params",
        _quiet_progbar,
        account=_ACCOUNT,
        tests=_TESTS,
        own_canary=True,
    ),
)
