"""`mirrorkit launch` and `mk.launch` with real workers."""

import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

import mirrorkit as mk
from mirrorkit.launcher.processes import WorkerError

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _launch(*args, timeout=240):
    return subprocess.run(
        [sys.executable, "-m", "mirrorkit", "launch", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def test_multiworker_quickstart_runs_under_launch():
    done = _launch("-n", "2", "examples/multiworker_quickstart.py")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sums = re.findall(r"\[w(\d)\] worker (\d): weight checksum (\S+)", done.stdout)
    assert sorted((w, i) for w, i, _ in sums) == [("0", "0"), ("1", "1")]
    assert sums[0][2] == sums[1][2]  # the same weights on both workers
    assert "[w0] final: loss" in done.stdout and "[w1] final" not in done.stdout


FAILING_SCRIPT = """
import os, sys
open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()
import keras, numpy as np
import mirrorkit as mk

class FailAtStep3(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if batch == 3 and mk.describe().worker_index == 1:
            raise RuntimeError("worker 1 breaks at step 3")

strategy = mk.strategy()
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
x = np.ones((4096, 4), "float32")
model.fit(x, x[:, :1], batch_size=8, epochs=50, verbose=0, callbacks=[FailAtStep3()])
"""


def test_a_failing_worker_stops_the_launch(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(textwrap.dedent(FAILING_SCRIPT))
    pids = tmp_path / "pids"
    pids.mkdir()
    start = time.monotonic()
    done = _launch("-n", "2", str(script), str(pids), timeout=120)
    elapsed = time.monotonic() - start
    assert done.returncode != 0
    assert elapsed < 30 + 15  # 30 s from the failure; the rest is two TensorFlow imports
    assert "RuntimeError: worker 1 breaks at step 3" in done.stdout
    assert "worker 1 failed with exit code 1" in done.stderr
    assert len(os.listdir(pids)) == 2
    for pid in os.listdir(pids):
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)


def _replicas_and_rank():
    import mirrorkit as mk

    strategy = mk.strategy()
    return strategy.num_replicas_in_sync, mk.describe().worker_index, mk.is_chief()


def test_mk_launch_returns_the_chiefs_value():
    assert mk.launch(_replicas_and_rank, num_workers=2, timeout_s=120) == (2, 0, True)


def _raise_on_worker_one():
    import mirrorkit as mk

    if not mk.is_chief():
        raise KeyError("missing on worker 1")
    import time

    time.sleep(60)


def test_mk_launch_raises_with_the_failing_workers_traceback():
    with pytest.raises(WorkerError) as err:
        mk.launch(_raise_on_worker_one, num_workers=2, timeout_s=60)
    assert err.value.worker == 1
    assert "KeyError: 'missing on worker 1'" in str(err.value)


def test_mk_launch_refuses_inside_a_worker(monkeypatch):
    monkeypatch.setenv(
        "TF_CONFIG",
        '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, '
        '"task": {"type": "worker", "index": 0}}',
    )
    with pytest.raises(RuntimeError, match="already worker 0 of a 2-worker job"):
        mk.launch(_replicas_and_rank, num_workers=2)


def test_launch_rejects_zero_workers():
    done = _launch("-n", "0", "examples/multiworker_quickstart.py", timeout=60)
    assert done.returncode == 2 and "-n must be at least 1" in done.stderr
