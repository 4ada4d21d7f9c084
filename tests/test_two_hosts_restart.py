"""--max-restarts on two hosts whose link is cut: the job comes back with the link, or names it.

The hosts are the network namespaces of `_two_hosts` (or, without them, two
loopback addresses, host 1 frozen instead of cut off). Each host runs
``mirrorkit launch -n 1 --nnodes 2 --node-rank K --hosts ... --max-restarts N``
with Keras's own ``BackupAndRestore``; host 1's link goes down in epoch 2 of 4.

- The link comes back: each launcher restarts its worker on the same port;
  the restarted workers wait for each other at start-up (``startup_timeout_s``),
  meet once the link is back, resume from the chief's backup and end with the
  weights one device gives on the same global batch.
- The link stays down: each restarted worker ends at ``startup_timeout_s``
  naming the host it never reached, and with no restart left, so does its launcher.
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

#: Most of each test is a wait: for the link to come back, or for start-up timeouts on a
#: host that stays away (68 s of wall to 38 s of CPU in a full run).
pytestmark = pytest.mark.waits

TESTS = str(Path(__file__).parent)
ROOT = str(Path(__file__).parent.parent)
PORT = 29470

_SCRIPT = """
    import os, sys, time
    open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()
    sys.path.insert(0, {tests!r})
    import keras
    import numpy as np
    from _training import GLOBAL_BATCH, make_data, make_model
    import mirrorkit as mk

    backup, out, pause, startup = sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
    attempt = os.environ.get("MIRRORKIT_RESTART", "-")
    strategy = mk.strategy(timeout_s=30, startup_timeout_s=startup)
    rank = mk.describe(strategy).worker_index
    model = mk.build(lambda: make_model("sgd", 0.1), strategy)
    data = mk.distribute(make_data(), strategy, global_batch_size=GLOBAL_BATCH, shuffle=False)

    class Events(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch + 1
            print(f"RAN epoch {{self.epoch}} attempt {{attempt}} worker {{rank}}", flush=True)

        def on_train_batch_end(self, batch, logs=None):
            print(f"STEP epoch {{self.epoch}} batch {{batch}} worker {{rank}}", flush=True)
            time.sleep(pause)  # leaves the test time to cut the link mid-run

    model.fit(data, epochs=4, verbose=0,
              callbacks=[keras.callbacks.BackupAndRestore(backup), Events()])
    if mk.is_chief():
        np.save(out, np.concatenate([w.ravel() for w in model.get_weights()]))
"""


class _Job:
    """Both hosts' launchers (with --max-restarts), their logs and their workers' pids."""

    def __init__(self, hosts, tmp_path, addresses, max_restarts, startup_s, pause=0.5):
        self.launchers, self.logs, self.pid_dirs = [], [], []
        script = tmp_path / "train.py"
        script.write_text(textwrap.dedent(_SCRIPT.format(tests=TESTS)))
        self.out = tmp_path / "final.npy"
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        env.pop("TF_CONFIG", None)
        for rank in (0, 1):
            pids, log = tmp_path / f"pids-{rank}", tmp_path / f"host{rank}.log"
            pids.mkdir()
            command = [sys.executable, "-m", "mirrorkit", "launch", "-n", "1", "--no-pin"]
            command += ["--nnodes", "2", "--node-rank", str(rank), "--hosts", ",".join(addresses)]
            command += ["--max-restarts", str(max_restarts), str(script), str(pids)]
            command += [str(tmp_path / "backup"), str(self.out), str(pause), str(startup_s)]
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

    def log(self, rank):
        return self.logs[rank].read_text()

    def workers(self, rank):
        return [int(p.name) for p in self.pid_dirs[rank].iterdir()]

    def both_logs(self):
        return "\n".join(f"--- host {k} ---\n{self.log(k)[-5000:]}" for k in (0, 1))

    def wait_for(self, rank, text, timeout_s):
        deadline = time.monotonic() + timeout_s
        while text not in self.log(rank):
            if time.monotonic() > deadline or self.launchers[rank].poll() is not None:
                pytest.fail(f"no {text!r} from host {rank}:\n" + self.both_logs())
            time.sleep(0.2)

    def wait(self, rank, timeout_s):
        try:
            return self.launchers[rank].wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"host {rank} still running after {timeout_s:g} s:\n" + self.both_logs())

    def kill(self):
        """Ends every launcher and worker still running (thawed first, in case one is frozen)."""
        for rank in (0, 1):
            for pid in self.workers(rank) + [self.launchers[rank].pid]:
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        break
            self.launchers[rank].wait()


@pytest.fixture
def hosts():
    made = Hosts()
    yield made
    made.close()


@pytest.fixture
def job_box():
    box: list[_Job] = []
    yield box
    for job in box:
        job.kill()


def _addresses(hosts):
    if hosts.mode == "netns":
        return [f"{address}:{PORT}" for address in hosts.addresses]
    from mirrorkit.launcher.ports import free_ports

    return [f"{a}:{p}" for a, p in zip(hosts.addresses, free_ports(2), strict=True)]


@pytest.mark.multiprocess
def test_a_cut_link_restarts_the_job_which_resumes_once_the_link_is_back(hosts, job_box, tmp_path):
    addresses = _addresses(hosts)
    job = _Job(hosts, tmp_path, addresses, max_restarts=2, startup_s=300)
    job_box.append(job)
    (tmp_path / "ref-pids").mkdir()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    reference = subprocess.Popen(  # one device, alongside: the same global batches
        [sys.executable, str(tmp_path / "train.py"), str(tmp_path / "ref-pids")]
        + [str(tmp_path / "ref-backup"), str(tmp_path / "ref.npy"), "0", "60"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    job.wait_for(0, "STEP epoch 2 batch 1 worker 0", timeout_s=300)  # epoch 1 backed up
    hosts.cut(1, pids=[job.launchers[1].pid, *job.workers(1)])
    job.wait_for(0, "mirrorkit: restart 1 of 2: worker 0", timeout_s=120)
    if hosts.mode == "netns":  # host 1 finds out by itself, and restarts too, still cut off
        job.wait_for(1, "mirrorkit: restart 1 of 2: worker 1", timeout_s=150)
    hosts.restore(1)
    assert (job.wait(0, 400), job.wait(1, 120)) == (0, 0), job.both_logs()
    for rank in (0, 1):
        said = job.log(rank)
        assert "the job finished after 1 restart(s)" in said, job.both_logs()
        assert "Every worker on this host was stopped and starts again on the same port" in said
        assert "a script with keras.callbacks.BackupAndRestore resumes from its last backup" in said
    resumed = job.log(0)
    assert_quoted_in(quoted_block("failures.md", "Each launcher says so:"), resumed)
    assert "RAN epoch 2 attempt 1 worker 0" in resumed, job.both_logs()
    assert "RAN epoch 1 attempt 1" not in resumed  # from the backup at the end of epoch 1
    _, err = reference.communicate(timeout=300)
    assert reference.returncode == 0, err[-3000:]
    np.testing.assert_allclose(np.load(job.out), np.load(tmp_path / "ref.npy"), atol=1e-5)


@pytest.mark.multiprocess
def test_a_host_that_stays_away_ends_the_restarts_naming_it(hosts, job_box, tmp_path):
    if hosts.mode != "netns":
        pytest.skip(f"needs network namespaces to keep a host away ({hosts.why_loopback})")
    addresses = _addresses(hosts)
    job = _Job(hosts, tmp_path, addresses, max_restarts=1, startup_s=15)
    job_box.append(job)
    job.wait_for(0, "STEP epoch 2 batch 1 worker 0", timeout_s=300)
    hosts.cut(1)  # and never restored
    assert job.wait(0, 200) != 0, job.both_logs()
    said = job.log(0)
    assert "restart 1 of 1: worker 0" in said, job.both_logs()
    assert f"never came up: worker 1 ({addresses[1]})" in said, job.both_logs()
    assert "no restart left" in said, job.both_logs()
    assert job.wait(1, 200) != 0, job.both_logs()
    assert f"never came up: worker 0 ({addresses[0]})" in job.log(1), job.both_logs()
