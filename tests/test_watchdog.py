"""mk.callbacks.HangWatchdog: a training step that never completes ends the job, naming it.

A ``tf.py_function`` that sleeps for an hour stands in for a deadlocked input
pipeline or user code that never returns. Without the watchdog each of these
jobs hangs (checked once by hand: the single-host run was still in the step
after 120 s).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
from _quoted import assert_quoted_in, quoted_block

from mirrorkit.exit_statuses import STEP_HUNG, TIMED_OUT

pytestmark = pytest.mark.waits  # most of each test is the watchdog's timeout

HANG_S = 8

_STUCK_FIT = """
    import os, time
    import numpy as np
    import tensorflow as tf
    import keras
    import mirrorkit as mk

    STATE = {"stuck": False}

    def maybe_sleep(x):
        if STATE["stuck"]:
            time.sleep(3600)  # a step that never returns
        return x

    class Sleepy(keras.layers.Layer):
        def call(self, x):
            y = tf.py_function(maybe_sleep, [x], tf.float32)
            return x + 0.0 * tf.stop_gradient(tf.reshape(y, tf.shape(x)))

        def compute_output_shape(self, input_shape):
            return input_shape

    class StickAfter(keras.callbacks.Callback):
        def __init__(self, rank, stuck_rank, batch):
            super().__init__()
            self.stick = rank == stuck_rank
            self.batch = batch

        def on_train_batch_end(self, batch, logs=None):
            if self.stick and batch == self.batch:
                STATE["stuck"] = True

    def stuck_fit(hang_s, stuck_rank, stuck_after, cpu_replicas=None):
        strategy = mk.strategy(cpu_replicas=cpu_replicas) if cpu_replicas else mk.strategy()
        rank = mk.describe(strategy).worker_index

        def make():
            model = keras.Sequential([keras.Input((4,)), Sleepy(), keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse")
            return model

        model = mk.build(make, strategy)
        x = np.ones((64, 4), "float32")
        data = tf.data.Dataset.from_tensor_slices((x, x[:, :1]))
        data = mk.distribute(data, strategy, global_batch_size=8)
        watchdog = mk.callbacks.HangWatchdog(hang_s)  # hang_s None: from --hang-timeout
        model.fit(data, epochs=2, verbose=0,
                  callbacks=[StickAfter(rank, stuck_rank, stuck_after), watchdog])
        return "finished"
"""


def _write_module(tmp_path) -> str:
    (tmp_path / "stuck_job.py").write_text(textwrap.dedent(_STUCK_FIT))
    return str(tmp_path)


@pytest.mark.multiprocess
def test_single_host_mirrored_step_that_never_returns_ends_naming_the_step(tmp_path):
    where = _write_module(tmp_path)
    code = f"import sys; sys.path.insert(0, {where!r}); import stuck_job; "
    code += f"print(stuck_job.stuck_fit({HANG_S}, 0, 2, cpu_replicas=2))"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == STEP_HUNG != TIMED_OUT, (proc.returncode, err[-4000:])
    assert "finished" not in out
    assert "this process completed no training step for" in err, err[-4000:]
    assert "stuck in epoch 1, batch 3 (3 step(s) completed" in err, err[-4000:]
    assert f"this process ends with exit status {STEP_HUNG}" in err
    assert "maybe_sleep" in err  # faulthandler's stacks show where it sleeps
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)


@pytest.mark.multiprocess
def test_worker_stuck_in_a_step_ends_the_launched_job_naming_it(tmp_path):
    where = _write_module(tmp_path)
    script = tmp_path / "stuck_train.py"
    script.write_text(
        f"import sys\nsys.path.insert(0, {where!r})\nimport stuck_job\n"
        "print(stuck_job.stuck_fit(None, 1, 2))\n"  # HangWatchdog() reads --hang-timeout
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "mirrorkit", "launch", "-n", "2", "--hang-timeout", str(HANG_S)]
        + ["--no-pin", str(script)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    log = done.stdout + done.stderr
    assert done.returncode == STEP_HUNG, log[-4000:]  # the worker's status, not --timeout's
    assert "finished" not in done.stdout
    # every worker says it and dumps its stacks before any exits
    assert "worker 1 completed no training step for" in log, log[-4000:]
    assert "worker 0 completed no training step for" in log, log[-4000:]
    assert "stuck in epoch 1, batch 3 (3 step(s) completed" in log
    assert "maybe_sleep" in log  # the stuck worker's stacks
    assert f"its hang watchdog: no training step completed for {HANG_S:g} s" in log
    assert time.monotonic() - started < 600  # start-up and tracing on a loaded machine
    assert_quoted_in(quoted_block("failures.md", "every worker that has it prints"), log)
    assert_quoted_in(quoted_block("failures.md", "The launcher then ends with exit status 43"), log)
    leftover = subprocess.run(
        ["pgrep", "-f", str(script)], capture_output=True, text=True, check=False
    ).stdout.split()
    assert not leftover, leftover


def test_launch_refuses_a_bad_hang_timeout(tmp_path, mirrorkit_command, capfd):
    # `mirrorkit launch` in this process (capfd: a worker's output would reach the fds).
    script = tmp_path / "never_run.py"
    script.write_text("raise SystemExit('a worker started')\n")
    code = mirrorkit_command("launch", "-n", "2", "--hang-timeout", "0", str(script))
    out, err = capfd.readouterr()
    assert code == 2
    assert "--hang-timeout 0 is not a positive number of seconds" in err
    assert "a worker started" not in out + err


@pytest.mark.parametrize("bad", [0, -3, float("nan"), "10", True])
def test_bad_hang_timeout_is_a_clear_error(bad):
    import mirrorkit as mk

    with pytest.raises(ValueError, match="not a positive number of seconds"):
        mk.callbacks.HangWatchdog(bad)


def test_bad_hang_timeout_from_the_environment_names_the_variable(monkeypatch):
    import mirrorkit as mk

    monkeypatch.setenv("MIRRORKIT_HANG_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="MIRRORKIT_HANG_TIMEOUT='soon'"):
        mk.callbacks.HangWatchdog()


def test_watchdog_ends_a_stuck_process_and_spares_a_progressing_one():
    code = textwrap.dedent(
        """
        import sys, time
        from mirrorkit.faults.step_timeout import Watchdog
        dog = Watchdog(1.5, "worker 7", poll_s=0.1)
        dog.start()
        for step in range(6):           # progressing: 0.5 s a step, never 1.5 s
            dog.entering(step, f"step {step}")
            time.sleep(0.5)
            dog.completed()
        print("PROGRESSED", flush=True)
        dog.entering(6, "step 6")
        time.sleep(60)                  # stuck
        print("NOT REACHED", flush=True)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == STEP_HUNG, proc.stderr
    assert "PROGRESSED" in proc.stdout and "NOT REACHED" not in proc.stdout
    assert "worker 7 completed no training step for" in proc.stderr
    assert "stuck in step 6 (6 step(s) completed" in proc.stderr
    assert "time.sleep" in proc.stderr or "<string>" in proc.stderr  # the stacks


def test_c_backstop_fires_when_python_cannot_run():
    code = textwrap.dedent(
        """
        import signal, time
        from mirrorkit.faults import step_timeout
        step_timeout.BACKSTOP_S = 1.0
        dog = step_timeout.Watchdog(1.0, "worker 0", poll_s=3600)   # the Python thread never looks
        dog.start()
        time.sleep(60)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 1, proc.stderr
    assert "Timeout (0:00:02)!" in proc.stderr
