"""Repair: compile Keras's train/test step so it runs across replicas.

Upstream: UPSTREAM.md item 11 and the ``steps_per_execution`` row of its
table; keras-team/keras#21366, tensorflow/tensorflow#56423, and
keras-team/tf-keras#194. ``TensorFlowTrainer._make_function`` wraps one
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
runs; Keras's closures are otherwise untouched. Verified on Keras 3.10-3.15.1.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import tensorflow as tf
from keras.src.backend.tensorflow import trainer

from mirrorkit import chief
from mirrorkit.compat._repair import Repair, spans_replicas

#: The name of the per-step closure inside Keras's ``_make_function``.
_STEP_CLOSURE = "one_step_on_data"


class _InlineStepTF:
    """Forwards to ``tf``, except for how the per-step closure is compiled."""

    def __init__(self, inline: bool):
        self._inline = inline

    def __getattr__(self, name):
        return getattr(tf, name)

    def function(self, fn=None, **kwargs):
        if getattr(fn, "__name__", None) != _STEP_CLOSURE:
            return tf.function(fn, **kwargs)
        if self._inline:
            return fn  # traced inside the multi-step loop's own tf.function
        kwargs["jit_compile"] = False
        return tf.function(fn, **kwargs)


@contextlib.contextmanager
def _step_compiled_as(inline: bool) -> Iterator[None]:
    keras_tf = trainer.tf
    trainer.tf = _InlineStepTF(inline)
    try:
        yield
    finally:
        trainer.tf = keras_tf


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
        with _step_compiled_as(inline=several_steps):
            return original(self, step_function)

    _make_function.__wrapped__ = original
    return _make_function


REPAIR = Repair(
    name="step_function",
    upstream="keras-team/keras#21366, tensorflow#56423; UPSTREAM.md item 11, steps_per_execution",
    module="keras.src.backend.tensorflow.trainer",
    target="TensorFlowTrainer._make_function",
    replacement=_replacement,
    applies_to=spans_replicas,
)
