"""mirrorkit launch --max-restarts: a worker killed mid-training costs a restart, not the run.

Worker 1 SIGKILLs itself in the middle of epoch 2 of 4 on the first attempt;
the launcher stops worker 0, starts the whole job again on fresh ports, and the
job resumes from the chief's BackupAndRestore backup (end of epoch 1). Its
final weights must equal an uninterrupted 2-worker run's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from mirrorkit.faults.restart import run_with_restarts
from mirrorkit.launcher.processes import WorkerError

TESTS = str(Path(__file__).parent)

_SCRIPT = """
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    import keras
    import numpy as np
    from _training import GLOBAL_BATCH, make_data, make_model
    import mirrorkit as mk

    backup, out, kill = sys.argv[1], sys.argv[2], sys.argv[3] == "kill"
    attempt = int(os.environ.get("MIRRORKIT_RESTART", "0"))
    strategy = mk.strategy()
    rank = mk.describe(strategy).worker_index
    model = mk.build(lambda: make_model("sgd", 0.1), strategy)
    data = mk.distribute(make_data(), strategy, global_batch_size=GLOBAL_BATCH, shuffle=False)

    class Events(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch
            print(f"RAN epoch {{epoch + 1}} attempt {{attempt}} worker {{rank}}", flush=True)

        def on_train_batch_begin(self, batch, logs=None):
            if kill and attempt == 0 and rank == 1 and self.epoch == 1 and batch == 2:
                print("KILLING worker 1 in epoch 2", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

    model.fit(data, epochs=4, verbose=0,
              callbacks=[keras.callbacks.BackupAndRestore(backup), Events()])
    if mk.is_chief():
        np.save(out, np.concatenate([w.ravel() for w in model.get_weights()]))
"""


def _launch(tmp_path, name, *flags):
    script = tmp_path / "train_restart.py"
    script.write_text(textwrap.dedent(_SCRIPT.format(tests=TESTS)))
    out = tmp_path / f"{name}.npy"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    done = subprocess.run(
        [sys.executable, "-m", "mirrorkit", "launch", "-n", "2", "--no-pin", *flags[:-1]]
        + [str(script), str(tmp_path / f"backup-{name}"), str(out), flags[-1]],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    return done, out


@pytest.mark.slow
def test_killed_worker_restarts_the_job_which_ends_equal_to_an_uninterrupted_run(tmp_path):
    done, out = _launch(tmp_path, "restarted", "--max-restarts", "2", "kill")
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "KILLING worker 1 in epoch 2" in log
    assert re.search(r"restart 1 of 2: worker 1 failed with exit code -9", log), log[-4000:]
    assert "the job finished after 1 restart(s)" in log
    # resumed from the backup at the end of epoch 1: epoch 2 redone, epoch 1 not
    assert "RAN epoch 2 attempt 1 worker 0" in log and "RAN epoch 1 attempt 1" not in log
    reference, ref_out = _launch(tmp_path, "reference", "--max-restarts", "0", "nokill")
    assert reference.returncode == 0, (reference.stdout + reference.stderr)[-4000:]
    np.testing.assert_allclose(np.load(out), np.load(ref_out), rtol=0, atol=1e-6)


def _fails(times, exit_code=-9):
    calls = []

    def run_once(attempt):
        calls.append(attempt)
        if len(calls) <= times:
            raise WorkerError(1, exit_code)

    return run_once, calls


def test_restarts_until_the_job_finishes_saying_each_cause():
    said = []
    run_once, calls = _fails(2)
    assert run_with_restarts(run_once, 3, said.append) == 2
    assert calls == [0, 1, 2]
    assert said[0].startswith("restart 1 of 3: worker 1 failed with exit code -9")
    assert said[1].startswith("restart 2 of 3:")
    assert said[2] == "the job finished after 2 restart(s)"


def test_gives_up_after_max_restarts_with_the_last_failure():
    said = []
    run_once, calls = _fails(5, exit_code=3)
    with pytest.raises(WorkerError) as caught:
        run_with_restarts(run_once, 2, said.append)
    assert calls == [0, 1, 2] and caught.value.exit_code == 3
    assert "no restart left (--max-restarts 2)" in said[-1]


def test_no_restart_by_default():
    run_once, calls = _fails(1)
    with pytest.raises(WorkerError):
        run_with_restarts(run_once, 0, [].append)
    assert calls == [0]


def test_launch_refuses_negative_max_restarts(tmp_path):
    script = tmp_path / "never_run.py"
    script.write_text("raise SystemExit('a worker started')\n")
    done = subprocess.run(
        [sys.executable, "-m", "mirrorkit", "launch", "-n", "2", "--max-restarts", "-1"]
        + [str(script)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "--max-restarts -1 must be >= 0" in done.stderr
