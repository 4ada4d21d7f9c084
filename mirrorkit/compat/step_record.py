"""What an optimizer's step across replicas ran: its stages, said once and kept for `ran`.

`mirrorkit.compat.optimizer_step` runs its pipeline's stages (`STAGES`, in this
order) as an optimizer needs them, and records each one here as it traces it;
the chief says once per optimizer and set of stages what its step runs, e.g.
"SGD steps on 2 replicas as one device: average (over 2 replicas), all-reduce
(compression), clip (global_clipnorm), update".
"""

from __future__ import annotations

import weakref
from typing import Any

import tensorflow as tf

from mirrorkit.cluster import chief

#: The pipeline's stages, in the order they run (docs: compat/#the-optimizer-step-across-replicas).
STAGES = (
    "average",
    "accumulate",
    "all-reduce",
    "loss scale",
    "merge slices",
    "clip",
    "weight decay",
    "update",
    "ema",
)

#: The stages each optimizer's last traced step ran (`ran`).
_RAN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: The step being traced for each optimizer, with the graph it is traced in.
_TRACING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def ran(optimizer: Any) -> tuple[str, ...]:
    """The stages of `STAGES` the optimizer's last step across replicas ran, in order.

    Args:
        optimizer: a Keras optimizer (the inner one of a ``LossScaleOptimizer`` too).

    Returns:
        The stage names, with what they did in brackets (``"all-reduce (compression)"``);
        empty before its first step across replicas.
    """
    return tuple(_RAN.get(optimizer, ()))


def runs() -> str:
    """What each optimizer's last step across replicas ran, for ``compat.describe()``.

    Returns:
        ``"SGD: average (over 2 replicas), all-reduce, update"``, one optimizer after the
        other (``; ``); empty before any step across replicas.
    """
    return "; ".join(
        f"{type(optimizer).__name__}: {', '.join(stages)}" for optimizer, stages in _RAN.items()
    )


class Step:
    """One optimizer's step across replicas as traced: the stages it ran, said once.

    Every replica's trace of one step shares it (`step_for`): a stage a replica
    traces in the cross-replica context (the accumulation's K-th step) counts for all.
    """

    def __init__(self, optimizer: Any):
        self._optimizer = weakref.ref(optimizer)  # kept in a weak dict keyed by the optimizer
        self.stages: set[str] = set()

    @property
    def optimizer(self) -> Any:
        """The optimizer whose step this is."""
        return self._optimizer()

    def did(self, stage: str, what: str = "") -> None:
        """Records that the stage `stage` (one of `STAGES`) runs, doing `what`."""
        self.stages.add(f"{stage} ({what})" if what else stage)

    def done(self) -> None:
        """The step is traced: keeps its stages for `ran` and says them once."""
        order = {name: i for i, name in enumerate(STAGES)}
        stages = sorted(self.stages, key=lambda s: order[s.split(" (")[0]])
        _RAN[self.optimizer] = tuple(stages)
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        name = type(self.optimizer).__name__
        chief.say_once(
            f"optimizer-step-{name}-{'/'.join(stages)}",
            f"{name} steps on {replicas} replicas as one device: {', '.join(stages)}",
        )


def step_for(optimizer: Any) -> Step:
    """The `Step` of the step traced now: one for every replica (and branch) of a trace."""
    graph = tf.compat.v1.get_default_graph()
    while getattr(graph, "outer_graph", None) is not None:  # a cond's branch, a replica's
        graph = graph.outer_graph
    traced = _TRACING.get(optimizer)
    if traced is None or traced[0]() is not graph:
        traced = (weakref.ref(graph), Step(optimizer))
        _TRACING[optimizer] = traced
    return traced[1]
