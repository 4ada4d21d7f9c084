"""Bad inputs that used to get an unclear error (issue 13): each now names what was wrong.

Every test here failed before its fix; the comment above each says how.
"""

from __future__ import annotations

import argparse
import sys
import threading

import numpy as np
import pytest

import mirrorkit as mk
from mirrorkit import notices
from mirrorkit.commands import launch
from mirrorkit.launcher import processes
from mirrorkit.throughput.callback import find_straggler


def _launch_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    launch.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_gpu_only_all_reduce_without_gpus_is_an_error_not_one_device():
    # Before: a warning, and a OneDeviceStrategy came back. all_reduce="nccl" is the errors
    # table's row strategy-nccl-no-gpu (tests/test_errors_table.py).
    with pytest.raises(ValueError, match="needs GPUs"):
        mk.strategy(all_reduce="hierarchical_copy")


@pytest.mark.parametrize(
    ("kwargs", "unit", "other"),
    [({"bucket_mb": -1}, "megabytes", "seconds"), ({"timeout_s": 0}, "seconds", "MB")],
)
def test_bucket_and_timeout_name_their_own_unit(kwargs, unit, other):
    # Before: both said "a positive number of seconds or MB".
    with pytest.raises(ValueError) as caught:
        mk.strategy(cpu_replicas=2, **kwargs)
    message = str(caught.value)
    assert f"{next(iter(kwargs))} must be a positive number of {unit}" in message
    assert other not in message


@pytest.mark.parametrize(
    "argv",
    [
        ("--port", "65535", "-n", "2", "train.py"),  # the second worker would be 65536
        ("--port", "0", "train.py"),
    ],
)
def test_launch_rejects_a_port_out_of_range(argv):
    # Before: accepted; ignored on one host, a worker's TF_CONFIG error with --hosts.
    # --port 70000 alone and with --hosts are the errors table's rows launch-port-range and
    # launch-port-hosts (tests/test_errors_table.py).
    with pytest.raises(ValueError, match=r"--port \d+: .* TCP ports go from 1 to 65535"):
        launch.layout(_launch_args(*argv), env={})


def test_launch_rejects_a_host_port_out_of_range():
    with pytest.raises(ValueError, match=r"host 'b': 2 worker\(s\) would listen on ports 70000"):
        launch.layout(_launch_args("--hosts", "a,b:70000", "--node-rank", "0", "x.py"), env={})


def test_launch_says_port_is_unused_on_one_host(capsys):
    # Before: silently ignored.
    launch.layout(_launch_args("--port", "30000", "train.py"), env={})
    assert "--port 30000 is for multi-host jobs" in capsys.readouterr().err


def test_launch_checks_the_script_exists_before_starting_workers(tmp_path, capsys, monkeypatch):
    # Before: every worker started and failed with python's "can't open file".
    started = []
    monkeypatch.setattr(processes, "run_commands", lambda *a, **k: started.append(a))
    missing = str(tmp_path / "missing.py")
    code = launch.run(_launch_args("--no-pin", "--shared-network", missing))
    assert code == 2
    assert started == []
    err = capsys.readouterr().err
    assert f"script {missing!r} does not exist" in err and "no worker was started" in err


def test_launch_timeout_names_the_workers_still_running(capfd):
    # Before: "workers did not finish within 3 s; all were stopped".
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    quick = [sys.executable, "-c", "pass"]
    with pytest.raises(TimeoutError) as caught:
        processes.run_commands([sleeper, quick], timeout_s=4)
    message = str(caught.value)
    assert "worker(s) 0 of 2 were (worker(s) 1 had finished) still running" in message
    # Both still running, said as `mirrorkit launch --timeout` says it.
    from _quoted import assert_quoted_in, quoted_block

    from mirrorkit.launcher import local_job

    with pytest.raises(TimeoutError) as caught:
        processes.run_commands([sleeper, sleeper], timeout_s=1)
    capfd.readouterr()
    local_job.say(str(caught.value))
    quote = quoted_block("multi-worker.md", "`--timeout` names the workers that were still")
    assert_quoted_in(quote, capfd.readouterr().err)


def _lock_returner():
    """A function returning a lock, defined in a function so that cloudpickle sends it by value.

    Sent by reference, the worker would import this module, and with it TensorFlow.
    """

    def returns_a_lock():
        return threading.Lock()

    return returns_a_lock


def test_launch_says_when_the_return_value_cannot_be_sent_back():
    # Before: "worker 0 failed with exit code 1" and a bare cloudpickle traceback.
    with pytest.raises(processes.WorkerError) as caught:
        mk.launch(_lock_returner(), num_workers=1, pin_cpus=False, private_network=False)
    message = str(caught.value)
    assert "its return value (a lock) could not be sent back" in message
    assert "Return plain values instead" in message


def test_throughput_baseline_file_broken_names_baseline(tmp_path, monkeypatch):
    # Before: a bare json.JSONDecodeError. A missing file is the errors table's row
    # throughput-baseline-missing (tests/test_errors_table.py).
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"baseline='broken.json'\) is not a JSON file"):
        mk.ThroughputCallback(baseline="broken.json")


def test_distribute_says_no_seed_before_an_error(monkeypatch, capsys):
    # Before: "shuffling with seed ..." was printed, then the error about the same call.
    monkeypatch.setattr(notices, "_said", set())
    strategy = mk.strategy(cpu_replicas=2)
    x, y = np.ones((3, 2), "float32"), np.ones((3, 1), "float32")
    with pytest.raises(ValueError, match="fewer than one global batch"):
        mk.distribute((x, y), strategy, global_batch_size=8)
    assert "shuffling with seed" not in capsys.readouterr().err
    mk.distribute((x, y), strategy, global_batch_size=2)
    assert "shuffling with seed" in capsys.readouterr().err  # still said when it is used


def test_tfds_not_prepared_with_data_dir_does_not_suggest_data_dir(tmp_path):
    # Before: "... or pass data_dir=" although data_dir was passed.
    from _tfds_builder import TinyImages  # noqa: F401 - registers tiny_images

    with pytest.raises(FileNotFoundError) as caught:
        mk.distribute(
            "tiny_images",
            mk.strategy(cpu_replicas=2),
            global_batch_size=8,
            split="train",
            data_dir=str(tmp_path),
        )
    message = str(caught.value)
    assert f"is not prepared in data_dir={str(tmp_path)!r}" in message
    assert "pass data_dir=" not in message


def test_straggler_is_flagged_only_above_the_factor_as_shown():
    # Before: 1.2003 was flagged while the summary showed "spread 1.20x".
    assert find_straggler([1.2003, 1.0], 1.2) is None
    assert find_straggler([1.0, 1.2049], 1.2) is None
    assert find_straggler([1.0, 1.25], 1.2) == 1
    assert find_straggler([0.10, 0.11, 0.30], 1.2) == 2


def test_launch_notices_are_said_once_per_process(monkeypatch, capsys):
    # Before: printed on every launch (docs/multi-worker.md says "each said once").
    from mirrorkit.launcher import local_job

    monkeypatch.setattr(notices, "_said", set())
    local_job.plan_cpus(2, True)
    first = capsys.readouterr().err
    local_job.plan_cpus(2, True)
    assert first.startswith("mirrorkit: ") and capsys.readouterr().err == ""
    local_job.plan_cpus(2, False)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "make",
    [
        lambda d: d.batch(8).concatenate(d.batch(8)),
        lambda d: d.batch(8).rebatch(4),
        lambda d: tf_data().Dataset.zip(
            (d.map(lambda x, y: x).batch(8), d.map(lambda x, y: y).batch(8))
        ),
    ],
    ids=["concatenate", "rebatch", "zip"],
)
def test_batched_data_behind_zip_concatenate_rebatch_is_not_batched_twice(make, capsys):
    # Before: mk.distribute batched the batches: each replica got (8, 8, 1) for (8, 1), and a
    # Dense model trained on it without an error.
    tf = tf_data()
    x = np.arange(256, dtype="float32").reshape(256, 1)
    data = make(tf.Dataset.from_tensor_slices((x, 2 * x)))
    strategy = mk.strategy(cpu_replicas=2)
    distributed = mk.distribute(data, strategy, global_batch_size=16, shuffle=False)
    features, _ = next(iter(distributed))
    shapes = [tuple(t.shape) for t in strategy.experimental_local_results(features)]
    assert shapes == [(8, 1), (8, 1)]


def test_data_that_may_be_batches_is_said(monkeypatch, capsys):
    # A pipeline that hides how it was made (flat_map) and yields batch-shaped elements.
    monkeypatch.setattr(notices, "_said", set())
    tf = tf_data()
    batches = tf.Dataset.range(64).batch(8).flat_map(lambda b: tf.Dataset.from_tensors(b))
    mk.distribute(batches, mk.strategy(cpu_replicas=2), global_batch_size=4, shuffle=False)
    assert "cannot tell whether data is already batched" in capsys.readouterr().err
    mk.distribute(tf.Dataset.range(64), mk.strategy(cpu_replicas=2), global_batch_size=4)
    assert "cannot tell" not in capsys.readouterr().err


def tf_data():
    import tensorflow as tf

    return tf.data
