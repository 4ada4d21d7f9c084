"""The strategy vocabulary and its rules, in one place, importing no TensorFlow.

`mk.strategy` (`arguments`, `allreduce`) and `mirrorkit.flags` (whose parsing must
not start TensorFlow) both read them here: the kinds and their aliases, the
all-reduce names, which kinds run one replica or several workers, which
all-reduce is GPU-only or single-host, and which one takes gradient buckets
and a timeout.

Example:
```python
from mirrorkit.strategies import rules

assert rules.normalize_kind("Off") == "default"
assert rules.collective("nccl", multi_worker=True) and not rules.collective("nccl", False)
```
"""

from __future__ import annotations

#: `mk.strategy` kinds, and the aliases users may pass instead.
KINDS = ("auto", "mirrored", "multi_worker", "one_device", "default")
ALIASES = {"multi_worker_mirrored": "multi_worker", "off": "default"}
#: Kinds that run one replica (nothing to all-reduce).
SINGLE_REPLICA = ("one_device", "default")

#: `all_reduce` names (`mirrorkit.strategies.allreduce` maps them to TensorFlow's ops).
ALL_REDUCE_CHOICES = ("auto", "nccl", "ring", "hierarchical_copy", "reduce_to_one")
#: The all-reduce names a multi-worker strategy takes (its collective's implementations).
MULTI_WORKER_CHOICES = ("auto", "ring", "nccl")
#: All-reduce ops that need GPUs.
GPU_ONLY = ("nccl", "hierarchical_copy")
#: Single-host ops that pack every gradient into one buffer (``num_packs``), no timeout.
PACKED = ("nccl", "hierarchical_copy")


def normalize_kind(kind: str) -> str:
    """Returns the canonical kind name, or raises naming the valid ones.

    Args:
        kind: a kind or alias, case-insensitive.

    Returns:
        One of `KINDS`.
    """
    name = kind.lower() if isinstance(kind, str) else kind
    name = ALIASES.get(name, name)
    if name not in KINDS:
        valid = ", ".join(KINDS + tuple(f"{a} (= {b})" for a, b in ALIASES.items()))
        raise ValueError(f"Unknown strategy kind {kind!r}; valid kinds are {valid}")
    return name


def collective(all_reduce: str, multi_worker: bool) -> bool:
    """Whether `all_reduce` is TensorFlow's collective all-reduce (buckets and a timeout).

    ``auto`` and ``ring`` are; ``nccl`` is across workers (the collective's NCCL
    implementation) but not on one host (`tf.distribute.NcclAllReduce`).

    Args:
        all_reduce: a name from `ALL_REDUCE_CHOICES`.
        multi_worker: whether the strategy spans several workers.
    """
    return all_reduce in ("auto", "ring") or (all_reduce == "nccl" and multi_worker)
