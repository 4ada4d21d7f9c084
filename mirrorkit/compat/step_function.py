"""Repair: compile Keras's train/test step so it runs across replicas.

Upstream: keras-team/keras#21366, tensorflow/tensorflow#56423, and
keras-team/tf-keras#194; docs: compat/#steps_per_execution and
"jit_compile and mixed precision". ``TensorFlowTrainer._make_function`` wraps one
distributed step (``strategy.run`` on every replica plus the reduction of the
logs) in its own ``tf.function``, compiled with XLA when the model was
compiled with ``jit_compile=True``. Under a strategy with more than one
replica, or several workers, two things break:

- ``steps_per_execution > 1``: the step function, traced a second time inside
  the ``tf.while_loop``/``tf.cond`` that runs several steps per call, leaves a
  dangling ``while/cond/Placeholder`` and ``fit`` fails with "You must feed a
  value for placeholder tensor". Tracing the step inline in the loop (the
  outer function is compiled anyway) works.
- ``jit_compile=True``: XLA compiles the whole cross-replica step as one
  cluster on the first device and cannot reach the other replicas' variables
  ("Trying to access resource ... located in device CPU:1 from device CPU:0"),
  with or without ``mixed_float16``. XLA cannot compile a step that spans
  devices, so the replacement compiles the step without XLA and says so once.

Where neither applies (one replica, ``steps_per_execution == 1`` and no
``jit_compile``), Keras's own function is used unchanged. The replacement
swaps the trainer module's ``tf`` for a proxy only while ``_make_function``
runs; Keras's closures are otherwise untouched. If ``_make_function`` compiles
no closure named ``one_step_on_data`` (a Keras release renamed it), the
replacement raises `mirrorkit.internals.InternalChangedError` instead of
silently doing nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import tensorflow as tf

from mirrorkit import internals
from mirrorkit.cluster import chief
from mirrorkit.cluster.workers import spans_replicas
from mirrorkit.patching.repair import SCOPED_WHILE, Repair, scoped

#: The name of the per-step closure inside Keras's ``_make_function``.
_STEP_CLOSURE = "one_step_on_data"
#: The Keras module whose ``_make_function`` compiles the step, and whose ``tf`` it uses.
_TRAINER = "keras.src.backend.tensorflow.trainer"


class _InlineStepTF:
    """Forwards to ``tf``, except for how the per-step closure is compiled."""

    def __init__(self, inline: bool):
        self._inline = inline
        self.seen_step = False

    def __getattr__(self, name):
        return getattr(tf, name)

    def function(self, fn=None, **kwargs):
        if getattr(fn, "__name__", None) != _STEP_CLOSURE:
            return tf.function(fn, **kwargs)
        self.seen_step = True
        if self._inline:
            return fn  # traced inside the multi-step loop's own tf.function
        kwargs["jit_compile"] = False
        return tf.function(fn, **kwargs)


_USED_FOR = "the step_function repair (steps_per_execution > 1, jit_compile; several replicas)"


@contextlib.contextmanager
def step_compiled_as(inline: bool) -> Iterator[_InlineStepTF]:
    """The trainer module's ``tf`` is the proxy while Keras makes its function (scoped)."""
    proxy = _InlineStepTF(inline)
    swap = Repair(
        name="step_function_tf",
        upstream=_USED_FOR,
        module=_TRAINER,
        target="tf",
        replacement=lambda keras_tf: proxy,
        applies_to=spans_replicas,
        when=SCOPED_WHILE,
    )
    with scoped(swap):
        yield proxy


def check_seen(proxy: _InlineStepTF) -> None:
    """Raises if Keras never compiled a closure named `_STEP_CLOSURE` (the repair did nothing)."""
    if not proxy.seen_step:
        raise internals.changed(
            f"keras TensorFlowTrainer._make_function's closure {_STEP_CLOSURE!r}",
            _USED_FOR,
            f"_make_function compiled no closure named {_STEP_CLOSURE!r}, so the repair "
            "could not take effect",
        )


def _replacement(original):
    def _make_function(self, step_function):
        strategy = self.distribute_strategy
        if self.run_eagerly or not spans_replicas(strategy):
            return original(self, step_function)
        several_steps = self.steps_per_execution > 1
        xla = bool(self.jit_compile)
        if not several_steps and not xla:
            return original(self, step_function)
        if xla:
            chief.say_once(
                "repair-step-no-xla",
                f"jit_compile=True: XLA cannot compile a step that spans the "
                f"{strategy.num_replicas_in_sync} replicas of {type(strategy).__name__} "
                "(keras#21366, tensorflow#56423); the train/test step runs compiled "
                "without XLA",
            )
        with step_compiled_as(inline=several_steps) as proxy:
            made = original(self, step_function)
        check_seen(proxy)
        return made

    _make_function.__wrapped__ = original
    return _make_function


REPAIR = Repair(
    name="step_function",
    upstream="keras-team/keras#21366, tensorflow#56423",
    module=_TRAINER,
    target="TensorFlowTrainer._make_function",
    replacement=_replacement,
    applies_to=spans_replicas,
    place=1,  # above one_device_step: the trainer's tf is the proxy while that one runs too
    account="steps_per_execution",
    tests=(
        "tests/test_compat.py::test_steps_per_execution_fails_upstream",
        "tests/test_compat.py::test_steps_per_execution_on_two_replicas_equals_one_device",
        "tests/test_internals.py::test_step_function_renamed_closure_is_an_error_not_a_no_op",
        "tests/test_compat.py::test_jit_compile_fails_upstream",
        "tests/test_compat.py::test_jit_compile_on_two_replicas_trains_and_says_so",
        "tests/test_compat.py::test_mixed_precision_with_jit_fails_upstream",
        "tests/test_compat.py::test_mixed_precision_with_jit_and_steps_per_execution_trains",
    ),
)
