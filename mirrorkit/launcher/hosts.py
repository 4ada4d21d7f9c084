"""Which workers run where: the cluster layout of a local or multi-host launch.

Every host of a multi-host job runs ``mirrorkit launch`` with the same
``--hosts`` (or is a task of the same Slurm step), so every host computes the
same worker list: host k's local worker j is global worker ``k * nproc + j``
and listens on ``port + j`` of host k. When a worker fails because a peer
stopped answering, `lost_peer_note` maps the task TensorFlow names back to that
host (``host:port`` and ``--node-rank``) for the launcher's last line.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

from mirrorkit.cluster import slurm
from mirrorkit.cluster.slurm import expand_hostlist

__all__ = [
    "DEFAULT_PORT",
    "MAX_PORT",
    "Layout",
    "check_ports",
    "expand_hostlist",
    "from_slurm",
    "lost_peer_note",
    "lost_peers",
    "multi_host",
]

#: First port of each host's workers when ``--hosts`` gives none.
DEFAULT_PORT = slurm.BASE_PORT


@dataclasses.dataclass(frozen=True)
class Layout:
    """The workers of one job and which of them this host runs.

    Attributes:
        addresses: ``host:port`` of every worker, in rank order.
        first_rank: the rank of this host's first worker.
        local_workers: how many workers this host runs.
        multi_host: whether the job's workers talk over the network (several
            hosts, or several launchers of one Slurm step).
        slurm: whether Slurm's step variables laid it out (not ``--hosts``).
    """

    addresses: tuple[str, ...]
    first_rank: int
    local_workers: int
    multi_host: bool
    slurm: bool = False

    @property
    def local_ranks(self) -> range:
        """The global ranks of this host's workers."""
        return range(self.first_rank, self.first_rank + self.local_workers)


def multi_host(
    hosts: Sequence[str], node_rank: int, nproc: int, port: int = DEFAULT_PORT
) -> Layout:
    """The layout of a job over `hosts`, as seen from host number `node_rank`.

    Args:
        hosts: every host's name or address, optionally ``host:port`` to give
            that host's first worker port; the same list on every host.
        node_rank: this host's position in `hosts`.
        nproc: workers per host.
        port: first worker port on hosts that name none.

    Raises:
        ValueError: `node_rank` is outside `hosts`, or a port is not a number.

    Example:
    ```python
    from mirrorkit.launcher.hosts import multi_host

    job = multi_host(["a", "b:3000"], 1, 2)
    assert job.addresses == ("a:29470", "a:29471", "b:3000", "b:3001")
    ```
    """
    if not 0 <= node_rank < len(hosts):
        raise ValueError(
            f"--node-rank {node_rank} is outside the {len(hosts)} hosts "
            f"({', '.join(hosts)}); it must be 0 to {len(hosts) - 1}"
        )
    addresses = []
    for host in hosts:
        name, _, first = host.rpartition(":") if ":" in host else (host, "", str(port))
        if not first.isdigit():
            raise ValueError(f"host {host!r} in --hosts must be HOST or HOST:PORT")
        check_ports(int(first), nproc, f"host {name!r}")
        addresses += [f"{name}:{int(first) + j}" for j in range(nproc)]
    return Layout(tuple(addresses), node_rank * nproc, nproc, len(hosts) > 1)


#: The largest TCP port number.
MAX_PORT = 65535


def check_ports(first: int, count: int, where: str) -> None:
    """Raises unless ports ``first`` to ``first + count - 1`` are all valid TCP ports.

    Args:
        first: the first worker port.
        count: how many workers listen from it up.
        where: names the source of `first` in the message, e.g. ``"--port"``.
    """
    last = first + count - 1
    if first < 1 or last > MAX_PORT:
        raise ValueError(
            f"{where}: {count} worker(s) would listen on ports {first}-{last}, but TCP ports go "
            f"from 1 to {MAX_PORT}; pick a first port from 1024 to {MAX_PORT - count + 1} "
            f"(the default is {DEFAULT_PORT})"
        )


def from_slurm(
    env: Mapping[str, str], nproc: int, port: int | None = None
) -> tuple[Layout | None, str | None]:
    """The layout of a launch that is one task of a Slurm step of several, and a warning.

    Each task of the step (``srun --ntasks-per-node=1 mirrorkit launch -n K``:
    one per node) runs K workers; task t's worker j has rank ``t * K + j``
    and listens on ``first_port + local_id * K + j`` of its node (see
    `mirrorkit.cluster.slurm`; `port` overrides ``first_port``).

    Args:
        env: the environment.
        nproc: workers this launcher runs (``-n``).
        port: ``--port``, or None for `mirrorkit.cluster.slurm.first_port`.

    Returns:
        ``(layout, warning)``: layout None outside a step of several tasks;
        a warning where the Slurm variables describe tasks this launch cannot
        use as they are (a batch script of a job of several tasks, or several
        launchers sharing a node), else None.

    Example:
    ```python
    from mirrorkit.launcher.hosts import from_slurm

    env = {"SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "n[1-2]", "SLURMD_NODENAME": "n2",
           "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_LOCALID": "0", "SLURM_JOB_ID": "48"}
    job, warning = from_slurm(env, 2)
    assert job.addresses == ("n1:29470", "n1:29471", "n2:29470", "n2:29471")
    assert (job.first_rank, warning) == (2, None)
    ```
    """
    here = slurm.step(env)
    if here is None:
        return None, slurm.outside_step_note(env, f"only this launcher's {nproc} worker(s) train")
    if port is not None:
        here = dataclasses.replace(here, first_port=port)
    check_ports(here.first_port, here.tasks_here * nproc, "the Slurm step's ports")
    warning = None
    if here.tasks_here > 1:
        warning = (
            f"the Slurm step runs {here.tasks_here} mirrorkit launchers on "
            f"{here.hosts[here.node_index]}, each starting {nproc} worker(s) (ranks "
            f"{here.rank * nproc}-{here.rank * nproc + nproc - 1} here): they share the node's "
            "CPUs unless Slurm binds each task its own, and each pins its workers alone. Run "
            f"one launcher per node (srun --ntasks-per-node=1 mirrorkit launch -n "
            f"{here.tasks_here * nproc}), or one task per worker (srun python SCRIPT)"
        )
    job = Layout(here.addresses(nproc), here.rank * nproc, nproc, True, slurm=True)
    return job, warning


# What TensorFlow prints when a worker's peer stops answering (TF 2.17 to 2.21):
# the coordination service on worker 0 names the tasks whose heartbeats stopped
# ("tasks are unhealthy" in 2.21, "Task ... heartbeat timeout" in 2.17); another
# worker's heartbeat to worker 0 times out; MWMS's own health check names a task
# it found down; a call to a peer whose server is gone fails to connect and
# names the remote target.
_UNHEALTHY = re.compile(
    r"tasks are unhealthy \(stopped sending heartbeats\):((?:\s*/job:\w+/replica:\d+/task:\d+)+)"
)
_TASK = re.compile(r"/task:(\d+)")
_HEARTBEAT_TIMEOUT = re.compile(r"Task /job:\w+/replica:\d+/task:(\d+) heartbeat timeout")
_HEALTH_CHECK = re.compile(r"cluster check alive failed, /job:\w+/replica:\d+/task:(\d+) is down")
_HEARTBEAT_RPC = "RPC: /tensorflow.CoordinationService/Heartbeat"
_HEARTBEAT_TO = re.compile(
    r"from remote target /job:\w+/replica:\d+/task:(\d+) while calling "
    r"/tensorflow.CoordinationService/Heartbeat"
)
_NO_CONNECTION = "failed to connect to all addresses"
_REMOTE = re.compile(r"from remote target /job:\w+/replica:\d+/task:(\d+)")
_REFUSED_AT = re.compile(r"ipv[46]:\[?([^\s\]]+?)\]?:(\d+): Failed to connect")


def lost_peers(output: str, addresses: Sequence[str]) -> list[int]:
    r"""The ranks of the peers a failed worker's output says it lost contact with.

    Args:
        output: the last lines a failed worker printed (its traceback).
        addresses: ``host:port`` of every worker, in rank order.

    Returns:
        Ranks in increasing order; empty when the output names no lost peer.

    Example:
    ```python
    from mirrorkit.launcher.hosts import lost_peers

    said = "tasks are unhealthy (stopped sending heartbeats):\n/job:worker/replica:0/task:1"
    assert lost_peers(said, ["a:29470", "b:29470"]) == [1]
    ```
    """
    ranks = {int(t) for found in _UNHEALTHY.findall(output) for t in _TASK.findall(found)}
    for pattern in (_HEARTBEAT_TIMEOUT, _HEALTH_CHECK, _HEARTBEAT_TO):
        ranks.update(int(t) for t in pattern.findall(output))
    if _NO_CONNECTION in output:
        ranks.update(int(t) for t in _REMOTE.findall(output))
        unreachable = {f"{host}:{port}" for host, port in _REFUSED_AT.findall(output)}
        ranks.update(r for r, address in enumerate(addresses) if address in unreachable)
    if not ranks and _HEARTBEAT_RPC in output:
        ranks.add(0)  # worker 0 runs the coordination service every worker sends heartbeats to
    return sorted(r for r in ranks if 0 <= r < len(addresses))


def lost_peer_note(output: str, job: Layout) -> str:
    """Says which host a failed worker of a multi-host job lost, or "" when it lost none.

    Appended to the launcher's "worker N failed" line, so that a cut link or a
    dead host reads as that, not as TensorFlow's gRPC trace (which calls an
    unreachable peer "crashed" and names it only as ``/job:worker/task:N``).

    Args:
        output: the failed worker's last lines.
        job: the job's layout.
    """
    ranks = lost_peers(output, job.addresses)
    if not job.multi_host or not ranks:
        return ""
    where = "" if job.slurm else " (--node-rank {})"
    peers = ", ".join(
        f"worker {r} at {job.addresses[r]}{where.format(r // job.local_workers)}" for r in ranks
    )
    return (
        f"; it lost contact with {peers}: that worker stopped answering, so its host is down, "
        "its process ended, or the network between the hosts failed (TensorFlow's trace above "
        "may call it 'crashed' either way). Check that host and the link to it, then run the "
        "same mirrorkit launch on every host again; a script with "
        "keras.callbacks.BackupAndRestore resumes from its last backup"
    )
