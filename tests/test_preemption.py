"""Preemption: SIGTERM to a running 2-worker job saves one checkpoint at a common step.

`mirrorkit launch` gets SIGTERM (a cloud VM being reclaimed, Slurm's signal
before the kill) in the middle of training; it sends SIGTERM to both workers,
whose `mk.PreemptionCheckpoint` (TensorFlow's own PreemptionCheckpointHandler
in a Keras callback) agree on the next step boundary, save there, and exit
with status 42, and so does the launcher. The next launch, on ONE worker (a
rescale: the checkpoint carries the step count and the global batch, not the
worker count), resumes at that epoch and step and ends with the weights of an
uninterrupted run (computed in the pytest process on 2 CPU replicas). The input
is shuffled with a drawn seed: the checkpoint carries the seed and the epoch,
so the resumed epochs see the orders of the uninterrupted run.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from _quoted import assert_quoted_in, quoted_block

TESTS = str(Path(__file__).parent)
#: The page whose quoted outputs these jobs print.
PAGE = "preemption.md"

_SCRIPT = """
    import os, signal, sys, time
    sys.path.insert(0, {tests!r})
    import keras
    import numpy as np
    from _training import GLOBAL_BATCH, make_data, make_model
    import mirrorkit as mk

    ckpt, out, slow, late = sys.argv[1], sys.argv[2], sys.argv[3] == "slow", sys.argv[3] == "late"
    strategy = mk.strategy()
    rank = mk.describe(strategy).worker_index
    model = mk.build(lambda: make_model("sgd", 0.1), strategy)
    data = mk.distribute(make_data(), strategy, global_batch_size=GLOBAL_BATCH)  # shuffled

    class Events(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch
            print(f"RAN epoch {{epoch + 1}} worker {{rank}}", flush=True)

        def on_train_batch_begin(self, batch, logs=None):
            if late and rank == 1 and (self.epoch, batch) == (3, 3):  # fit's last step
                print("SIGTERM to worker 1 before fit's last step", flush=True)
                os.kill(os.getpid(), signal.SIGTERM)

        def on_train_batch_end(self, batch, logs=None):
            if slow:
                time.sleep(0.3)  # time for the test's SIGTERM to land mid-epoch

    model.fit(data, epochs=4, verbose=0, callbacks=[mk.PreemptionCheckpoint(ckpt, data), Events()])
    if mk.is_chief():
        np.save(out, np.concatenate([w.ravel() for w in model.get_weights()]))
"""


def _command(tmp_path, workers, slow, mode=None):
    script = tmp_path / "train_preempt.py"
    script.write_text(textwrap.dedent(_SCRIPT.format(tests=TESTS)))
    return [sys.executable, "-m", "mirrorkit", "launch", "-n", str(workers), "--no-pin"] + [
        str(script),
        str(tmp_path / "preempt"),
        str(tmp_path / "final.npy"),
        mode or ("slow" if slow else "fast"),
    ]


def _env():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    return env


def _uninterrupted(seed, checkpoint_dir):
    """The same training, never preempted: the same callback, the first launch's seed."""
    import mirrorkit as mk
    from tests._training import GLOBAL_BATCH, make_data, make_model

    strategy = mk.strategy(cpu_replicas=2)
    model = mk.build(lambda: make_model("sgd", 0.1), strategy)
    data = mk.distribute(make_data(), strategy, global_batch_size=GLOBAL_BATCH, seed=seed)
    model.fit(data, epochs=4, verbose=0, callbacks=[mk.PreemptionCheckpoint(checkpoint_dir, data)])
    return np.concatenate([w.ravel() for w in model.get_weights()])


@pytest.mark.multiprocess
def test_sigterm_saves_at_one_step_and_the_next_launch_on_one_worker_resumes(tmp_path):
    job = subprocess.Popen(
        _command(tmp_path, 2, slow=True),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
    )
    lines, deadline = [], time.monotonic() + 600
    for line in job.stdout:
        lines.append(line)
        if "RAN epoch 2 worker 0" in line:
            time.sleep(0.5)  # into epoch 2
            job.send_signal(signal.SIGTERM)
            break
        assert time.monotonic() < deadline, "".join(lines)
    lines += job.stdout.readlines()
    job.wait(timeout=120)
    log = "".join(lines)
    assert job.returncode == 42, log[-4000:]
    saved = re.findall(
        r"\[w(\d)\] mirrorkit: preempted \(SIGTERM\): checkpoint saved in \S+ "
        r"at epoch (\d) step (\d); exiting with status 42",
        log,
    )
    assert len(saved) == 1, log[-4000:]  # said once, by the chief
    epoch, step = saved[0][1:]
    seed = int(re.search(r"shuffling with seed (\d+)", log).group(1))
    assert "SIGTERM: sent to 2 worker(s); waiting up to 30 s" in log
    assert re.search(r"worker \d was preempted \(SIGTERM\): every worker saved", log), log[-4000:]
    assert "RAN epoch 4" not in log, "the SIGTERM came too late to test anything"
    # worker 1 wrote its own copy in TensorFlow's workertemp_1 beside the checkpoint: removed
    assert sorted(p.name for p in tmp_path.glob("workertemp_*")) == [], log[-4000:]
    assert_quoted_in(quoted_block(PAGE, "What you see"), log)
    assert_quoted_in(quoted_block(PAGE, "A SIGTERM to the launcher first gives:"), log)

    resumed = subprocess.run(
        _command(tmp_path, 1, slow=False), capture_output=True, text=True, timeout=600, env=_env()
    )
    log = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, log[-4000:]
    assert f"resuming from the preemption checkpoint at epoch {epoch} step {step}" in log, log
    assert f"RAN epoch {int(epoch) - 1} worker" not in log or epoch == "1"
    assert f"resuming with the checkpoint's shuffle seed {seed}" in log, log[-4000:]
    assert_quoted_in(quoted_block(PAGE, "It resumes at that epoch *and step*"), log)
    assert_quoted_in(quoted_block(PAGE, "(`seed=None`) is replayed too:"), log)
    reference = _uninterrupted(seed, str(tmp_path / "reference"))
    np.testing.assert_allclose(np.load(tmp_path / "final.npy"), reference, atol=1e-5)


@pytest.mark.multiprocess
def test_sigterm_before_fits_last_step_completes_the_job_and_says_so(tmp_path):
    """No step boundary is left to agree on: fit completes on both workers; the chief says so."""
    done = subprocess.run(
        _command(tmp_path, 2, slow=False, mode="late"),
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "SIGTERM to worker 1 before fit's last step" in log
    said = re.findall(
        r"\[w(\d)\] mirrorkit: SIGTERM reached worker 1 in the last steps of fit", log
    )
    assert said == ["0"], log[-4000:]  # once, by the chief
    assert "fit completed instead, so there is nothing to resume" in log
    assert_quoted_in(quoted_block(PAGE, "The chief says:"), log)
    assert not (tmp_path / "preempt").exists()
    assert sorted(p.name for p in tmp_path.glob("workertemp_*")) == []  # worker 1's, removed
    seed = int(re.search(r"shuffling with seed (\d+)", log).group(1))
    reference = _uninterrupted(seed, str(tmp_path / "reference"))
    np.testing.assert_allclose(np.load(tmp_path / "final.npy"), reference, rtol=0, atol=1e-6)


_DEAF_SCRIPT = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as TensorFlow's own notifier does, unasked
open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()
time.sleep(120)
"""


@pytest.mark.multiprocess
def test_a_second_sigterm_stops_workers_that_ignore_the_first(tmp_path):
    """Workers that swallow SIGTERM (no mk.PreemptionCheckpoint) are stopped at a second one.

    The grace period (30 s) is not waited for: a second SIGTERM ends it, as the page says.
    The workers are plain Python, not TensorFlow, so the launch takes seconds.
    """
    from mirrorkit.exit_statuses import TERMINATED

    script = tmp_path / "deaf.py"
    script.write_text(_DEAF_SCRIPT)
    started = tmp_path / "started"
    started.mkdir()
    job = subprocess.Popen(
        [sys.executable, "-m", "mirrorkit", "launch", "-n", "2", "--no-pin", str(script)]
        + [str(started)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
    )
    try:
        deadline = time.monotonic() + 60
        while len(os.listdir(started)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(os.listdir(started)) == 2, "the workers did not start"
        job.send_signal(signal.SIGTERM)
        time.sleep(1)  # the first is forwarded; the workers ignore it
        assert job.poll() is None
        job.send_signal(signal.SIGTERM)
        log, _ = job.communicate(timeout=30)
    finally:
        job.kill()
    assert job.returncode == TERMINATED, log
    assert "SIGTERM: sent to 2 worker(s)" in log
    assert_quoted_in(quoted_block(PAGE, "SIGTERM comes, it stops every worker"), log)
    for pid in os.listdir(started):  # every worker was stopped
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)
