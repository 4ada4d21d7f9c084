"""A real two-node Slurm cluster on one machine, for the Slurm tests.

Debian's ``slurmctld`` and two ``slurmd`` daemons, each node in its own
network namespace from `_two_hosts.Hosts` (10.200.0.1 and 10.200.0.2, joined
by a veth pair, no route out). Node ``mk-node0`` runs the controller and is
where ``srun``/``sbatch`` are called, as on a login node; ``mk-node1`` is the
second machine. Authentication is ``auth/none`` and ``cred/none`` (no munge),
every daemon runs as root, and all state lives in one temporary directory.

The node names resolve through an ``/etc/hosts`` of the cluster's own,
bind-mounted over the machine's in a private mount namespace of each daemon
(``unshare -m``): the jobs' processes inherit it, as a real cluster's nodes
resolve each other's names through DNS. Nothing outside the test's own
namespaces changes; `close` stops the daemons and the namespaces go with
their holders.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from _two_hosts import Hosts

#: The node names, one per host of `Hosts`.
NODES = ("mk-node0", "mk-node1")
#: The Debian packages that hold the daemons and the client commands.
PACKAGES = "slurmd slurmctld slurm-client"
#: How long the cluster has to come up (both nodes idle).
START_TIMEOUT_S = 60

_CONF = """\
ClusterName=mirrorkit
SlurmctldHost={node0}({addr0})
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool-%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MessageTimeout=20
NodeName={node0} NodeAddr={addr0} CPUs={cpus} State=UNKNOWN
NodeName={node1} NodeAddr={addr1} CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


def missing() -> str | None:
    """Why a Slurm cluster cannot be made here, or None when it can."""
    tools = ("slurmctld", "slurmd", "srun", "sbatch", "sinfo", "unshare", "mount")
    absent = [tool for tool in tools if shutil.which(tool) is None]
    if absent:
        return (
            f"Slurm is not installed ({', '.join(absent)} not found): apt-get install -y {PACKAGES}"
        )
    return None


class Cluster:
    """Two Slurm nodes in two network namespaces; commands run on node 0.

    Attributes:
        dir: the cluster's directory (configuration, state, logs).
        hosts: the two namespaces.
        env: the environment for the client commands (``SLURM_CONF`` set).
    """

    def __init__(self, workdir: Path, hosts: Hosts) -> None:
        if hosts.mode != "netns":
            raise OSError(f"no network namespaces here ({hosts.why_loopback})")
        self.dir, self.hosts = workdir, hosts
        self._daemons: list[subprocess.Popen] = []
        (workdir / "state").mkdir(parents=True)
        cpus = max(2, os.cpu_count() or 1)
        conf = workdir / "slurm.conf"
        conf.write_text(
            _CONF.format(
                dir=workdir,
                node0=NODES[0],
                node1=NODES[1],
                addr0=hosts.addresses[0],
                addr1=hosts.addresses[1],
                cpus=cpus,
            )
        )
        for node in NODES:
            (workdir / f"spool-{node}").mkdir()
        with open("/etc/hosts") as f:
            names = f.read()
        names += "".join(f"{a} {n}\n" for a, n in zip(hosts.addresses, NODES, strict=True))
        (workdir / "hosts").write_text(names)
        self.env = dict(os.environ, SLURM_CONF=str(conf))
        for key in [k for k in self.env if k.startswith(("SLURM_", "SBATCH_", "SRUN_"))]:
            if key != "SLURM_CONF":
                del self.env[key]
        self.env.pop("TF_CONFIG", None)

    def start(self) -> None:
        """Starts the controller and both nodes; returns when both are idle."""
        self._daemons.append(self._daemon(0, ["slurmctld", "-D", "-i"]))
        for host, node in enumerate(NODES):
            self._daemons.append(self._daemon(host, ["slurmd", "-D", "-N", node]))
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            said = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False, timeout=20)
            states = dict(line.split() for line in said.stdout.splitlines() if line.strip())
            if all(states.get(n) == "idle" for n in NODES):
                return
            dead = [d.args for d in self._daemons if d.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(
                    f"Slurm did not come up (nodes {states}, daemons ended: {dead}):\n"
                    + self.logs()
                )
            time.sleep(0.5)

    def _daemon(self, host: int, argv: list[str]) -> subprocess.Popen:
        log = open(self.dir / f"{argv[0]}-{host}.out", "w")  # noqa: SIM115 - kept open
        return subprocess.Popen(
            self.on(host, argv),
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def on(self, host: int, argv: list[str]) -> list[str]:
        """`argv` run on node `host`: its network namespace, its host name, the cluster's hosts."""
        setup = 'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"'
        return [
            *self.hosts.enter(host),
            "unshare",
            "--mount",
            "--uts",
            "--propagation",
            "private",
            "sh",
            "-c",
            setup,
            str(self.dir / "hosts"),
            NODES[host],
            *argv,
        ]

    def run(
        self, argv: list[str], *, timeout: float, check: bool = True, cwd: str | None = None
    ) -> subprocess.CompletedProcess:
        """Runs a client command (``srun ...``, ``sbatch ...``) on node 0; waits for it."""
        done = subprocess.run(
            self.on(0, argv),
            env=self.env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)} ended with {done.returncode}:\n{done.stdout}\n{done.stderr}"
            )
        return done

    def sbatch(self, argv: list[str], *, timeout: float, cwd: str | None = None) -> tuple[int, str]:
        """Submits ``sbatch argv`` from node 0 and waits for the job; returns (exit code, state)."""
        return self.wait(self.submit(argv, cwd=cwd), timeout=timeout)

    def submit(self, argv: list[str], *, cwd: str | None = None) -> str:
        """Submits ``sbatch argv`` from node 0; returns the job id."""
        submitted = self.run(["sbatch", "--parsable", *argv], timeout=30, cwd=cwd)
        return submitted.stdout.strip().split(";")[0]

    def wait(self, job: str, *, timeout: float) -> tuple[int, str]:
        """Waits for `job` to end; returns (exit code, state).

        Polls ``scontrol show job`` twice a second: ``sbatch --wait`` polls at
        growing intervals and returned 30 s after a 10 s job.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            fields = self.job(job)
            if fields.get("JobState") not in (
                None,
                "PENDING",
                "CONFIGURING",
                "RUNNING",
                "COMPLETING",
            ):
                return int(fields["ExitCode"].split(":")[0]), fields["JobState"]
            time.sleep(0.5)
        raise TimeoutError(f"Slurm job {job} did not end in {timeout:g} s:\n{self.logs()}")

    def job(self, job: str) -> dict[str, str]:
        """``scontrol show job``'s fields of `job` (empty once Slurm forgot it)."""
        shown = self.run(["scontrol", "-o", "show", "job", job], timeout=30, check=False).stdout
        return dict(f.split("=", 1) for f in shown.split() if "=" in f)

    def logs(self) -> str:
        """The daemons' log tails, for a failure message."""
        text = []
        for path in sorted(self.dir.glob("*.log")) + sorted(self.dir.glob("*.out")):
            text.append(f"--- {path.name} ---\n{path.read_text()[-2000:]}")
        return "\n".join(text)

    def close(self) -> list[int]:
        """Stops the daemons, then every process left in the nodes' namespaces; returns those."""
        for daemon in self._daemons:
            if daemon.poll() is None:
                os.killpg(daemon.pid, signal.SIGTERM)
        for daemon in self._daemons:
            try:
                daemon.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait()
        self._daemons = []
        left = self.left_over()
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return left

    def left_over(self) -> list[int]:
        """Processes still running in the nodes' namespaces, other than their holders."""
        holders = {h.pid for h in self.hosts._holders}
        spaces = {_netns(pid) for pid in holders} - {None}
        mine = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) not in holders and _netns(int(entry)) in spaces:
                mine.append(int(entry))
        return mine


def _netns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None
