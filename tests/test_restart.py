"""mirrorkit launch --max-restarts: a worker killed mid-training costs a restart, not the run.

Three real 2-worker jobs under `mirrorkit launch`, each training with
`mk.resumable(dir)` (Keras's own BackupAndRestore, set up by mirrorkit):

- worker 1 SIGKILLs itself in the middle of epoch 2 of 4;
- the same with Keras's own ``keras.callbacks.BackupAndRestore(dir)`` (the
  pattern of TensorFlow's "Multi-worker training with Keras" tutorial) and a
  shuffled input (``seed=0``), killed in epoch 3: the resumed epochs see the
  orders of the uninterrupted run;
- the chief (the one worker that writes the backup) is SIGKILLed at three
  points of its backup's write, one per attempt (a torn step backup's weights:
  tests/test_step_backup.py).

Each time the launcher stops the other worker, says where the job failed,
where it resumes and the steps redone, starts the job again, and the job ends
with the weights of an uninterrupted run (computed here, in the pytest
process, on 2 logical CPU replicas: the same global batches, the same sums).
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from _launching import launch
from _quoted import assert_quoted_in, quoted_block

from mirrorkit.faults import resume_point
from mirrorkit.faults.restart import Failure, exit_cause, run_with_restarts
from mirrorkit.launcher.processes import WorkerError

_SCRIPT = """
    import os, shutil, signal, sys
    sys.path.insert(0, {tests!r})
    import keras
    import numpy as np
    from _training import GLOBAL_BATCH, make_data, make_model
    import mirrorkit as mk

    backup, out, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    attempt = int(os.environ.get("MIRRORKIT_RESTART", "0"))
    strategy = mk.strategy()
    rank = mk.describe(strategy).worker_index
    model = mk.build(lambda: make_model("sgd", 0.1), strategy)
    tutorial = mode == "tutorial"  # Keras's own BackupAndRestore, shuffled input
    shuffle = dict(seed=0) if tutorial else dict(shuffle=False)
    data = mk.distribute(make_data(), strategy, global_batch_size=GLOBAL_BATCH, **shuffle)
    backups = [keras.callbacks.BackupAndRestore(backup) if tutorial else mk.resumable(backup)]
    first = attempt == 0

    if mode == "pair" and rank == 0 and attempt < 3:
        # the chief dies at its 2nd backup of each of the first three attempts, each time at
        # another point of the write: between the weights and the epoch; while keeping the
        # previous pair (its weights copied, not its epoch); the epoch written, not renamed
        from mirrorkit import backup_files

        point, saves = ("between", "previous", "metadata")[attempt], []

        def die(where):
            print(f"KILLING the chief {{where}} (attempt {{attempt}})", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

        save, keep = model.save_weights, backup_files.keep_previous
        write = backup_files.write_metadata

        def save_weights(filepath, *args, **kwargs):
            saves.append(filepath)
            save(filepath, *args, **kwargs)
            if point == "between" and len(saves) == 2:
                die("between the weights and the epoch")

        def keep_previous(weights, metadata):
            if point == "previous" and len(saves) == 1:  # the 2nd save keeps the 1st pair
                shutil.copyfile(weights, weights + ".bkp")
                die("while keeping the previous pair")
            keep(weights, metadata)

        def write_metadata(metadata, record):
            if point == "metadata" and len(saves) == 2:
                with open(metadata + ".tmp", "w") as f:
                    f.write(str(record))
                die("before the epoch's file is renamed into place")
            write(metadata, record)

        model.save_weights = save_weights
        backup_files.keep_previous, backup_files.write_metadata = keep_previous, write_metadata

    class Events(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch
            print(f"RAN epoch {{epoch + 1}} attempt {{attempt}} worker {{rank}}", flush=True)

        def on_train_batch_begin(self, batch, logs=None):
            kill_in = {{"kill": 1, "tutorial": 2}}.get(mode)
            if first and rank == 1 and self.epoch == kill_in and batch == 2:
                print(f"KILLING worker 1 in epoch {{kill_in + 1}}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

    model.fit(data, epochs=4, verbose=0, callbacks=backups + [Events()])
    if mk.is_chief():
        np.save(out, np.concatenate([w.ravel() for w in model.get_weights()]))
"""


def _launch(tmp_path, mode, *flags):
    return launch(tmp_path, _SCRIPT, mode, *flags)


def _reference(shuffle):
    """The uninterrupted run's weights, on 2 CPU replicas in this process."""
    import mirrorkit as mk
    from tests._training import GLOBAL_BATCH, make_data, make_model

    strategy = mk.strategy(cpu_replicas=2)
    model = mk.build(lambda: make_model("sgd", 0.1), strategy)
    order = dict(seed=0) if shuffle else dict(shuffle=False)
    data = mk.distribute(make_data(), strategy, global_batch_size=GLOBAL_BATCH, **order)
    model.fit(data, epochs=4, verbose=0)
    return np.concatenate([w.ravel() for w in model.get_weights()])


@pytest.fixture(scope="module")
def uninterrupted():
    """The uninterrupted run's weights (input in order), on 2 CPU replicas in this process."""
    return _reference(shuffle=False)


@pytest.mark.multiprocess
def test_killed_worker_restarts_the_job_which_ends_equal_to_an_uninterrupted_run(
    tmp_path, uninterrupted
):
    done, out = _launch(tmp_path, "kill", "--max-restarts", "2")
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "KILLING worker 1 in epoch 2" in log
    said = (
        "restart 1 of 2: worker 1 killed by SIGKILL at epoch 2 step 2; resuming from the backup "
        "at epoch 2 step 0: 2 step(s) redone"
    )
    assert said in log, log[-4000:]
    assert "the job finished after 1 restart(s)" in log
    assert_quoted_in(quoted_block("resume.md", "starts the whole job again on fresh ports:"), log)
    # resumed from the backup at the end of epoch 1: epoch 2 redone, epoch 1 not
    assert "RAN epoch 2 attempt 1 worker 0" in log and "RAN epoch 1 attempt 1" not in log
    np.testing.assert_allclose(np.load(out), uninterrupted, rtol=0, atol=1e-6)


@pytest.mark.multiprocess
def test_the_tutorials_keras_backup_resumes_a_shuffled_input_in_its_uninterrupted_orders(
    tmp_path,
):
    """TensorFlow's multi-worker tutorial: keras.callbacks.BackupAndRestore, not mk.resumable."""
    done, out = _launch(tmp_path, "tutorial", "--max-restarts", "2")
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "KILLING worker 1 in epoch 3" in log
    assert "the job finished after 1 restart(s)" in log, log[-4000:]
    # resumed from Keras's backup at the end of epoch 2: epoch 3 redone, epoch 2 not
    assert "RAN epoch 3 attempt 1 worker 0" in log and "RAN epoch 2 attempt 1" not in log
    np.testing.assert_allclose(np.load(out), _reference(shuffle=True), rtol=0, atol=1e-6)


@pytest.mark.multiprocess
def test_chief_killed_at_each_point_of_its_backup_write_resumes_from_a_whole_pair(
    tmp_path, uninterrupted
):
    """mk.resumable writes weights and epoch as one pair: no kill leaves new weights, old epoch."""
    done, out = _launch(tmp_path, "pair", "--max-restarts", "3")
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "KILLING the chief between the weights and the epoch (attempt 0)" in log
    np.testing.assert_allclose(np.load(out), uninterrupted, rtol=0, atol=1e-6)
    for where in (
        "between the weights and the epoch (attempt 0)",
        "while keeping the previous pair (attempt 1)",
        "before the epoch's file is renamed into place (attempt 2)",
    ):
        assert f"KILLING the chief {where}" in log, log[-4000:]
    assert "the job finished after 3 restart(s)" in log, log[-4000:]
    # each resumes from the last whole pair: epoch 2 after the 1st kill (the latest pair cut
    # short), epoch 3 after the 2nd (the latest pair whole), epoch 4 after the 3rd (cut short)
    for attempt, epoch in ((1, 2), (2, 3), (3, 4)):
        assert f"RAN epoch {epoch} attempt {attempt} worker 0" in log, log[-4000:]
        assert f"RAN epoch {epoch - 1} attempt {attempt}" not in log, log[-4000:]
    said = "was cut short (its weights and epoch do not match): resuming from the previous one"
    assert said in log, log[-4000:]
    assert_quoted_in(quoted_block("resume.md", "the last whole backup and says so"), log)


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
    assert (
        "where it resumes is not known here (no mk.resumable progress record): a script "
        "with keras.callbacks.BackupAndRestore resumes from its last backup" in said[0]
    )
    assert said[0].endswith(
        "Every worker was stopped and the whole job starts again on fresh ports"
    )
    assert said[1].startswith("restart 2 of 3:")
    assert said[2] == "the job finished after 2 restart(s)"


def test_gives_up_after_max_restarts_with_the_last_failure():
    said = []
    run_once, calls = _fails(5, exit_code=3)
    with pytest.raises(WorkerError) as caught:
        run_with_restarts(run_once, 2, said.append)
    assert calls == [0, 1, 2] and caught.value.exit_code == 3
    assert "no restart left: it failed 3 times (the step is unknown)" in said[-1]
    assert "(--max-restarts 2 counts the restarts at each failing step)" in said[-1]


def test_max_restarts_counts_per_failing_step():
    """Failures at new steps each get N restarts; N failures at one step end the job."""
    at = resume_point.Position
    places = [at(1, 2), at(1, 2), at(3, 0), at(3, 0), at(3, 0)]
    said = []
    run_once, calls = _fails(len(places))
    with pytest.raises(WorkerError):
        run_with_restarts(
            run_once,
            2,
            said.append,
            failure=lambda attempt: Failure(places[attempt], at(1, 0), 4),
        )
    assert calls == [0, 1, 2, 3, 4]  # 2 restarts at epoch 2 step 2, then 2 at epoch 4 step 0
    assert said[0].startswith("restart 1 of 2: worker 1 failed with exit code -9 at epoch 2 step 2")
    assert "resuming from the backup at epoch 2 step 0: 2 step(s) redone" in said[0]
    assert said[2].startswith("restart 1 of 2:") and "at epoch 4 step 0" in said[2]
    assert "8 step(s) redone" in said[2]
    assert "no restart left: it failed 3 times there" in said[-1]


def test_the_last_failure_at_one_step_is_said_by_the_launcher(monkeypatch, capfd):
    """`mirrorkit launch --max-restarts 1`: worker 0 fails twice at epoch 2 step 4."""
    from mirrorkit import notices
    from mirrorkit.launcher import local_job

    monkeypatch.setattr(notices, "_said", set())
    at = resume_point.Position
    attempts = []

    def worker_0_fails(attempt):
        attempts.append(attempt)
        raise WorkerError(0, 1)

    capfd.readouterr()
    with pytest.raises(WorkerError):
        run_with_restarts(
            worker_0_fails,
            1,
            local_job.say,
            failure=lambda attempt: Failure(at(1, 4), at(1, 0), 4),
        )
    assert attempts == [0, 1]
    said = capfd.readouterr().err
    assert_quoted_in(quoted_block("resume.md", "It says so, and the launcher exits"), said)


def test_failure_reads_the_chiefs_progress_and_the_keras_backup(tmp_path):
    backup = tmp_path / "backup"
    backup.mkdir()
    (backup / "training_metadata.json").write_text('{"epoch": 2, "batch": 0}')
    record = str(tmp_path / "progress.json")
    resume_point.Recorder(record, str(backup), 5).at(2, 3)
    failure = Failure.read(record)
    assert failure.where() == " at epoch 3 step 3"
    assert failure.resuming() == "resuming from the backup at epoch 3 step 0: 3 step(s) redone"
    assert Failure.read(str(tmp_path / "none.json")) == Failure()
    assert exit_cause(-9) == "killed by SIGKILL" and exit_cause(1) == "failed with exit code 1"


def test_no_restart_by_default():
    run_once, calls = _fails(1)
    with pytest.raises(WorkerError):
        run_with_restarts(run_once, 0, [].append)
    assert calls == [0]


def test_resumable_is_keras_own_backup_set_up_for_restarts(tmp_path):
    import keras

    import mirrorkit as mk

    callback = mk.resumable(str(tmp_path / "b"))
    assert type(callback) is keras.callbacks.BackupAndRestore
    assert callback.save_freq == "epoch" and callback.double_checkpoint
    with pytest.raises(ValueError, match=re.escape("mk.resumable(backup_dir='')")):
        mk.resumable("")


def test_backup_pair_without_a_keras_backup_internal_is_named(tmp_path):
    import keras

    from mirrorkit.faults import backup_pair
    from mirrorkit.internals import InternalChangedError

    callback = keras.callbacks.BackupAndRestore(str(tmp_path / "b"))
    del callback._training_metadata_path
    with pytest.raises(InternalChangedError, match="BackupAndRestore._training_metadata_path"):
        backup_pair.make_atomic(callback)


def test_backup_files_chooses_the_latest_whole_pair(tmp_path, monkeypatch, capfd):
    import h5py

    from mirrorkit import backup_files, notices

    weights, metadata = str(tmp_path / "latest.weights.h5"), str(tmp_path / "m.json")
    assert backup_files.choose(weights, metadata) == (weights, metadata)  # nothing: fresh
    with h5py.File(weights, "w") as f:  # an HDF5 file, as Keras writes weights
        f["epoch"] = 2
    backup_files.write_metadata(
        metadata, {"epoch": 2, "weights_sha256": backup_files.digest(weights)}
    )
    assert backup_files.check(weights, metadata) == "whole"
    backup_files.keep_previous(weights, metadata)
    with h5py.File(weights, "w") as f:  # killed before its epoch
        f["epoch"] = 3
    assert backup_files.check(weights, metadata) == "cut short"
    assert backup_files.choose(weights, metadata) == (f"{weights}.bkp", f"{metadata}.bkp")
    (tmp_path / "m.json").write_text('{"epoch": 3')  # a torn file (plain Keras wrote in place)
    assert backup_files.check(weights, metadata) == "cut short"
    (tmp_path / "m.json").write_text('{"epoch": 3}')  # plain Keras's: no digest, trusted
    assert backup_files.check(weights, metadata) == "trusted"
    (tmp_path / "latest.weights.h5").write_bytes(b"not HDF5")  # ... if h5py can read its weights
    assert backup_files.check(weights, metadata) == "damaged"
    # the only backup cut short: no previous one to resume from, so training starts over
    os.remove(f"{weights}.bkp")
    os.remove(f"{metadata}.bkp")
    (tmp_path / "m.json").write_text('{"epoch": 3')
    monkeypatch.setattr(notices, "_said", set())
    capfd.readouterr()
    absent = str(tmp_path / ".mirrorkit-no-backup")
    assert backup_files.choose(weights, metadata) == (absent, absent)
    said = capfd.readouterr().err
    assert_quoted_in(quoted_block("resume.md", "If there is no previous backup"), said)
