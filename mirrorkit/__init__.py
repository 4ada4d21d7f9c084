"""mirrorkit: synchronous data-parallel training of Keras 3 models on TensorFlow.

Three lines change in a Keras script::

    import mirrorkit as mk

    strategy = mk.strategy()                       # 1. the devices or cluster
    model = mk.build(make_model, strategy)         # 2. mirrored weights
    model.fit(mk.distribute(data, global_batch_size=256))  # 3. per-replica input

The public names load lazily: ``import mirrorkit`` does not import TensorFlow,
so it never fixes TensorFlow's devices and ``mk.strategy(cpu_replicas=N)``
still works after it.
"""

from __future__ import annotations

import importlib
from typing import Any

from mirrorkit import notices  # noqa: F401 - the "mirrorkit" logger, set up before any notice
from mirrorkit.patching import post_import

# Keras's own keras.distribution.DataParallel trains through mirrorkit once Keras is imported,
# before or after mirrorkit (docs: keras-distribution/).
post_import.when_imported(("keras", "tensorflow"), "mirrorkit.strategies.keras_distribution:apply")

__version__ = "0.1.0"

# mirrorkit/__init__.pyi imports the same names, for type checkers and the API reference.
_PUBLIC = {
    "strategy": "mirrorkit.strategies.factory",
    "build": "mirrorkit.training.building",
    "describe": "mirrorkit.strategies.topology",
    "Topology": "mirrorkit.strategies.topology",
    "is_chief": "mirrorkit.cluster.chief",
    "print": "mirrorkit.cluster.chief",
    "compat": "mirrorkit.compat",
    "callbacks": "mirrorkit.callbacks",
    "launch": "mirrorkit.launcher.notebook",
    "distribute": "mirrorkit.pipeline.distributed",
    "ThroughputCallback": "mirrorkit.throughput.callback",
    "ThroughputReport": "mirrorkit.throughput.report",
    "scale_learning_rate": "mirrorkit.scale.lr",
    "WarmUp": "mirrorkit.scale.lr",
    "check_equivalence": "mirrorkit.equivalence.check",
    "unscale_loss": "mirrorkit.scale.custom_step",
    "all_gather": "mirrorkit.training.global_batch",
    "all_gather_offset": "mirrorkit.training.global_batch",
    "synchronize_batch_norm": "mirrorkit.scale.batchnorm",
    "EquivalenceReport": "mirrorkit.equivalence.report",
    "plan_memory": "mirrorkit.scale.memory",
    "benchmark": "mirrorkit.bench.benchmark",
    "flags": "mirrorkit.flags",
    "resumable": "mirrorkit.faults.backup",
    "PreemptionCheckpoint": "mirrorkit.faults.preemption_checkpoint",
}

_MODULES = {"compat", "callbacks", "flags"}

__all__ = sorted(_PUBLIC) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'mirrorkit' has no attribute {name!r}")
    loaded = importlib.import_module(module)
    value = loaded if name in _MODULES else getattr(loaded, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
