"""What ``import mirrorkit`` provides, for type checkers and the API reference.

``__init__.py`` loads its public names lazily (``_PUBLIC``, through the module's
``__getattr__``), so nothing there says statically what they are. This stub imports
each from its module: type checkers read it in place of ``__init__.py``, and
mkdocstrings (griffe) follows these imports to the docstrings. It is a stub rather
than an ``if TYPE_CHECKING:`` block so that the package's import graph
(``tests/test_architecture.py``) stays what runs. ``tests/test_docs_site.py`` checks
that it names exactly what ``_PUBLIC`` names.
"""

from mirrorkit import callbacks as callbacks
from mirrorkit import compat as compat
from mirrorkit import flags as flags
from mirrorkit.bench.benchmark import benchmark as benchmark
from mirrorkit.cluster.chief import is_chief as is_chief
from mirrorkit.cluster.chief import print as print
from mirrorkit.equivalence.check import check_equivalence as check_equivalence
from mirrorkit.equivalence.report import EquivalenceReport as EquivalenceReport
from mirrorkit.faults.backup import resumable as resumable
from mirrorkit.faults.preemption_checkpoint import PreemptionCheckpoint as PreemptionCheckpoint
from mirrorkit.launcher.notebook import launch as launch
from mirrorkit.pipeline.distributed import distribute as distribute
from mirrorkit.scale.batchnorm import synchronize_batch_norm as synchronize_batch_norm
from mirrorkit.scale.custom_step import unscale_loss as unscale_loss
from mirrorkit.scale.lr import WarmUp as WarmUp
from mirrorkit.scale.lr import scale_learning_rate as scale_learning_rate
from mirrorkit.scale.memory import plan_memory as plan_memory
from mirrorkit.strategies.factory import strategy as strategy
from mirrorkit.strategies.topology import Topology as Topology
from mirrorkit.strategies.topology import describe as describe
from mirrorkit.throughput.callback import ThroughputCallback as ThroughputCallback
from mirrorkit.throughput.report import ThroughputReport as ThroughputReport
from mirrorkit.training.building import build as build
from mirrorkit.training.global_batch import all_gather as all_gather
from mirrorkit.training.global_batch import all_gather_offset as all_gather_offset

__version__: str
__all__: list[str]
