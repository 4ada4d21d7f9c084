"""Repair: the logs ``fit`` and ``evaluate`` return hold Python numbers, custom metrics included.

Upstream: fixed in Keras after 3.10 (``pythonify_logs`` converts tensors to
NumPy before ``float``); docs: compat/#logs-that-hold-a-variable.
Keras turns every logged value into a float with ``float(value)`` and keeps
the value as it is when that fails. A custom ``keras.metrics.Metric`` whose
``result()`` returns its own variable (the ``BinaryTruePositives`` of
Keras's ``Metric`` docstring) hands it a Keras variable that wraps a
``SyncOnReadVariable`` under several replicas, which ``float`` refuses, so
on Keras 3.10 ``History.history["tp"]`` holds variables, not numbers (and
``np.array(history["tp"])`` fails); on one device it holds floats. The
replacement reads such a variable first (its value summed over the
replicas, as Keras's metric variables aggregate) and leaves the rest to
Keras. Where Keras's own ``pythonify_logs`` converts tensors itself, the
repair steps aside.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from mirrorkit import internals
from mirrorkit.cluster.workers import spans_replicas
from mirrorkit.patching.repair import Repair

_PYTHON_UTILS = "keras.src.utils.python_utils"
_USED_FOR = "the python_logs repair (logs that hold a metric's variable)"


def _fixed_upstream() -> bool:
    """Whether Keras's ``pythonify_logs`` converts tensors to NumPy before ``float``."""
    python_utils = internals.load_module(_PYTHON_UTILS, used_for=_USED_FOR)
    pythonify_logs = internals.require(
        python_utils, "pythonify_logs", name=f"keras {_PYTHON_UTILS}.pythonify_logs",
        used_for=_USED_FOR,
    )  # fmt: skip
    return "convert_to_numpy" in pythonify_logs.__code__.co_names


def _read(value):
    if isinstance(value, dict):
        return {key: _read(item) for key, item in value.items()}
    if isinstance(value, keras.Variable) and tf.executing_eagerly():
        return keras.ops.convert_to_numpy(value)
    return value


def _replacement(original):
    def pythonify_logs(logs):
        return original(_read(logs or {}))

    pythonify_logs.__wrapped__ = original
    return pythonify_logs


REPAIR = Repair(
    name="python_logs",
    upstream="Keras 3.10 pythonify_logs (fixed in Keras 3.12.0)",
    module=_PYTHON_UTILS,
    target="pythonify_logs",
    replacement=_replacement,
    applies_to=spans_replicas,
    needed=lambda: not _fixed_upstream(),
    fixed_in="3.12.0",  # pythonify_logs converts with backend.convert_to_numpy from 3.12.0 on
    account="logs-that-hold-a-variable",
    tests=(
        "tests/test_compat.py::test_a_custom_metric_variable_is_logged_as_one_device_number",
        "tests/test_compat.py::test_python_logs_repair_is_needed_exactly_where_keras_logs_a_variable",
    ),
)
