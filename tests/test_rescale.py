"""Rescale by restart: a job preempted on 4 replicas resumes on 2 with the same result.

The preemption checkpoint (`mk.PreemptionCheckpoint`) carries the step count,
the global batch and the shuffle seed, not the replica count, and
`mk.distribute` cuts the same global batches whatever the replica count, in a
shuffled order drawn from (seed, epoch), so a shuffled run SIGTERMed in the
middle of epoch 2 on 4 CPU replicas and resumed on 2 ends where an
uninterrupted run ends. Runs in the pytest process (4 logical CPUs):
TensorFlow's own `PreemptionCheckpointHandler` catches the SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal

import keras
import numpy as np
import pytest
from _quoted import assert_quoted_in, quoted_block

import mirrorkit as mk
from mirrorkit import distributed_data
from mirrorkit.exit_statuses import PREEMPTED
from tests._training import GLOBAL_BATCH, make_data, make_model

EPOCHS = 3


class _TermAt(keras.callbacks.Callback):
    """Sends this process SIGTERM at the start of (epoch, batch): a cloud VM being reclaimed."""

    def __init__(self, epoch, batch):
        super().__init__()
        self.at, self.epoch = (epoch, batch), None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            os.kill(os.getpid(), signal.SIGTERM)


def _train(replicas, callbacks, global_batch=GLOBAL_BATCH, shuffle=False, seed=None, seen=None):
    strategy = mk.strategy(cpu_replicas=replicas)
    model = mk.build(lambda: make_model("sgd", 0.1), strategy)
    data = mk.distribute(
        make_data(), strategy, global_batch_size=global_batch, shuffle=shuffle, seed=seed
    )
    if seen is not None:
        seen.append(data)
    model.fit(data, epochs=EPOCHS, verbose=0, callbacks=[c(data) for c in callbacks])
    return np.concatenate([w.ravel() for w in model.get_weights()])


class _FailAt(_TermAt):
    """Raises at the start of (epoch, batch): a crash the next run resumes from the backup."""

    def on_train_batch_begin(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            raise RuntimeError("failed here on purpose")


@pytest.fixture
def sigterm_handler_restored():
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


@pytest.mark.slow
def test_preempted_on_4_replicas_resumes_on_2_equal_to_uninterrupted(
    tmp_path, capsys, sigterm_handler_restored
):
    ckpt = str(tmp_path / "preempt")
    with pytest.raises(SystemExit) as stopped:
        _train(4, [lambda d: mk.PreemptionCheckpoint(ckpt, d), lambda d: _TermAt(1, 1)])
    assert stopped.value.code == PREEMPTED
    out = capsys.readouterr().out
    # SIGTERM before batch 1: TF agrees on the boundary after the next step (batch 3)
    assert "preempted (SIGTERM): checkpoint saved" in out and "at epoch 2 step 3" in out, out
    resumed = _train(2, [lambda d: mk.PreemptionCheckpoint(ckpt, d)])
    out = capsys.readouterr().out
    assert "resuming from the preemption checkpoint at epoch 2 step 3" in out, out
    assert "2 replicas" in out
    assert not os.path.exists(ckpt), "a completed fit deletes its preemption checkpoint"
    reference = _train(2, [])
    np.testing.assert_allclose(resumed, reference, rtol=0, atol=1e-5)
    assert np.abs(resumed - _train(2, [], global_batch=16)).max() > 1e-3  # a different run differs


@pytest.mark.slow
def test_shuffled_run_preempted_on_4_replicas_resumes_on_2_in_its_orders(
    tmp_path, capsys, sigterm_handler_restored
):
    ckpt, seen = str(tmp_path / "preempt"), []
    with pytest.raises(SystemExit) as stopped:  # seed=None: drawn, and carried in the checkpoint
        _train(
            4,
            [lambda d: mk.PreemptionCheckpoint(ckpt, d), lambda d: _TermAt(1, 1)],
            shuffle=True,
            seen=seen,
        )
    assert stopped.value.code == PREEMPTED
    seed = int(distributed_data.record(seen[0]).epoch_order.seed.numpy())
    capsys.readouterr()
    resumed = _train(2, [lambda d: mk.PreemptionCheckpoint(ckpt, d)], shuffle=True, seed=seed + 1)
    said = capsys.readouterr()
    assert "resuming from the preemption checkpoint at epoch 2 step 3" in said.out, said
    assert f"resuming with the checkpoint's shuffle seed {seed} (this run's was {seed + 1})" in (
        said.err + said.out
    )
    # the uninterrupted run: the same script, the same callback, never preempted
    other = str(tmp_path / "other")
    reference = _train(2, [lambda d: mk.PreemptionCheckpoint(other, d)], shuffle=True, seed=seed)
    np.testing.assert_allclose(resumed, reference, rtol=0, atol=1e-5)
    in_order = _train(2, [lambda d: mk.PreemptionCheckpoint(other, d)], shuffle=False)
    assert np.abs(resumed - in_order).max() > 1e-3  # the shuffled orders changed the result


@pytest.mark.slow
def test_a_different_global_batch_on_resume_is_refused_unless_asked(
    tmp_path, capsys, sigterm_handler_restored
):
    ckpt = str(tmp_path / "preempt")
    with pytest.raises(SystemExit):
        _train(2, [lambda d: mk.PreemptionCheckpoint(ckpt, d), lambda d: _TermAt(0, 1)])
    with pytest.raises(ValueError, match="saved with global batch 32, and this run's is 16") as e:
        _train(2, [lambda d: mk.PreemptionCheckpoint(ckpt, d)], global_batch=16)
    refused = quoted_block("preemption.md", "Resuming with another global batch changes")
    assert_quoted_in(refused, f"{e.type.__name__}: {e.value}")  # a traceback's last line
    _train(2, [lambda d: mk.PreemptionCheckpoint(ckpt, d, new_global_batch=True)], global_batch=16)
    said = capsys.readouterr()
    assert "resuming a checkpoint of global batch 32 with global batch 16" in said.err + said.out
    quote = quoted_block("preemption.md", "the epoch continues after the examples it had already")
    assert_quoted_in(quote, said.err + said.out)


@pytest.mark.slow
def test_shuffled_run_with_resumable_resumes_from_its_backup_in_its_orders(tmp_path):
    backup = str(tmp_path / "backup")
    with pytest.raises(RuntimeError, match="on purpose"):  # in epoch 3, after 2 epoch backups
        _train(4, [lambda d: mk.resumable(backup), lambda d: _FailAt(2, 1)], shuffle=True, seed=3)
    # _FailAt(0, 0) raises unless this run resumes from the backup (at epoch 3)
    resumed = _train(
        2, [lambda d: mk.resumable(backup), lambda d: _FailAt(0, 0)], shuffle=True, seed=3
    )
    # the uninterrupted run: the same script, the same callback, never failed
    reference = _train(2, [lambda d: mk.resumable(str(tmp_path / "other"))], shuffle=True, seed=3)
    np.testing.assert_allclose(resumed, reference, rtol=0, atol=1e-5)
    in_order = _train(2, [lambda d: mk.resumable(str(tmp_path / "third"))], shuffle=False)
    assert np.abs(resumed - in_order).max() > 1e-3  # the shuffled orders changed the result


def test_a_shuffled_stream_says_on_resume_that_its_orders_are_not_replayed(
    tmp_path, monkeypatch, capfd
):
    import tensorflow as tf

    from mirrorkit import notices
    from mirrorkit.pipeline import epoch_order

    monkeypatch.setattr(notices, "_said", set())
    strategy = mk.strategy(cpu_replicas=2)
    arrays = mk.distribute(make_data(), strategy, global_batch_size=GLOBAL_BATCH, seed=1)
    stream = tf.data.Dataset.from_tensor_slices(make_data())
    stream = mk.distribute(stream, strategy, global_batch_size=GLOBAL_BATCH, seed=1)
    assert (
        distributed_data.record(arrays).epoch_order is not None
        and distributed_data.record(stream).epoch_order is None
    )
    capfd.readouterr()
    epoch_order.say_if_not_replayed(arrays)
    assert "resuming a shuffled streamed input" not in capfd.readouterr().err
    epoch_order.say_if_not_replayed(stream)
    said = capfd.readouterr().err
    assert "resuming a shuffled streamed input" in said
    assert_quoted_in(quoted_block("resume.md", "A shuffled stream keeps TensorFlow's buffer"), said)
    assert_quoted_in(quoted_block("preemption.md", "The resume says so:"), said)
    # A fit that begins past epoch 0 with a drawn seed, the stream alive: the two notices
    monkeypatch.setattr(notices, "_said", set())
    drawn = mk.distribute(make_data(), strategy, global_batch_size=GLOBAL_BATCH)
    model = mk.build(lambda: make_model("sgd", 0.1), strategy)
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"), save_freq=3)
    model.fit(drawn, epochs=2, initial_epoch=1, verbose=0, callbacks=[backup])
    said = capfd.readouterr().err
    assert_quoted_in(quoted_block("compat.md", "the chief prints a notice when the resumed"), said)


@pytest.mark.slow
def test_resumable_says_a_drawn_seed_is_not_in_its_backup(tmp_path, monkeypatch, capfd):
    from mirrorkit import notices

    monkeypatch.setattr(notices, "_said", set())
    backup = str(tmp_path / "backup")
    with pytest.raises(RuntimeError, match="on purpose"):
        _train(2, [lambda d: mk.resumable(backup), lambda d: _FailAt(1, 0)], shuffle=True)
    capfd.readouterr()
    _train(2, [lambda d: mk.resumable(backup), lambda d: _FailAt(0, 0)], shuffle=True)
    said = capfd.readouterr().err
    assert "resuming a shuffled input whose seed was drawn (seed=None)" in said, said
    assert "pass seed= to mk.distribute" in said
    assert_quoted_in(quoted_block("resume.md", "With a drawn seed you see:"), said)


class _OrdersRead(keras.callbacks.Callback):
    """Records (epoch, the epoch its order is drawn for) as each epoch begins.

    mirrorkit sets the order's epoch at each epoch's beginning, before the callbacks; an
    iterator per epoch reads it then, fit's one iterator where the fit begins (whether each
    epoch trained on that order is what the weights compared with a reference show).
    """

    def __init__(self, data, read):
        super().__init__()
        self.data, self.read = data, read

    def on_epoch_begin(self, epoch, logs=None):
        self.read.append((epoch, int(distributed_data.record(self.data).epoch_order.epoch.numpy())))


@pytest.mark.slow
def test_keras_own_backup_and_initial_epoch_resume_a_shuffled_input_in_its_orders(
    tmp_path, monkeypatch, capfd
):
    from mirrorkit import notices

    monkeypatch.setattr(notices, "_said", set())
    reference = _train(2, [], shuffle=True, seed=3)
    # fit(initial_epoch=1) in a new model, on a new dataset (a new process would do the same)
    strategy = mk.strategy(cpu_replicas=2)
    first = mk.build(lambda: make_model("sgd", 0.1), strategy)
    first.fit(
        mk.distribute(make_data(), strategy, global_batch_size=GLOBAL_BATCH, seed=3), verbose=0
    )
    later = mk.build(lambda: make_model("sgd", 0.1), strategy)
    later.set_weights(first.get_weights())
    data = mk.distribute(make_data(), strategy, global_batch_size=GLOBAL_BATCH, seed=3)
    later.fit(data, epochs=EPOCHS, initial_epoch=1, verbose=0)
    weights = np.concatenate([w.ravel() for w in later.get_weights()])
    np.testing.assert_allclose(weights, reference, rtol=0, atol=1e-6)
    # Keras's own BackupAndRestore backing up every 3 steps: the resumed epoch reads its own
    # order and begins at the backed-up step (tests/test_step_backup.py: every input kind)
    backup, read = str(tmp_path / "steps"), []
    with pytest.raises(RuntimeError, match="on purpose"):
        _train(
            2,
            [
                lambda d: keras.callbacks.BackupAndRestore(backup, save_freq=3),
                lambda d: _FailAt(1, 3),
            ],
            shuffle=True,
            seed=3,
        )
    capfd.readouterr()
    resumed = _train(
        2,
        [
            lambda d: keras.callbacks.BackupAndRestore(backup, save_freq=3),
            lambda d: _FailAt(0, 0),  # raises unless this run resumes past epoch 1
            lambda d: _OrdersRead(d, read),
        ],
        shuffle=True,
        seed=3,
    )
    assert read == [(1, 1), (2, 2)], read
    said = capfd.readouterr()
    assert f"resuming from the backup in {backup} at epoch 2 step 2" in said.out, said
    np.testing.assert_allclose(resumed, reference, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_sigterm_at_an_epochs_last_step_resumes_and_at_fits_last_step_completes_saying_so(
    tmp_path, capsys, sigterm_handler_restored
):
    reference = _train(2, [])
    # before the last step of epoch 1: the boundary agreed on is in epoch 2, and resumes there
    ckpt = str(tmp_path / "epoch-end")
    with pytest.raises(SystemExit) as stopped:
        _train(2, [lambda d: mk.PreemptionCheckpoint(ckpt, d), lambda d: _TermAt(0, 3)])
    assert stopped.value.code == PREEMPTED
    resumed = _train(2, [lambda d: mk.PreemptionCheckpoint(ckpt, d)])
    said = capsys.readouterr()
    assert "resuming from the preemption checkpoint at epoch 2 step" in said.out, said
    np.testing.assert_allclose(resumed, reference, rtol=0, atol=1e-6)
    # before the last step of fit: no boundary is left; fit completes and says so
    ckpt = str(tmp_path / "fit-end")
    completed = _train(2, [lambda d: mk.PreemptionCheckpoint(ckpt, d), lambda d: _TermAt(2, 3)])
    said = capsys.readouterr()
    assert "SIGTERM reached this process in the last steps of fit" in said.err + said.out, said
    assert "fit completed instead, so there is nothing to resume" in said.err + said.out
    assert not os.path.exists(ckpt)
    np.testing.assert_allclose(completed, reference, rtol=0, atol=1e-6)


class _BackupEpochs(keras.callbacks.Callback):
    """Records the epoch each step backup in `backup` says, after Keras wrote it."""

    def __init__(self, backup, said):
        super().__init__()
        self.path, self.said = os.path.join(backup, "training_metadata.json"), said

    def on_train_batch_end(self, batch, logs=None):
        with open(self.path) as f:
            self.said.append(json.load(f)["epoch"])


@pytest.mark.slow
def test_keras_step_backups_in_a_resumed_epoch_record_that_epoch(tmp_path):
    """Keras 3.15.1 wrote epoch 0 there: a second failure would resume at epoch 1."""
    backup, said = str(tmp_path / "steps"), []
    with pytest.raises(RuntimeError, match="on purpose"):
        _train(
            2,
            [
                lambda d: keras.callbacks.BackupAndRestore(backup, save_freq=1),
                lambda d: _FailAt(1, 1),
            ],
        )
    with pytest.raises(RuntimeError, match="on purpose"):  # fails again, in the resumed epoch
        _train(  # resumed at epoch 2 step 1: backs up after its steps 2 and 3, then fails
            2,
            [
                lambda d: keras.callbacks.BackupAndRestore(backup, save_freq=1),
                lambda d: _BackupEpochs(backup, said),
                lambda d: _FailAt(1, 3),
            ],
        )
    assert said == [1, 1], said  # epoch 2 (0-based 1), where the next run must resume
