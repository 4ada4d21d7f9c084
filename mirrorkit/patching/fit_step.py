"""Whether the code running now is a replica's ``fit`` step, where every loss is one device's.

Under a strategy of N replicas, Keras divides each replica's loss by N (its
``keras.losses`` objects and ``compute_loss``) and the optimizer sums the
replicas' gradients, so that the sum equals one device's gradient. A loss a
``train_step`` reduces by hand (``ops.mean`` of a ``keras.losses`` function,
``tf.reduce_mean``) is not divided, and trains at N times one device's
gradient. `mirrorkit.compat.one_device_loss` turns this around inside ``fit``'s
train and test steps: no loss is divided and the optimizer averages the
replicas' gradients, so every loss a step computes, by Keras or by hand, is
one device's loss on the replica's part of the batch, and its gradient is
one device's. Outside ``fit`` (a custom ``tf.function`` loop calling
``strategy.run``) TensorFlow's contract holds unchanged.

`wrap` marks a step function: while a replica traces (or, eagerly, runs) it,
`active` is True. The mark is process-wide, not per thread: a
``MirroredStrategy`` traces each replica in a thread of its own, and parts of
the optimizer's update run in the cross-replica context on another thread
while the replicas wait in ``merge_call``.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any

import tensorflow as tf

_lock = threading.Lock()
_depth = 0
#: The names of the batch tensors each replica's traced step received: graph -> {name, ...}
#: (names, not tensors: a tensor holds its graph, which would then never be freed).
_BATCHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: The model whose step ran (or was traced) last, held weakly.
_OWNER: list[Any] = [None]
#: The leading sizes of the batch an eager step (``run_eagerly=True``) runs on now.
_EAGER_SIZES: set[int] = set()


def active() -> bool:
    """Whether a replica is inside a step function that `wrap` marked (``fit``'s step)."""
    return _depth > 0


def replicas() -> int:
    """The replicas in sync of the strategy in scope (1 outside any strategy)."""
    return tf.distribute.get_strategy().num_replicas_in_sync


def averaging_replicas() -> int:
    """N where a step's gradients are to be averaged over N > 1 replicas; else 1.

    Returns:
        The replica count inside a marked step, in a replica context of a
        strategy with several replicas (where the optimizer all-reduces by
        summing); 1 anywhere else.
    """
    if not active() or tf.distribute.get_replica_context() is None:
        return 1
    return replicas()


def wrap(step_function: Callable[[Any], Any], owner: Any = None) -> Callable[[Any], Any]:
    """`step_function`, marked: `active` is True while it runs.

    Args:
        step_function: Keras's ``train_step`` or ``test_step`` (bound), as
            ``fit`` hands it to ``strategy.run``.
        owner: the model whose step it is (`owner` returns it while it runs).

    Returns:
        A function of the same name that calls it.
    """
    held = weakref.ref(owner) if owner is not None else None

    @functools.wraps(step_function)
    def one_device_step(data):
        global _depth
        with _lock:
            _depth += 1
            _OWNER[0] = held
            _record_batch(data)
        try:
            return step_function(data)
        finally:
            with _lock:
                _depth -= 1

    return one_device_step


def owner() -> Any:
    """The model whose step runs (or is traced) now, or ran last; None if none is known."""
    held = _OWNER[0]
    return held() if held is not None else None


def _record_batch(data: Any) -> None:
    """Keeps the tensors of a replica's batch: traced, for `batch_tensors`; eagerly, their sizes."""
    tensors = [t for t in tf.nest.flatten(data) if isinstance(t, tf.Tensor)]
    if tf.executing_eagerly():
        _EAGER_SIZES.clear()
        _EAGER_SIZES.update(int(t.shape[0]) for t in tensors if t.shape.rank)
        return
    for tensor in tensors:
        _BATCHES.setdefault(tensor.graph, set()).add(tensor.name)


def eager_batch_sizes() -> set[int]:
    """The leading sizes of the batch of the eager step running now (``run_eagerly=True``)."""
    return set(_EAGER_SIZES)


def batch_tensors(graph: Any) -> set[str]:
    """The names of the batch tensors the replicas' steps traced in `graph` received.

    Args:
        graph: the graph of a traced step (``tf.compat.v1.get_default_graph()`` inside it).

    Returns:
        The tensors' names (their ``data``), every replica's; empty outside a traced step.
    """
    return set(_BATCHES.get(graph, ()))
