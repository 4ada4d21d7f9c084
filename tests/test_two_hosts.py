"""Two hosts for real: a job over two network namespaces loses one host's link mid-run.

Each "host" is a network namespace of the test's own, joined to the other by a
veth pair on a private subnet (10.200.0.1 and 10.200.0.2/24; see
`_two_hosts`). Each host runs ``mirrorkit launch -n 1 --nnodes 2 --node-rank
K --hosts 10.200.0.1,10.200.0.2``, as two machines would. In the middle of
epoch 2 of 4 host 1's link goes down (no RST: packets are lost). Host 0's
worker must end with an error within the collective timeout, its launcher's
last line naming the host it lost; host 1 ends too; no worker process is
left. With the link back, the same two commands resume from the chief's
``keras.callbacks.BackupAndRestore`` backup (end of epoch 1) and finish with
the weights one device gives on the same global batch.

Where namespaces cannot be made (not root, no iproute2), the hosts are
127.0.0.1 and 127.0.0.2 in this machine's network and there is no link to cut:
host 1's launcher and worker are frozen with SIGSTOP instead (the same silence
for host 0, no connection reset), and thawed after host 0 has ended.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from _quoted import assert_quoted_in, quoted_block
from _two_hosts import Hosts

TESTS = str(Path(__file__).parent)
ROOT = str(Path(__file__).parent.parent)
#: `mk.strategy(timeout_s=...)` in the workers: the bound on a collective's wait.
COLLECTIVE_TIMEOUT_S = 30
#: Time a worker and its launcher take to exit after the error (TensorFlow's teardown:
#: 6 s with TF 2.21, up to 40 s with TF 2.17, on a loaded 2-core machine).
EXIT_GRACE_S = 60
#: The port of each host's worker in the namespaces (each has its own ports).
PORT = 29470

_SCRIPT = """
    import os, sys, time
    open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()
    sys.path.insert(0, {tests!r})
    import keras
    import numpy as np
    from _training import GLOBAL_BATCH, make_data, make_model
    import mirrorkit as mk

    backup, out, pause = sys.argv[2], sys.argv[3], float(sys.argv[4])
    strategy = mk.strategy(timeout_s={timeout})
    rank = mk.describe(strategy).worker_index
    model = mk.build(lambda: make_model("sgd", 0.1), strategy)
    data = mk.distribute(make_data(), strategy, global_batch_size=GLOBAL_BATCH, shuffle=False)

    class Events(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch + 1
            print(f"RAN epoch {{self.epoch}} worker {{rank}}", flush=True)

        def on_train_batch_end(self, batch, logs=None):
            print(f"STEP epoch {{self.epoch}} batch {{batch}} worker {{rank}}", flush=True)
            time.sleep(pause)  # leaves the test time to cut the link mid-run

    model.fit(data, epochs=4, verbose=0,
              callbacks=[keras.callbacks.BackupAndRestore(backup), Events()])
    if mk.is_chief():
        np.save(out, np.concatenate([w.ravel() for w in model.get_weights()]))
"""


class _Job:
    """Both hosts' launchers of one run, their logs and their workers' pids."""

    def __init__(self, hosts: Hosts, tmp_path: Path, name: str, addresses: list[str], pause: float):
        self.hosts, self.launchers, self.logs, self.pid_dirs = hosts, [], [], []
        script = tmp_path / "train_two_hosts.py"
        text = _SCRIPT.format(tests=TESTS, timeout=COLLECTIVE_TIMEOUT_S)
        script.write_text(textwrap.dedent(text))
        self.out = tmp_path / f"{name}.npy"
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        env.pop("TF_CONFIG", None)
        for rank in (0, 1):
            pids = tmp_path / f"{name}-pids-{rank}"
            pids.mkdir()
            log = tmp_path / f"{name}-host{rank}.log"
            command = [
                sys.executable,
                "-m",
                "mirrorkit",
                "launch",
                "-n",
                "1",
                "--no-pin",
                "--nnodes",
                "2",
                "--node-rank",
                str(rank),
                "--hosts",
                ",".join(addresses),
                str(script),
                str(pids),
                str(tmp_path / "backup"),
                str(self.out),
                str(pause),
            ]
            with open(log, "w") as f:
                self.launchers.append(
                    subprocess.Popen(
                        hosts.enter(rank) + command,
                        cwd=ROOT,
                        env=env,
                        stdout=f,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
            self.logs.append(log)
            self.pid_dirs.append(pids)

    def log(self, rank: int) -> str:
        return self.logs[rank].read_text()

    def workers(self, rank: int) -> list[int]:
        return [int(p.name) for p in self.pid_dirs[rank].iterdir()]

    def wait_for(self, rank: int, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.log(rank):
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.launchers):
                pytest.fail(f"no {text!r} from host {rank}:\n" + self.both_logs())
            time.sleep(0.1)

    def raised(self, rank: int, timeout_s: float) -> float:
        """Waits until host `rank`'s worker prints a traceback; returns when (monotonic)."""
        deadline = time.monotonic() + timeout_s
        while "Traceback (most recent call last)" not in self.log(rank):
            if time.monotonic() > deadline:
                pytest.fail(f"host {rank} raised nothing in {timeout_s:g} s:\n" + self.both_logs())
            time.sleep(0.1)
        return time.monotonic()

    def wait(self, rank: int, timeout_s: float) -> int:
        try:
            return self.launchers[rank].wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"host {rank} still running after {timeout_s:g} s:\n" + self.both_logs())

    def both_logs(self) -> str:
        return "\n".join(f"--- host {k} ---\n{self.log(k)[-4000:]}" for k in (0, 1))

    def kill(self) -> None:
        """Ends every launcher and worker still running (thawed first, in case one is frozen)."""
        pids = [pid for rank in (0, 1) for pid in self.workers(rank)]
        for launcher in self.launchers:
            if launcher.poll() is None:
                pids.append(launcher.pid)
        for pid in pids:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    break
        for launcher in self.launchers:
            launcher.wait()


def _running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie (a container's init may never reap one)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def hosts():
    made = Hosts()
    yield made
    made.close()


@pytest.fixture
def jobs():
    started: list[_Job] = []
    yield started
    for job in started:
        job.kill()


@pytest.fixture
def references():
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.multiprocess
def test_a_cut_link_ends_the_other_host_with_a_clear_error_and_a_relaunch_resumes(
    hosts, jobs, references, tmp_path
):
    if hosts.mode == "netns":
        addresses = [f"{address}:{PORT}" for address in hosts.addresses]
    else:
        from mirrorkit.launcher.ports import free_ports

        ports = free_ports(2)
        addresses = [f"{a}:{p}" for a, p in zip(hosts.addresses, ports, strict=True)]
    began = time.monotonic()
    first = _Job(hosts, tmp_path, "first", addresses, pause=0.5)
    jobs.append(first)
    reference = _reference(tmp_path)  # alongside: mostly idle waits here
    references.append(reference)
    first.wait_for(0, "STEP epoch 2 batch 1 worker 0", timeout_s=300)  # epoch 1 backed up

    hosts.cut(1, pids=[first.launchers[1].pid, *first.workers(1)])
    cut = time.monotonic()
    if hosts.mode == "netns":
        assert not hosts.reachable(0, 1), "the link is still up"
    raised = first.raised(0, COLLECTIVE_TIMEOUT_S) - cut  # the error, within the timeout
    exit_0 = first.wait(0, EXIT_GRACE_S)
    took = time.monotonic() - cut
    said = first.log(0)
    assert exit_0 == 1, first.both_logs()
    assert "RAN epoch 4" not in said  # it ended in the middle, not at the end
    assert (
        f"mirrorkit: worker 0 failed with exit code 1; the other workers on this host were "
        f"stopped; it lost contact with worker 1 at {addresses[1]} (--node-rank 1): that worker "
        "stopped answering" in said
    ), first.both_logs()
    assert_quoted_in(quoted_block("failures.md", "On the host that kept its link:"), said)
    why = f" ({hosts.why_loopback})" if hosts.why_loopback else ""
    print(f"\n{hosts.mode}{why}: cut {cut - began:.0f} s in; host 0 raised {raised:.1f} s later")
    print(f"host 0's launcher ended {took:.1f} s after the cut")

    if hosts.mode == "loopback":
        hosts.restore(1)  # thawed, host 1 finds host 0 gone
    exit_1 = first.wait(1, COLLECTIVE_TIMEOUT_S + EXIT_GRACE_S)
    print(f"host 1 ended {time.monotonic() - cut:.1f} s after the cut")
    assert exit_1 != 0, first.both_logs()
    if hosts.mode == "netns":
        assert f"it lost contact with worker 0 at {addresses[0]} (--node-rank 0)" in first.log(1)
    left = [pid for rank in (0, 1) for pid in first.workers(rank) if _running(pid)]
    assert left == [] and len(first.workers(0)) == len(first.workers(1)) == 1

    hosts.restore(1)
    relaunched = time.monotonic()
    again = _Job(hosts, tmp_path, "again", addresses, pause=0)
    jobs.append(again)
    assert (again.wait(0, 300), again.wait(1, 60)) == (0, 0), again.both_logs()
    print(f"the relaunch finished in {time.monotonic() - relaunched:.0f} s")
    resumed = again.log(0)
    assert "RAN epoch 2 worker 0" in resumed and "RAN epoch 1 worker" not in resumed, resumed

    reference_out, reference_err = reference.communicate(timeout=300)
    assert reference.returncode == 0, reference_err[-3000:]
    np.testing.assert_allclose(np.load(again.out), np.load(tmp_path / "ref.npy"), atol=1e-5)


def _reference(tmp_path: Path) -> subprocess.Popen:
    """The same script on one device, no TF_CONFIG: the same global batch and data order."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    (tmp_path / "ref-pids").mkdir()
    script, backup, out = (
        str(tmp_path / n) for n in ("train_two_hosts.py", "ref-backup", "ref.npy")
    )
    return subprocess.Popen(
        [sys.executable, script, str(tmp_path / "ref-pids"), backup, out, "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


# Worker output of TF 2.21 when a peer's link was cut (from the test above):
# worker 0 runs the coordination service and names the task whose heartbeats
# stopped; worker 1's own heartbeat to worker 0 times out.
_WORKER_0_SAID = """\
tensorflow.python.framework.errors_impl.UnavailableError: Graph execution error:
Collective ops is aborted by: Error reported from /job:worker/task:1: The following tasks are \
unhealthy (stopped sending heartbeats):
/job:worker/replica:0/task:1
The tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. \
preemption, eviction) to debug further.
"""
_WORKER_1_SAID = """\
tensorflow.python.framework.errors_impl.DeadlineExceededError: Graph execution error:
Collective ops is aborted by: Deadline Exceeded

RPC: /tensorflow.CoordinationService/Heartbeat
"""
# The same in TF 2.17 (the oldest tested): worker 0, then worker 1.
_WORKER_0_SAID_217 = """\
UNAVAILABLE: Error reported from /job:worker/task:1: Task /job:worker/replica:0/task:1 heartbeat \
timeout. This indicates that the remote task has failed, got preempted, or crashed unexpectedly.
"""
_WORKER_1_SAID_217 = """\
DEADLINE_EXCEEDED: Deadline Exceeded
Additional GRPC error information from remote target /job:worker/replica:0/task:0 while calling \
/tensorflow.CoordinationService/Heartbeat:
"""
# A peer whose server is gone (here: worker 0, after host 1 was thawed).
_REFUSED_SAID = """\
UnavailableError: failed to connect to all addresses; last error: UNKNOWN: ipv4:10.0.0.9:2222: \
Failed to connect to remote host: Connection refused
"""
_HEALTH_CHECK_SAID = (
    "Cluster check alive failed, /job:worker/replica:0/task:3 is down, aborting collectives"
)


@pytest.mark.parametrize(
    "output, lost",
    [
        (_WORKER_0_SAID, [1]),
        (_WORKER_1_SAID, [0]),
        (_WORKER_0_SAID_217, [1]),
        (_WORKER_1_SAID_217, [0]),
        (_HEALTH_CHECK_SAID.lower(), [3]),
        (_REFUSED_SAID, [2]),
        (_REFUSED_SAID + "from remote target /job:worker/replica:0/task:0 while calling", [0, 2]),
        ("ValueError: a bug in the training script", []),
    ],
)
def test_lost_peers_are_read_from_what_tensorflow_printed(output, lost):
    from mirrorkit.launcher.hosts import lost_peers

    addresses = ["10.0.0.7:2222", "10.0.0.7:2223", "10.0.0.9:2222", "10.0.0.9:2223"]
    assert lost_peers(output, addresses) == lost


def test_the_launcher_note_names_the_lost_host_only_in_a_multi_host_job():
    from mirrorkit.launcher.hosts import Layout, lost_peer_note, multi_host

    job = multi_host(["gpu-a", "gpu-b:4000"], 0, 2)
    note = lost_peer_note(_WORKER_0_SAID.replace("task:1", "task:3"), job)
    assert note.startswith("; it lost contact with worker 3 at gpu-b:4001 (--node-rank 1): ")
    assert "or the network between the hosts failed" in note
    assert lost_peer_note("ValueError: a bug", job) == ""
    local = Layout(("127.0.0.1:1", "127.0.0.1:2"), 0, 2, False)
    assert lost_peer_note(_WORKER_0_SAID, local) == ""
