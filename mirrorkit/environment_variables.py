"""Every environment variable mirrorkit reads or sets: what it means, who sets it, who reads it.

The one home of this contract (torchrun's list of the variables it sets is
the model): each module takes a variable's name from here, a constant spelled
as the variable itself (``env.get(TF_CONFIG)``), and the Contracts page (docs: contracts/) lists
`VARIABLES` as a table (a test keeps the page and this module equal, and
another that no other module spells a ``MIRRORKIT_*`` name or ``TF_CONFIG``).

Standard library only: the launcher and the cluster readers import it without
TensorFlow or Keras.

Example:
```python
import os

from mirrorkit.environment_variables import MIRRORKIT_RESTART, VARIABLES

attempt = int(os.environ.get(MIRRORKIT_RESTART, "0"))  # under `mirrorkit launch --max-restarts`
print([v.name for v in VARIABLES if v.name.startswith("SLURM_STEP_")])
```
"""

from __future__ import annotations

import dataclasses

# --- set by mirrorkit on the workers it starts --------------------------------------------
TF_CONFIG = "TF_CONFIG"
MIRRORKIT_WORKER = "MIRRORKIT_WORKER"
MIRRORKIT_RESTART = "MIRRORKIT_RESTART"
MIRRORKIT_PROGRESS = "MIRRORKIT_PROGRESS"
MIRRORKIT_HANG_TIMEOUT = "MIRRORKIT_HANG_TIMEOUT"
MIRRORKIT_TF_STARTUP_LOGS = "MIRRORKIT_TF_STARTUP_LOGS"
TF_CPP_MIN_LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
TF_NUM_INTRAOP_THREADS = "TF_NUM_INTRAOP_THREADS"
TF_NUM_INTEROP_THREADS = "TF_NUM_INTEROP_THREADS"
OMP_NUM_THREADS = "OMP_NUM_THREADS"
MALLOC_MMAP_THRESHOLD_ = "MALLOC_MMAP_THRESHOLD_"
MALLOC_TRIM_THRESHOLD_ = "MALLOC_TRIM_THRESHOLD_"
MALLOC_TOP_PAD_ = "MALLOC_TOP_PAD_"
MALLOC_ARENA_MAX = "MALLOC_ARENA_MAX"
PYTHONUNBUFFERED = "PYTHONUNBUFFERED"
PYTHONPATH = "PYTHONPATH"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
# --- set by the user ----------------------------------------------------------------------
MIRRORKIT_PORT = "MIRRORKIT_PORT"
GLIBC_TUNABLES = "GLIBC_TUNABLES"
KERAS_BACKEND = "KERAS_BACKEND"
KERASTUNER_TUNER_ID = "KERASTUNER_TUNER_ID"
KERASTUNER_ORACLE_IP = "KERASTUNER_ORACLE_IP"
KERASTUNER_ORACLE_PORT = "KERASTUNER_ORACLE_PORT"
# --- set by a cluster engine or platform ----------------------------------------------------
SLURM_JOB_ID = "SLURM_JOB_ID"
SLURM_STEP_ID = "SLURM_STEP_ID"
SLURM_STEP_NODELIST = "SLURM_STEP_NODELIST"
SLURM_STEP_TASKS_PER_NODE = "SLURM_STEP_TASKS_PER_NODE"
SLURM_STEP_NUM_TASKS = "SLURM_STEP_NUM_TASKS"
SLURM_LOCALID = "SLURM_LOCALID"
SLURM_NODEID = "SLURM_NODEID"
SLURMD_NODENAME = "SLURMD_NODENAME"
SLURM_NTASKS = "SLURM_NTASKS"
SLURM_JOB_NUM_NODES = "SLURM_JOB_NUM_NODES"
SLURM_NNODES = "SLURM_NNODES"
SLURM_GPUS_PER_TASK = "SLURM_GPUS_PER_TASK"
SLURM_GPU_BIND = "SLURM_GPU_BIND"
SM_HOSTS = "SM_HOSTS"
SM_CURRENT_HOST = "SM_CURRENT_HOST"
TF_USE_LEGACY_KERAS = "TF_USE_LEGACY_KERAS"

#: The prefix of every variable mirrorkit itself defines.
MIRRORKIT_PREFIX = "MIRRORKIT_"
#: glibc's malloc tunables (the user setting any one of them keeps the launcher's off).
MALLOC_PREFIX = "MALLOC_"


@dataclasses.dataclass(frozen=True)
class Variable:
    """One environment variable: its name, what it means, who sets it and who reads it.

    Attributes:
        name: the variable (and the constant in this module).
        meaning: what its value says.
        set_by: who sets it.
        read_by: who reads it.
    """

    name: str
    meaning: str
    set_by: str
    read_by: str


_LAUNCHERS = "`mirrorkit launch`, `mk.launch`, `mirrorkit bench`"
_SLURM = "Slurm (`srun`)"
_SLURM_READER = "`mk.strategy`, `mirrorkit launch`, `mirrorkit info`"

#: The table: mirrorkit's own variables first, then what it sets of others, then what it reads.
VARIABLES = (
    Variable(
        MIRRORKIT_WORKER,
        "this worker's rank in the job (0 first), the one TF_CONFIG gives it",
        _LAUNCHERS,
        "user scripts (mirrorkit itself reads TF_CONFIG)",
    ),
    Variable(
        MIRRORKIT_RESTART,
        "the attempt: 0 at the first launch, N at the Nth restart (`--max-restarts`)",
        "`mirrorkit launch`",
        "`mirrorkit launch` (which processes are its workers, for SIGTERM); user scripts",
    ),
    Variable(
        MIRRORKIT_PROGRESS,
        "the file where `mk.resumable` records the chief's epoch and step and the backup's "
        "place, so a restart can say where the job failed and where it resumes",
        "`mirrorkit launch`",
        "`mk.resumable` (writes the file); `mirrorkit launch` (reads it)",
    ),
    Variable(
        MIRRORKIT_HANG_TIMEOUT,
        "seconds a training step may take before the worker ends (exit status 43)",
        "`mirrorkit launch --hang-timeout S`",
        "`mk.callbacks.HangWatchdog()` without `hang_timeout_s`",
    ),
    Variable(
        MIRRORKIT_TF_STARTUP_LOGS,
        "`1`: keep TensorFlow's C++ start-up lines in worker output (dropped by default)",
        "`--tf-startup-logs` (`mirrorkit launch`, `demo`), or the user",
        "the launcher's output filter",
    ),
    Variable(
        MIRRORKIT_PORT,
        "the first worker port on each node of a Slurm step (local task j: this + j)",
        "the user",
        "`mk.strategy` and `mirrorkit launch` under Slurm",
    ),
    Variable(
        TF_CONFIG,
        "the cluster (every task's host:port) and this process's task, as JSON",
        f"{_LAUNCHERS}; `mirrorkit.flags` from `--worker_hosts`; "
        "Kubeflow, Vertex AI, SageMaker; the user",
        "`mk.strategy`, `mirrorkit info`, the flags' checks; "
        "TensorFlow; unset in `mk.check_equivalence`'s processes",
    ),
    Variable(
        TF_CPP_MIN_LOG_LEVEL,
        "TensorFlow's C++ log level: 2 hides its INFO and WARNING lines, 3 its errors too",
        "the `mirrorkit` command and the launcher (if unset); 3 in `mirrorkit bench`'s workers",
        "TensorFlow",
    ),
    Variable(
        TF_NUM_INTRAOP_THREADS,
        "TensorFlow's threads inside one op: a pinned worker's core count",
        "the launcher, for pinned workers, unless the user set it",
        "TensorFlow; `mirrorkit bench` records it",
    ),
    Variable(
        TF_NUM_INTEROP_THREADS,
        "TensorFlow's threads across ops: a pinned worker's core count (at least 2)",
        "the launcher, for pinned workers, unless the user set it",
        "TensorFlow; `mirrorkit bench` records it",
    ),
    Variable(
        OMP_NUM_THREADS,
        "OpenMP threads: a pinned worker's core count",
        "the launcher, for pinned workers, unless the user set it",
        "OpenMP (oneDNN); `mirrorkit bench` records it",
    ),
    Variable(
        MALLOC_MMAP_THRESHOLD_,
        "glibc: allocations from this size go to mmap (32 MiB for workers)",
        "the launcher, unless any MALLOC_* or a glibc.malloc tunable is set; "
        "`mk.plan_memory`'s measuring process",
        "glibc malloc",
    ),
    Variable(
        MALLOC_TRIM_THRESHOLD_,
        "glibc: free memory kept before it is returned to the system (1 GiB for workers)",
        "the launcher (as MALLOC_MMAP_THRESHOLD_); `mk.plan_memory`'s measuring process",
        "glibc malloc",
    ),
    Variable(
        MALLOC_TOP_PAD_,
        "glibc: extra memory asked for at each heap growth (64 MiB for workers)",
        "the launcher (as MALLOC_MMAP_THRESHOLD_); `mk.plan_memory`'s measuring process",
        "glibc malloc",
    ),
    Variable(
        MALLOC_ARENA_MAX,
        "glibc: the most malloc arenas (1 in the measuring process: how many threads' arenas "
        "a step touches otherwise changes its peak by about 20 MiB from run to run)",
        "`mk.plan_memory`'s measuring process",
        "glibc malloc",
    ),
    Variable(
        GLIBC_TUNABLES,
        "glibc's tunables: one for glibc.malloc keeps the launcher's MALLOC_* settings off",
        "the user",
        "the launcher; glibc",
    ),
    Variable(
        PYTHONUNBUFFERED,
        "`1`: worker output reaches the launcher line by line",
        "the launcher",
        "Python",
    ),
    Variable(
        PYTHONPATH,
        "the caller's `sys.path`, so a worker imports what the caller imports",
        "the launcher",
        "Python",
    ),
    Variable(
        CUDA_VISIBLE_DEVICES,
        "the GPUs a process sees: empty for the CPU-only measuring processes",
        "`mk.plan_memory`, `mk.check_equivalence` (their processes); Slurm; the user",
        "TensorFlow; the Slurm GPU-share error quotes it",
    ),
    Variable(
        KERAS_BACKEND,
        "Keras's backend: mirrorkit needs `tensorflow` (its error says to set it)",
        "the user",
        "Keras",
    ),
    Variable(
        KERASTUNER_TUNER_ID,
        "KerasTuner's distributed tuning: `chief` runs the oracle; the workers of one "
        "`mirrorkit launch` share one ID and train the same trial",
        "the user (docs: tuning/)",
        "KerasTuner; mirrorkit's repairs `keras_tuner_ask_together`, `keras_tuner_same_trial`",
    ),
    Variable(
        KERASTUNER_ORACLE_IP,
        "the address of KerasTuner's oracle (its chief)",
        "the user (docs: tuning/)",
        "KerasTuner; `mirrorkit launch` and `mk.launch`, which let the workers in their "
        "private network reach it when it is this machine's loopback",
    ),
    Variable(
        KERASTUNER_ORACLE_PORT,
        "the port of KerasTuner's oracle",
        "the user (docs: tuning/)",
        "KerasTuner; `mirrorkit launch` and `mk.launch` (as KERASTUNER_ORACLE_IP)",
    ),
    Variable(SLURM_JOB_ID, "the Slurm job", _SLURM, f"{_SLURM_READER}; default ports"),
    Variable(
        SLURM_STEP_ID,
        "the `srun` step: only a step makes a cluster",
        _SLURM,
        f"{_SLURM_READER}; `mirrorkit launch` (`scancel` of a failed step)",
    ),
    Variable(SLURM_STEP_NODELIST, "the step's nodes, as a hostlist", _SLURM, _SLURM_READER),
    Variable(
        SLURM_STEP_TASKS_PER_NODE,
        "the step's tasks on each node, e.g. `2(x3),1`",
        _SLURM,
        _SLURM_READER,
    ),
    Variable(
        SLURM_STEP_NUM_TASKS,
        "the step's tasks, checked against SLURM_STEP_TASKS_PER_NODE",
        _SLURM,
        _SLURM_READER,
    ),
    Variable(SLURM_LOCALID, "this task's index on its node", _SLURM, _SLURM_READER),
    Variable(SLURM_NODEID, "this node's index in the job", _SLURM, _SLURM_READER),
    Variable(SLURMD_NODENAME, "this node's name", _SLURM, _SLURM_READER),
    Variable(
        SLURM_NTASKS,
        "the job's tasks: a batch script outside `srun` is told it trains alone",
        "Slurm",
        _SLURM_READER,
    ),
    Variable(SLURM_JOB_NUM_NODES, "the job's nodes (for that notice)", "Slurm", _SLURM_READER),
    Variable(SLURM_NNODES, "the job's nodes (older name)", "Slurm", _SLURM_READER),
    Variable(
        SLURM_GPUS_PER_TASK,
        "GPUs bound to each task: set, a task trains on the GPUs it sees",
        _SLURM,
        "`mk.strategy`",
    ),
    Variable(
        SLURM_GPU_BIND,
        "GPU binding: other than `none`, a task trains on the GPUs it sees",
        _SLURM,
        "`mk.strategy`",
    ),
    Variable(
        SM_HOSTS,
        "SageMaker's hosts, as JSON: several without TF_CONFIG get the estimator switch",
        "SageMaker",
        "`mk.strategy`, `mirrorkit info`",
    ),
    Variable(
        SM_CURRENT_HOST,
        "this SageMaker host (the first one says the notice)",
        "SageMaker",
        "`mk.strategy`, `mirrorkit info`",
    ),
    Variable(
        TF_USE_LEGACY_KERAS,
        "a true value asks TensorFlow for Keras 2: mirrorkit keeps Keras 3, says so once on "
        "the chief, and leaves the variable",
        "Ray Train; the user",
        "`mk.strategy`",
    ),
)
