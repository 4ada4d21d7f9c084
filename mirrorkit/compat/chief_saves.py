"""Repair: ``model.save``/``save_weights``/``export`` and SavedModels on every worker: one copy.

Upstream: no Keras report found; TensorFlow's multi-worker tutorial has every
worker save and the non-chief workers write to a temporary path they delete,
by hand; docs: compat/#saving-from-every-worker. A script that ends
in ``model.save("model.keras")`` runs it on every worker: they all write the
same path at once (a torn file on shared storage), or one copy each where
each worker has its own disk.

On a worker that is not the chief of a multi-worker model, the replacements
save into a fresh temporary directory, under the same file name, and delete
it: the worker does all the work the chief does (so nothing it reads can
leave the workers out of step), and only the chief's file is left. Said once.
A non-chief worker that wants to read the model back reads the chief's file,
which needs storage every worker sees and the chief to have finished writing
(wait for it, e.g. with a collective such as `mirrorkit.cluster.workers.gather`).

``tf.saved_model.save`` is repaired the same way (``chief_saved_model``): every
SavedModel Keras writes goes through it, so ``keras.export.ExportArchive.write_out``
(a SavedModel with endpoints of your own), which ``Model.export`` reaches inside
Keras but a script may call directly, is written once too, and so is
``tf.saved_model.save(model, path)`` in TensorFlow's own style. Inside a non-chief's
``model.save``/``save_weights``/``export``, already sent whole to a temporary path, a
SavedModel is written where Keras asks: ``export(format="litert")`` converts the SavedModel
it has just written.
"""

from __future__ import annotations

import contextvars
import functools
import os
import shutil
import tempfile

from mirrorkit.cluster import chief
from mirrorkit.compat._multi_worker import multi_worker_repair
from mirrorkit.compat.chief_logs import multi_worker, not_chief_of

_UPSTREAM = "no chief-aware saving in Keras 3"

#: Set while a non-chief worker's whole ``model.save``/``save_weights``/``export`` goes to a
#: temporary path: a SavedModel written inside it stays where the save puts it, since Keras
#: may read it back (``export(format="litert")`` converts the SavedModel it has just written).
_WHOLE_SAVE_IS_TEMPORARY = contextvars.ContextVar("whole_save_is_temporary", default=False)


def _to_temporary_path(original):
    @functools.wraps(original)
    def save(self, filepath, *args, **kwargs):
        if multi_worker(self):
            chief.say_once(
                "non-chief-saves",
                "model.save/save_weights/export on the workers that are not the chief write "
                "to a temporary path that is then removed; only the chief's file is kept "
                "(docs: compat/#saving-from-every-worker)",
            )
        if not not_chief_of(self):
            return original(self, filepath, *args, **kwargs)
        directory = tempfile.mkdtemp(prefix="mirrorkit-save-")
        name = os.path.basename(os.path.normpath(os.fspath(filepath))) or "model"
        inside = _WHOLE_SAVE_IS_TEMPORARY.set(True)
        try:
            return original(self, os.path.join(directory, name), *args, **kwargs)
        finally:
            _WHOLE_SAVE_IS_TEMPORARY.reset(inside)
            shutil.rmtree(directory, ignore_errors=True)

    return save


def _saved_model_to_temporary_path(original):
    @functools.wraps(original)
    def save(obj, export_dir, *args, **kwargs):
        chief.say_once(
            "non-chief-saved-models",
            "tf.saved_model.save (keras.export.ExportArchive.write_out, model.export) on the "
            "workers that are not the chief writes to a temporary path that is then removed; "
            "only the chief's SavedModel is kept (docs: compat/#saving-from-every-worker)",
        )
        if chief.is_chief() or _WHOLE_SAVE_IS_TEMPORARY.get():
            return original(obj, export_dir, *args, **kwargs)
        directory = tempfile.mkdtemp(prefix="mirrorkit-saved-model-")
        try:
            return original(obj, os.path.join(directory, "saved_model"), *args, **kwargs)
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    return save


#: The failure's account on the Keras repairs page (docs: compat/), and the tests of
#: this module's repairs (docs: development/#repairs-and-tests is made from them).
_ACCOUNT = "saving-from-every-worker"
_TESTS = (
    "tests/test_keras_callbacks_multiworker.py::test_plain_keras_callbacks_write_twice_and_hang_on_two_workers",
    "tests/test_keras_callbacks_multiworker.py::test_keras_callbacks_act_once_and_stop_together_on_two_workers",
)

REPAIRS = (
    multi_worker_repair(
        "chief_model_save",
        _UPSTREAM,
        "Model.save",
        _to_temporary_path,
        module="keras",
        account=_ACCOUNT,
        tests=_TESTS,
        own_canary=True,
    ),
    multi_worker_repair(
        "chief_model_save_weights",
        _UPSTREAM,
        "Model.save_weights",
        _to_temporary_path,
        module="keras",
        account=_ACCOUNT,
        tests=_TESTS,
        own_canary=True,
    ),
    multi_worker_repair(
        "chief_model_export",
        _UPSTREAM,
        "Model.export",
        _to_temporary_path,
        module="keras",
        account=_ACCOUNT,
        tests=_TESTS,
        own_canary=True,
    ),
    # Importing tensorflow.saved_model rebinds `tf.saved_model` to this module, the one
    # Keras's export code and user scripts then reach as tf.saved_model.save.
    multi_worker_repair(
        "chief_saved_model",
        _UPSTREAM,
        "save",
        _saved_model_to_temporary_path,
        module="tensorflow.saved_model",
        account=_ACCOUNT,
        tests=_TESTS,
        own_canary=True,
    ),
)
