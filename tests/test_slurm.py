"""Slurm for real: a two-node cluster on this machine trains both ways, as one device does.

The module brings up Debian's ``slurmctld`` and two ``slurmd`` once (see
`_slurm`: each node a network namespace of its own, joined by a veth pair,
``auth/none``), and every test submits to it from node 0 as a user would:

- one task per worker: ``srun -N2 --ntasks-per-node=1 python train.py``,
  and the same through ``sbatch examples/slurm/train.sbatch``;
- one launcher per node: ``srun -N2 mirrorkit launch -n 1 train.py``;
- a worker that fails before training on the second node, with and without ``srun -K``;
- a batch script that runs Python outside ``srun``.

The training script is ``examples/slurm/train.py``; its final weights must
equal, within 1e-5, those of the same script run on one device in a process
of its own. Skipped only where Slurm is not installed (``apt-get install -y
slurmd slurmctld slurm-client``) or network namespaces cannot be made (not
root, no iproute2).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _quoted import assert_quoted_in, quoted_block
from _slurm import Cluster, missing
from _two_hosts import Hosts

ROOT = Path(__file__).resolve().parent.parent
TRAIN = str(ROOT / "examples" / "slurm" / "train.py")
SBATCH = str(ROOT / "examples" / "slurm" / "train.sbatch")
#: The page whose quoted outputs these jobs print.
PAGE = "clusters/slurm.md"
#: A training job's limit: 10 to 40 s each on a loaded 2-core machine.
JOB_TIMEOUT_S = 300
#: The example's default, 2 epochs of 16 steps: what docs/clusters/slurm.md quotes of the sbatch
#: job, and enough for the weights to tell a wrong job from a right one.
EPOCHS = ("--epochs", "2")

pytestmark = [pytest.mark.multiprocess, pytest.mark.waits]  # waits: the jobs run under slurmd


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = missing()
    if why:
        pytest.skip(why)
    hosts = Hosts()
    if hosts.mode != "netns":
        hosts.close()
        pytest.skip(f"two Slurm nodes need network namespaces here: {hosts.why_loopback}")
    made = Cluster(tmp_path_factory.mktemp("slurm"), hosts)
    made.env["PYTHON"] = sys.executable  # the interpreter train.sbatch runs (default: python)
    try:
        began = time.monotonic()
        made.start()
        print(f"\nSlurm up in {time.monotonic() - began:.1f} s")
        yield made
    finally:
        left = made.close()
        hosts.close()
    assert left == [], f"processes left running in the Slurm nodes: {left}"


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
    """The example's weights on one device, in a process of its own (started at once)."""
    out = tmp_path_factory.mktemp("one-device") / "weights.npy"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TF_CONFIG"))}
    proc = subprocess.Popen(
        [sys.executable, TRAIN, *EPOCHS, "--out", str(out)],
        env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def weights():
        said, _ = proc.communicate(timeout=JOB_TIMEOUT_S)
        assert proc.returncode == 0, said[-4000:]
        assert "OneDeviceStrategy, 1 replica on 1 worker (CPU:0)" in said, said[-4000:]
        return np.load(out)

    yield weights
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _run(cluster: Cluster, *argv: str) -> tuple[subprocess.CompletedProcess, str]:
    began = time.monotonic()
    done = cluster.run(list(argv), timeout=JOB_TIMEOUT_S, check=False, cwd=str(ROOT))
    print(f"{' '.join(argv[:4])} ...: {time.monotonic() - began:.1f} s")
    return done, done.stdout + done.stderr


def _same_as_one_device(weights: np.ndarray, one: np.ndarray) -> None:
    print(f"largest difference from one device: {np.abs(weights - one).max():.1e}")
    np.testing.assert_allclose(weights, one, rtol=0, atol=1e-5)


def _sbatch(cluster: Cluster, *argv: str) -> tuple[int, str]:
    began = time.monotonic()
    ended = cluster.sbatch(list(argv), timeout=JOB_TIMEOUT_S, cwd=str(ROOT))
    print(f"sbatch {argv[-1] if len(argv) < 4 else argv[1]} ...: {time.monotonic() - began:.1f} s")
    return ended


def test_srun_one_task_per_worker_trains_as_one_device(cluster, one_device, tmp_path):
    out = tmp_path / "weights.npy"
    done, said = _run(
        cluster,
        "srun",
        "-N2",
        "--ntasks-per-node=1",
        "--export=ALL,CUDA_VISIBLE_DEVICES=0",  # a GPU this CPU node does not have
        sys.executable,
        TRAIN,
        *EPOCHS,
        "--out",
        str(out),
    )
    assert done.returncode == 0, said[-6000:] + cluster.logs()
    # Each task is its own worker on its own node, on the CPU it has: no GPU described,
    # whatever CUDA_VISIBLE_DEVICES says.
    assert "worker 0 of 2 on mk-node0: CPU:0" in said, said[-6000:]
    assert "worker 1 of 2 on mk-node1: CPU:0" in said, said[-6000:]
    assert "MultiWorkerMirroredStrategy, 2 replicas on 2 workers (CPU:0 each)" in said
    _same_as_one_device(np.load(out), one_device())


def test_one_launcher_per_node_prefixes_global_ranks_and_trains_as_one_device(
    cluster, one_device, tmp_path
):
    out = tmp_path / "weights.npy"
    launch = [sys.executable, "-m", "mirrorkit", "launch", "-n", "1"]
    done, said = _run(cluster, "srun", "-N2", *launch, TRAIN, *EPOCHS, "--out", str(out))
    assert done.returncode == 0, said[-6000:] + cluster.logs()
    assert "[w0] worker 0 of 2 on mk-node0: CPU:0" in said, said[-6000:]
    assert "[w1] worker 1 of 2 on mk-node1: CPU:0" in said, said[-6000:]  # not [w0]
    assert "mirrorkit: workers 1-1 of 2 on this host" in said
    assert_quoted_in(quoted_block(PAGE, "the second node's launcher and worker print"), said)
    _same_as_one_device(np.load(out), one_device())


def test_the_sbatch_example_trains_as_one_device(cluster, one_device, tmp_path):
    out, log = tmp_path / "weights.npy", tmp_path / "job.out"
    exit_code, state = _sbatch(cluster, f"--output={log}", SBATCH, *EPOCHS, "--out", str(out))
    job = log.read_text() if log.exists() else "(no job output)"
    assert (exit_code, state) == (0, "COMPLETED"), job[-6000:] + cluster.logs()
    assert "worker 1 of 2 on mk-node1: CPU:0" in job, job[-6000:]
    assert_quoted_in(quoted_block(PAGE, "The chief (worker 0) prints the strategy"), job)
    _same_as_one_device(np.load(out), one_device())


_FAILS_ON_NODE_1 = """\
import os, sys
sys.path.insert(0, {examples!r})
if os.uname().nodename == "mk-node1":
    raise SystemExit("planted failure on mk-node1, before the strategy")
import train
train.main()
"""


@pytest.mark.parametrize("srun_k", [(), ("-K",)], ids=["without srun -K", "with srun -K"])
def test_a_worker_failing_on_one_node_ends_the_job_naming_it(cluster, tmp_path, srun_k):
    script = tmp_path / "fails_on_node_1.py"
    script.write_text(_FAILS_ON_NODE_1.format(examples=str(Path(TRAIN).parent)))
    launch = [sys.executable, "-m", "mirrorkit", "launch", "-n", "1"]
    began = time.monotonic()
    # Without srun -K, worker 0 would wait startup_timeout_s (600 s) for worker 1 unless the
    # failed launcher ends the step.
    done, said = _run(cluster, "srun", *srun_k, "-N2", *launch, str(script))
    took = time.monotonic() - began
    assert done.returncode != 0, said[-6000:]
    assert "[w1] planted failure on mk-node1, before the strategy" in said, said[-6000:]
    assert "mirrorkit: worker 1 failed with exit code 1" in said, said[-6000:]
    assert "mirrorkit: sent SIGTERM to Slurm step" in said, said[-6000:]
    assert "after worker 1 failed, so no other node waits for it" in said
    assert took < 150, f"the job took {took:.0f} s to end:\n{said[-6000:]}"
    assert_quoted_in(quoted_block(PAGE, "the failed worker's launcher says so"), said)


def test_a_batch_script_outside_srun_is_told_it_trains_alone(cluster, tmp_path):
    script, log = tmp_path / "outside.sbatch", tmp_path / "outside.out"
    script.write_text(f"#!/bin/sh\n{sys.executable} -m mirrorkit info\n")
    exit_code, _ = _sbatch(cluster, "-N2", "--ntasks-per-node=2", f"--output={log}", str(script))
    job = log.read_text()
    assert exit_code == 0, job[-4000:]
    assert "has 4 task(s) on 2 node(s), but this process is not a task of a job step" in job, job
    assert "`srun python SCRIPT`" in job
    assert_quoted_in(quoted_block(PAGE, "print, for a job of 4 tasks on 2 nodes"), job)


_TIME_LIMITED_TRAIN = """\
import argparse, os, sys
sys.path.insert(0, {examples!r})
import numpy as np
import mirrorkit as mk
import train  # examples/slurm/train.py: its data and model

parser = argparse.ArgumentParser()
parser.add_argument("--checkpoint-dir", required=True)
parser.add_argument("--out", default="weights.npy")
args = parser.parse_args()
strategy = mk.strategy()
model = mk.build(train.make_model, strategy)
data = mk.distribute(train.make_data(), strategy, global_batch_size=train.GLOBAL_BATCH, seed=0)
backup = os.path.join(os.path.dirname(args.checkpoint_dir), "backup")  # the page's step backup
model.fit(data, epochs={epochs}, verbose=2 if mk.is_chief() else 0,
          callbacks=[mk.resumable(backup, every=5),
                     mk.PreemptionCheckpoint(args.checkpoint_dir, data)])
if mk.is_chief():
    np.save(args.out, np.concatenate([w.ravel() for w in model.get_weights()]))
"""
_TIME_LIMITED_EPOCHS = 20  # as in the page's quote: "Epoch .../20"


def _time_limit_recipe(train: Path, sbatch: Path) -> str:
    """docs/clusters/slurm.md's time-limit batch script, running `train` with this Python."""
    page = (ROOT / "docs" / "clusters" / "slurm.md").read_text()
    section = page[page.index("## A job that hits its time limit") :]
    script = re.search(r"```bash\n(.*?)```", section, re.S)[1]
    for said, meant in [
        ("python train.py", f"{sys.executable} {train}"),
        ("sbatch train.sbatch", f"sbatch {sbatch}"),
    ]:
        assert said in script, f"the page's batch script no longer runs {said!r}"
        script = script.replace(said, meant)
    return script


def test_the_time_limit_recipe_saves_at_the_signal_and_the_next_job_resumes(cluster, tmp_path):
    """The page's batch script, with `scancel --signal=TERM` standing in for --signal=TERM@N.

    Both signal every task of the job's steps and not the batch script; the limit itself
    would make the test wait for it.
    """
    train = tmp_path / "train.py"
    train.write_text(
        _TIME_LIMITED_TRAIN.format(examples=str(Path(TRAIN).parent), epochs=_TIME_LIMITED_EPOCHS)
    )
    sbatch = tmp_path / "train.sbatch"
    sbatch.write_text(_time_limit_recipe(train, sbatch))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TF_CONFIG"))}
    one_device = subprocess.Popen(
        [sys.executable, str(train), "--checkpoint-dir", "alone", "--out", "alone.npy"],
        cwd=tmp_path,
        env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    first = cluster.submit([str(sbatch)], cwd=str(tmp_path))
    log = tmp_path / f"train-{first}.out"
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while "Epoch 4/" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, cluster.logs()
        assert cluster.job(first).get("JobState") in ("PENDING", "CONFIGURING", "RUNNING"), (
            log.read_text() if log.exists() else cluster.logs()
        )
        time.sleep(0.2)
    cluster.run(["scancel", "--signal=TERM", first], timeout=30)
    exit_code, state = cluster.wait(first, timeout=JOB_TIMEOUT_S)
    said = log.read_text()
    assert (exit_code, state) == (42, "FAILED"), said[-6000:] + cluster.logs()
    assert "checkpoint saved in runs/run1/preempt at epoch" in said, said[-6000:]
    assert "Submitted batch job" in said, said[-6000:]
    assert_quoted_in(quoted_block(PAGE, "job 1's output ends with"), said)
    second = said.rsplit("Submitted batch job", 1)[1].split()[0]
    assert cluster.wait(second, timeout=JOB_TIMEOUT_S) == (0, "COMPLETED"), cluster.logs()
    resumed = (tmp_path / f"train-{second}.out").read_text()
    assert "resuming from the preemption checkpoint at epoch" in resumed, resumed[-6000:]
    # the step backup beside it (every 5 steps) is older, or at the same step: not resumed
    assert "resuming from the backup" not in resumed, resumed[-6000:]
    assert_quoted_in(quoted_block(PAGE, "Job 2 resumes where job 1 saved"), resumed)
    alone, _ = one_device.communicate(timeout=JOB_TIMEOUT_S)
    assert one_device.returncode == 0, alone[-4000:]
    _same_as_one_device(np.load(tmp_path / "weights.npy"), np.load(tmp_path / "alone.npy"))
