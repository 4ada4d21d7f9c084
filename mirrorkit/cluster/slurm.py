"""A Slurm job step as its environment variables describe it: nodes, tasks, ports, GPUs.

Pure functions of the environment, no TensorFlow, no ``scontrol``, no
``nvidia-smi``. `mirrorkit.cluster.cluster_info.from_environment` turns a `Step` into the
`ClusterInfo` every worker reads (one Slurm task per worker: ``srun python
train.py``); `mirrorkit launch` under ``srun`` lays its workers out from the
same `Step` (one launcher per node). The variables read, all set by ``srun``
in every task of a step:

- ``SLURM_STEP_ID``: present in a step; absent in a batch script or an
  ``salloc`` shell, where the job's other tasks are not running.
- ``SLURM_STEP_NODELIST`` (hostlist syntax, ``node[01-03,07],gpu5``) and
  ``SLURM_STEP_TASKS_PER_NODE`` (``2(x3),1``): the step's nodes, in order,
  and how many of its tasks each runs; ``SLURM_STEP_NUM_TASKS`` their sum.
- ``SLURMD_NODENAME`` (else ``SLURM_NODEID``) and ``SLURM_LOCALID``: this
  task's node and its index among that node's tasks.
- ``SLURM_JOB_ID``: picks the ports (below).

A task's rank is its position in node order: node 0's tasks first, each
node's by ``SLURM_LOCALID``. That is ``SLURM_PROCID`` under Slurm's default
block distribution. Local task j of a node listens on port ``first_port + j``
of that node, where ``first_port`` is ``MIRRORKIT_PORT`` if set, else
``29470 + 64 * (SLURM_JOB_ID mod 48)`` (29470 to 32541: below Linux's
ephemeral ports, and two jobs sharing a node collide only when their job ids
agree mod 48). The nodes' names must resolve on every node, as Slurm's node
names do where they are the hosts' names.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Mapping

from mirrorkit.environment_variables import (
    CUDA_VISIBLE_DEVICES,
    MIRRORKIT_PORT,
    SLURM_GPU_BIND,
    SLURM_GPUS_PER_TASK,
    SLURM_JOB_ID,
    SLURM_JOB_NUM_NODES,
    SLURM_LOCALID,
    SLURM_NNODES,
    SLURM_NODEID,
    SLURM_NTASKS,
    SLURM_STEP_ID,
    SLURM_STEP_NODELIST,
    SLURM_STEP_NUM_TASKS,
    SLURM_STEP_TASKS_PER_NODE,
    SLURMD_NODENAME,
)

#: The lowest first port; the same as `mirrorkit launch`'s default ``--port``.
BASE_PORT = 29470
#: Ports set aside for each job's tasks on one node, and how many such blocks there are.
PORT_STRIDE, PORT_BLOCKS = 64, 48


def expand_hostlist(text: str) -> list[str]:
    """Expands a Slurm hostlist such as ``node[01-03,07],gpu5``.

    Zero padding follows each range's lower bound; several bracket groups in
    one name multiply (``r[1-2]n[1-2]``: four hosts).

    Args:
        text: the hostlist, e.g. ``SLURM_STEP_NODELIST``.

    Returns:
        The host names, in order.

    Raises:
        ValueError: an unbalanced bracket or a range that is not numbers.

    Example:
    ```python
    from mirrorkit.cluster.slurm import expand_hostlist

    hosts = expand_hostlist("node[01-03,07],gpu5")
    assert hosts == ["node01", "node02", "node03", "node07", "gpu5"]
    ```
    """
    hosts: list[str] = []
    for item in _split_top_level(text.strip(), text):
        parts = re.split(r"\[([^\[\]]*)\]", item)
        if any(c in part for part in parts[::2] for c in "[]"):
            raise ValueError(f"Slurm hostlist {text!r} has an unbalanced bracket in {item!r}")
        choices = [[p] if i % 2 == 0 else _expand_ranges(p, text) for i, p in enumerate(parts)]
        hosts += ["".join(names) for names in itertools.product(*choices)]
    return hosts


def _split_top_level(text: str, whole: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += {"[": 1, "]": -1}.get(c, 0)
        if depth < 0 or depth > 1:
            raise ValueError(f"Slurm hostlist {whole!r} has unbalanced brackets")
        if c == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    if depth or any(not item for item in items):
        raise ValueError(f"Slurm hostlist {whole!r} has an empty name or an unclosed bracket")
    return items


def _expand_ranges(ranges: str, whole: str) -> list[str]:
    names = []
    for part in ranges.split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or not (high or low).isdigit() or int(high or low) < int(low):
            raise ValueError(f"Slurm hostlist {whole!r}: {part!r} is not a range like 01-03")
        names += [f"{n:0{len(low)}d}" for n in range(int(low), int(high or low) + 1)]
    return names


def expand_tasks_per_node(text: str) -> list[int]:
    """Expands Slurm's tasks-per-node syntax such as ``2(x3),1``.

    Args:
        text: e.g. ``SLURM_STEP_TASKS_PER_NODE``.

    Returns:
        Each node's task count, in node order.

    Raises:
        ValueError: a part that is not ``N`` or ``N(xM)``.

    Example:
    ```python
    from mirrorkit.cluster.slurm import expand_tasks_per_node

    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    ```
    """
    counts: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match is None:
            raise ValueError(
                f"Slurm tasks per node {text!r}: {part!r} is not N or N(xM), e.g. 2(x3),1"
            )
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


@dataclasses.dataclass(frozen=True)
class Step:
    """The tasks of one Slurm job step, and which of them this process is.

    Attributes:
        hosts: the step's nodes, in Slurm's order.
        tasks_per_node: how many of the step's tasks each node runs.
        node_index: this task's node, an index into `hosts`.
        local_id: this task's index among its node's tasks (``SLURM_LOCALID``).
        first_port: local task j of every node listens on ``first_port + j``.
    """

    hosts: tuple[str, ...]
    tasks_per_node: tuple[int, ...]
    node_index: int
    local_id: int
    first_port: int

    @property
    def num_tasks(self) -> int:
        """Tasks in the step."""
        return sum(self.tasks_per_node)

    @property
    def rank(self) -> int:
        """This task's rank: node 0's tasks first, each node's by local id."""
        return sum(self.tasks_per_node[: self.node_index]) + self.local_id

    @property
    def tasks_here(self) -> int:
        """Tasks of the step on this task's node."""
        return self.tasks_per_node[self.node_index]

    def addresses(self, per_task: int = 1) -> tuple[str, ...]:
        """``host:port`` of every worker in rank order, `per_task` workers per task.

        Args:
            per_task: workers each task runs (1: the task is the worker;
                K: each task is a ``mirrorkit launch -n K``).
        """
        return tuple(
            f"{host}:{self.first_port + local * per_task + j}"
            for host, count in zip(self.hosts, self.tasks_per_node, strict=True)
            for local in range(count)
            for j in range(per_task)
        )


def first_port(env: Mapping[str, str]) -> int:
    """Local task 0's port on every node: ``MIRRORKIT_PORT``, else one from ``SLURM_JOB_ID``.

    Example:
    ```python
    from mirrorkit.cluster.slurm import first_port

    assert first_port({"SLURM_JOB_ID": "49"}) == 29470 + 64
    assert first_port({"MIRRORKIT_PORT": "40000", "SLURM_JOB_ID": "49"}) == 40000
    ```
    """
    if env.get(MIRRORKIT_PORT):
        port = _int(env, MIRRORKIT_PORT)
        if not 1024 <= port <= 65535:
            raise ValueError(f"{MIRRORKIT_PORT}={port} must be a TCP port from 1024 to 65535")
        return port
    job = _int(env, SLURM_JOB_ID) if env.get(SLURM_JOB_ID) else 0
    return BASE_PORT + PORT_STRIDE * (job % PORT_BLOCKS)


def step(env: Mapping[str, str]) -> Step | None:
    """The Slurm step this process is a task of, or None outside a step of several tasks.

    Args:
        env: the environment (``os.environ``).

    Returns:
        A `Step` when ``SLURM_STEP_ID`` is set and the step has more than one
        task; None otherwise (no Slurm, one task, or a batch script).

    Raises:
        ValueError: a step variable is missing or malformed, or they disagree;
            the message names the variable.

    Example:
    ```python
    from mirrorkit.cluster.slurm import step

    env = {"SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "gpu[1-2]", "SLURMD_NODENAME": "gpu2",
           "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "7"}
    here = step(env)
    assert (here.num_tasks, here.rank) == (4, 3)
    assert here.addresses()[3] == "gpu2:29919"
    ```
    """
    if env.get(SLURM_STEP_ID) is None:
        return None
    for name in (SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE, SLURM_LOCALID):
        if not env.get(name):
            raise ValueError(
                f"Slurm step variable {name} is not set, but SLURM_STEP_ID is: mirrorkit needs "
                "it to find the step's other tasks. Run the script with srun, which sets it"
            )
    hosts = _read(expand_hostlist, env, SLURM_STEP_NODELIST)
    counts = _read(expand_tasks_per_node, env, SLURM_STEP_TASKS_PER_NODE)
    if len(counts) != len(hosts):
        raise ValueError(
            f"SLURM_STEP_TASKS_PER_NODE={env[SLURM_STEP_TASKS_PER_NODE]!r} gives {len(counts)} "
            f"node(s) but SLURM_STEP_NODELIST={env[SLURM_STEP_NODELIST]!r} names {len(hosts)}"
        )
    total = sum(counts)
    if env.get(SLURM_STEP_NUM_TASKS) and _int(env, SLURM_STEP_NUM_TASKS) != total:
        raise ValueError(
            f"SLURM_STEP_NUM_TASKS={env[SLURM_STEP_NUM_TASKS]} but SLURM_STEP_TASKS_PER_NODE="
            f"{env[SLURM_STEP_TASKS_PER_NODE]!r} adds up to {total}"
        )
    if total < 2:
        return None
    node = _node_index(env, hosts)
    local = _int(env, SLURM_LOCALID)
    if not 0 <= local < counts[node]:
        raise ValueError(
            f"SLURM_LOCALID={local}, but the step runs {counts[node]} task(s) on {hosts[node]} "
            f"(SLURM_STEP_TASKS_PER_NODE={env[SLURM_STEP_TASKS_PER_NODE]!r})"
        )
    return Step(tuple(hosts), tuple(counts), node, local, first_port(env))


def _read(parse, env: Mapping[str, str], name: str):
    try:
        return parse(env[name])
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None


def _node_index(env: Mapping[str, str], hosts: list[str]) -> int:
    name = env.get(SLURMD_NODENAME)
    if name in hosts:
        return hosts.index(name)
    if env.get(SLURM_NODEID) is None:
        raise ValueError(
            f"neither SLURMD_NODENAME ({name!r}) nor SLURM_NODEID says which node of "
            f"SLURM_STEP_NODELIST ({', '.join(hosts)}) this task runs on"
        )
    index = _int(env, SLURM_NODEID)
    if not 0 <= index < len(hosts):
        raise ValueError(f"SLURM_NODEID={index} is outside the step's {len(hosts)} node(s)")
    return index


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise ValueError(f"Slurm variable {name} must be an integer; got {env[name]!r}") from None


def outside_step_note(
    env: Mapping[str, str], consequence: str = "it trains alone here"
) -> str | None:
    """What to say when a job of several tasks runs this process outside any step.

    A batch script (``sbatch``) or an ``salloc`` shell of a job with several
    tasks runs once, on the first node: the job's other tasks start only
    under ``srun``. A training script there trains alone.

    Returns:
        The notice, or None when there is nothing to say.

    Example:
    ```python
    from mirrorkit.cluster.slurm import outside_step_note

    assert "srun" in outside_step_note({"SLURM_JOB_ID": "5", "SLURM_NTASKS": "4"})
    assert outside_step_note({"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0"}) is None
    ```
    """
    if env.get(SLURM_JOB_ID) is None or env.get(SLURM_STEP_ID) is not None:
        return None
    tasks = env.get(SLURM_NTASKS) or ""
    nodes = env.get(SLURM_JOB_NUM_NODES) or env.get(SLURM_NNODES) or "1"
    if not (tasks.isdigit() and int(tasks) > 1) and not (nodes.isdigit() and int(nodes) > 1):
        return None
    return (
        f"Slurm job {env[SLURM_JOB_ID]} has {tasks or '?'} task(s) on {nodes} node(s), but "
        "this process is not a task of a job step (no SLURM_STEP_ID: a batch script or an "
        f"salloc shell), so the job's other tasks are not running and {consequence}. "
        "Start one task per worker with `srun python SCRIPT`, or one launcher per node with "
        "`srun --ntasks-per-node=1 mirrorkit launch -n K SCRIPT` (docs: clusters/slurm/)"
    )


def gpu_share(here: Step, env: Mapping[str, str], visible: int) -> range:
    """Which of the GPUs this task sees it trains on (indices into TensorFlow's GPU list).

    Slurm binds GPUs to tasks with ``--gpus-per-task`` (setting
    ``SLURM_GPUS_PER_TASK`` and each task's ``CUDA_VISIBLE_DEVICES``) or
    ``--gpu-bind`` (``SLURM_GPU_BIND``): then every GPU a task sees is its
    own. Otherwise (``--gpus-per-node``, ``--gres=gpu:N``) every task of a
    node sees all of the node's GPUs, and local task j takes the j-th equal
    share, as ``SLURM_LOCALID`` orders them.

    Args:
        here: this task's step.
        env: the environment.
        visible: how many GPUs this process sees.

    Returns:
        The indices of this task's GPUs; empty without GPUs.

    Raises:
        ValueError: the node's tasks outnumber the GPUs they share.

    Example:
    ```python
    from mirrorkit.cluster.slurm import Step, gpu_share

    here = Step(("a", "b"), (4, 4), 1, 2, 29470)  # local task 2 of 4 on node b
    assert gpu_share(here, {}, 8) == range(4, 6)
    assert gpu_share(here, {"SLURM_GPUS_PER_TASK": "1"}, 1) == range(0, 1)
    ```
    """
    bound = env.get(SLURM_GPUS_PER_TASK) or env.get(SLURM_GPU_BIND, "none") != "none"
    tasks = here.tasks_here
    if visible == 0 or bound or tasks == 1:
        return range(visible)
    if visible < tasks:
        raise ValueError(
            f"the Slurm step runs {tasks} tasks on {here.hosts[here.node_index]} and they share "
            f"the {visible} GPU(s) each of them sees (CUDA_VISIBLE_DEVICES="
            f"{env.get(CUDA_VISIBLE_DEVICES, 'unset')}): a worker needs a GPU of its own. "
            f"Ask for one per task (srun --gpus-per-task=1), or run {visible} task(s) per node"
        )
    each = visible // tasks
    return range(here.local_id * each, (here.local_id + 1) * each)
