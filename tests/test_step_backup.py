"""A step backup resumes at its step: a crash costs the steps since the last backup.

Keras's own ``BackupAndRestore(save_freq=N)`` and ``mk.resumable(dir, every=N)``
back up every N steps; a run that fails in the middle of an epoch resumes at the
step of its last backup, with the batch the uninterrupted run took next, and ends
equal to it (weights and ``optimizer.iterations``), training at most N steps twice.
In-process runs on 2 logical CPU replicas (a failure is an exception raised by a
callback, the next ``fit`` a new model, as a restarted process builds it), and one
2-worker job under ``mirrorkit launch`` whose chief and worker 1 are SIGKILLed.
"""

from __future__ import annotations

import functools
import os
import re
import signal

import keras
import numpy as np
import pytest
import tensorflow as tf
from _launching import launch
from _quoted import assert_quoted_in, quoted_block

import mirrorkit as mk

EPOCHS, STEPS, BATCH = 3, 8, 16  # 8 steps an epoch, 24 in all


def _data():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(STEPS * BATCH, 5)).astype("float32")
    return x, (x @ rng.normal(size=(5, 1))).astype("float32")


def _model(strategy, recipes=False):
    """The model; with `recipes`, mixed_float16 layers, a loss scale, clipping, accumulation."""

    def make():
        dtype = "mixed_float16" if recipes else None
        model = keras.Sequential(
            [keras.Input((5,)), keras.layers.Dense(4, dtype=dtype), keras.layers.Dense(1)]
        )
        optimizer = keras.optimizers.Adam(0.01)
        if recipes:  # accumulation over 2 steps: a backup every 3 lands in the middle of one
            optimizer = keras.optimizers.Adam(0.01, clipnorm=1.0, gradient_accumulation_steps=2)
            optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
        model.compile(optimizer=optimizer, loss="mse")
        rng = np.random.default_rng(7)
        model.set_weights([rng.normal(size=w.shape).astype("float32") for w in model.get_weights()])
        return model

    return mk.build(make, strategy)


def _input(kind, strategy):
    """(fit's x, its other arguments) for one kind of input."""
    x, y = _data()
    if kind == "distribute shuffled":
        return mk.distribute((x, y), strategy, global_batch_size=BATCH, seed=0), {}
    if kind == "arrays":
        return x, dict(y=y, batch_size=BATCH, shuffle=False)
    if kind == "tf.data":
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
        return strategy.experimental_distribute_dataset(dataset), {}
    if kind == "tf.data shuffled":
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(64).batch(BATCH)
        return dataset, {}
    raise AssertionError(kind)


class _Steps(keras.callbacks.Callback):
    """Counts the steps trained, records (epoch, batch) of each, and raises at `fail_at`."""

    def __init__(self, trained, fail_at=None):
        super().__init__()
        self.trained, self.fail_at, self.epoch = trained, fail_at, None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (self.epoch, batch) == self.fail_at:
            raise RuntimeError("failed here on purpose")

    def on_train_batch_end(self, batch, logs=None):
        self.trained.append((self.epoch, batch))


def _fit(kind, backup, trained, fail_at=None, before_fit=lambda: None, recipes=False):
    """One run (a fresh model, as a restarted process builds it): weights and iterations.

    With `recipes`, the model's (`_model`) and mirrorkit's step callbacks around the backup.
    """
    strategy = mk.strategy(cpu_replicas=2)
    model = _model(strategy, recipes)
    x, kwargs = _input(kind, strategy)
    callbacks = [] if backup is None else [backup()]
    if recipes:  # ThroughputCallback's input clock stays installed after a fit that raises
        timer = [] if fail_at else [mk.ThroughputCallback(verbose=0)]
        callbacks = [mk.callbacks.NaNGuard(), *callbacks, *timer]
    before_fit()
    model.fit(
        x, epochs=EPOCHS, verbose=0, callbacks=callbacks + [_Steps(trained, fail_at)], **kwargs
    )
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    return weights, int(model.optimizer.iterations.numpy())


@functools.cache
def _reference(kind):
    """The uninterrupted run of `kind`'s input without a backup: (weights, iterations), once
    per process (the model's weights and the data are fixed, so every run gives the same)."""
    weights, iterations = _fit(kind, None, [])
    weights.setflags(write=False)
    return weights, iterations


def _crash_then_resume(kind, backup, fail_at, before_fit=lambda: None, recipes=False):
    trained = []
    with pytest.raises(RuntimeError, match="on purpose"):
        _fit(kind, backup, trained, fail_at, before_fit, recipes)
    weights, iterations = _fit(kind, backup, trained, before_fit=before_fit, recipes=recipes)
    return weights, iterations, trained


@pytest.mark.parametrize(
    "kind, which",
    [
        ("distribute shuffled", "keras"),
        ("arrays", "keras"),
        ("tf.data", "keras"),
        ("distribute shuffled", "resumable"),
    ],
)
def test_a_step_backup_resumes_at_its_step_equal_to_an_uninterrupted_run(
    tmp_path, capfd, kind, which
):
    reference, iterations = _reference(kind)
    path = str(tmp_path / "backup")
    if which == "keras":
        backup = lambda: keras.callbacks.BackupAndRestore(path, save_freq=3)  # noqa: E731
    else:
        backup = lambda: mk.resumable(path, every=3)  # noqa: E731
    # fails before step 6 of epoch 2 (0-based batch 5): the last backup is after its step 4
    # (steps 3, 6 of epoch 1 and 9 = epoch 2 step 1, 12 = epoch 2 step 4 in all)
    resumed, resumed_iterations, trained = _crash_then_resume(kind, backup, (1, 5))
    said = capfd.readouterr()
    assert resumed_iterations == iterations == EPOCHS * STEPS
    np.testing.assert_allclose(resumed, reference, rtol=0, atol=1e-6)
    # the resumed run began at epoch 2 step 4 (0-based batch 4): steps 5 and 6 trained twice
    assert trained.count((1, 4)) == 2 and trained.count((1, 3)) == 1, trained
    assert len(trained) == EPOCHS * STEPS + 1, trained  # the failed step never ended
    assert f"resuming from the backup in {path} at epoch 2 step 4" in said.out, said
    assert_quoted_in(quoted_block("resume.md", "Each worker prints where it resumes:"), said.out)


@pytest.mark.slow
def test_a_step_backup_in_the_middle_of_an_accumulation_with_mixed_precision_and_guards(
    tmp_path, capfd
):
    """mixed_float16 with its loss scale, clipnorm, 2-step accumulation, NaNGuard and
    ThroughputCallback around Keras's step backup: the resumed run ends as the whole one."""
    reference, iterations = _fit("distribute shuffled", None, [], recipes=True)
    path = str(tmp_path / "backup")
    backup = lambda: keras.callbacks.BackupAndRestore(path, save_freq=3)  # noqa: E731
    resumed, resumed_iterations, _ = _crash_then_resume(
        "distribute shuffled", backup, (1, 5), recipes=True
    )
    assert f"resuming from the backup in {path} at epoch 2 step 4" in capfd.readouterr().out
    assert resumed_iterations == iterations
    np.testing.assert_allclose(resumed, reference, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_resumable_every_interval_backs_up_by_time_and_refuses_other_values(tmp_path, capfd):
    import datetime

    reference, _ = _reference("distribute shuffled")
    path = str(tmp_path / "backup")
    # an interval shorter than a step: a backup after every step, the last after epoch 2 step 5
    every = datetime.timedelta(microseconds=1)
    backup = lambda: mk.resumable(path, every=every)  # noqa: E731
    resumed, iterations, trained = _crash_then_resume("distribute shuffled", backup, (1, 5))
    assert f"resuming from the backup in {path} at epoch 2 step 5" in capfd.readouterr().out
    assert iterations == EPOCHS * STEPS and len(trained) == EPOCHS * STEPS
    np.testing.assert_allclose(resumed, reference, rtol=0, atol=1e-6)
    for wrong in ("10min", 0, -3, True, datetime.timedelta(0)):
        with pytest.raises(ValueError, match=r"give 'epoch' .* a number of steps \(every=500\)"):
            mk.resumable(path, every=wrong)


@pytest.mark.slow
def test_an_input_that_draws_other_batches_resumes_at_the_epochs_start_saying_so(tmp_path, capfd):
    path = str(tmp_path / "backup")
    backup = lambda: keras.callbacks.BackupAndRestore(path, save_freq=3)  # noqa: E731
    _, iterations, trained = _crash_then_resume("tf.data shuffled", backup, (1, 5))
    said = capfd.readouterr().err
    assert f"resuming from the backup in {path} at the start of epoch 2, not at its step 4" in said
    assert "a tf.data pipeline with ShuffleDatasetV3 draws other batches" in said, said
    assert "reshuffle_each_iteration=False" in said
    assert_quoted_in(quoted_block("resume.md", "the chief says so once, with the fix:"), said)
    assert trained.count((1, 0)) == 2  # epoch 2 began again
    assert iterations == EPOCHS * STEPS + 4  # as Keras alone: the 4 steps trained again


def _cut_short(path):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)


@pytest.mark.slow
@pytest.mark.parametrize("double_checkpoint", [True, False])
def test_a_damaged_keras_backup_resumes_from_the_previous_or_says_so(
    tmp_path, capfd, double_checkpoint
):
    reference, _ = _reference("distribute shuffled")
    path = str(tmp_path / "backup")

    def backup():
        return keras.callbacks.BackupAndRestore(
            path, save_freq=3, double_checkpoint=double_checkpoint
        )

    trained = []
    with pytest.raises(RuntimeError, match="on purpose"):
        _fit("distribute shuffled", backup, trained, (1, 5))
    _cut_short(os.path.join(path, "latest.weights.h5"))  # a crash or a full disk mid-write
    resumed, iterations = _fit("distribute shuffled", backup, trained)
    said = capfd.readouterr()
    damaged = f"the latest backup in {path} is damaged (latest.weights.h5 cannot be read: "
    if double_checkpoint:  # the previous backup: after epoch 2 step 1
        assert (
            damaged in said.err and "resuming from the previous one, at epoch 2 step 1" in said.err
        )
        quote = quoted_block("resume.md", "With `double_checkpoint=True` the previous backup")
        assert_quoted_in(quote, said.err)
        assert f"resuming from the backup in {path} at epoch 2 step 1" in said.out, said
    else:
        assert f"the only backup in {path} is damaged (latest.weights.h5 cannot be" in said.err
        assert "training starts from the beginning" in said.err, said
    assert iterations == EPOCHS * STEPS
    np.testing.assert_allclose(resumed, reference, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_weights_without_their_metadata_start_from_the_beginning_saying_so(tmp_path, capfd):
    path = str(tmp_path / "backup")
    backup = lambda: keras.callbacks.BackupAndRestore(path, save_freq=3)  # noqa: E731
    reference, _ = _reference("distribute shuffled")
    trained = []
    with pytest.raises(RuntimeError, match="on purpose"):
        _fit("distribute shuffled", backup, trained, (1, 5))
    os.remove(os.path.join(path, "training_metadata.json"))
    resumed, iterations = _fit("distribute shuffled", backup, trained)
    said = capfd.readouterr().err
    assert f"the only backup in {path} was cut short" in said, said
    assert iterations == EPOCHS * STEPS
    np.testing.assert_allclose(resumed, reference, rtol=0, atol=1e-6)


@pytest.mark.upstream
def test_keras_step_backup_trains_steps_twice_upstream(tmp_path):
    """The canary of backup_restore: Keras alone begins the epoch again (iterations over)."""
    from mirrorkit.compat import backup_restore

    path = str(tmp_path / "backup")
    backup = lambda: keras.callbacks.BackupAndRestore(path, save_freq=3)  # noqa: E731
    try:
        _, iterations, _ = _crash_then_resume(
            "distribute shuffled", backup, (1, 5), before_fit=backup_restore.REPAIR.remove
        )
    finally:
        backup_restore.REPAIR.apply()
    # Keras alone resumed at epoch 2 step 0 with the weights of its step 4
    assert iterations == EPOCHS * STEPS + 4, (
        f"backup_restore: Keras's BackupAndRestore(save_freq=3) resumed with {iterations} steps "
        f"for {EPOCHS * STEPS}; if 24, Keras resumes at the step now: retire the repair"
    )


_SCRIPT = """
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    import keras
    import numpy as np
    import mirrorkit as mk
    from test_step_backup import EPOCHS, BATCH, _data, _model

    backup, out, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    attempt = int(os.environ.get("MIRRORKIT_RESTART", "0"))
    strategy = mk.strategy()
    rank = mk.describe(strategy).worker_index
    model = _model(strategy)
    data = mk.distribute(_data(), strategy, global_batch_size=BATCH, seed=0)
    if mode == "keras":  # TensorFlow's tutorial's callback, backing up every 4 steps
        backups = [keras.callbacks.BackupAndRestore(backup, save_freq=4)]
    else:
        backups = [mk.resumable(backup, every=4)]
    # (attempt, rank, epoch, batch): who dies where; "torn": the chief cuts the weights of its
    # backup after epoch 2 step 4 short and dies, as a crash in the middle of the write
    kills = {{"keras": [(0, 1, 1, 6), (1, 0, 2, 3)], "resumable": [(1, 1, 2, 6)]}}[mode]

    if mode == "resumable" and attempt == 0 and rank == 0:
        save, saves = model.save_weights, []

        def save_weights(filepath, *args, **kwargs):
            save(filepath, *args, **kwargs)
            saves.append(filepath)
            if len(saves) == 3:  # after epoch 2 step 4 (12 steps): torn, then killed
                with open(filepath, "r+b") as f:
                    f.truncate(os.path.getsize(filepath) // 2)
                print("KILLING the chief half-way through its step backup", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

        model.save_weights = save_weights

    class Events(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            where = f"{{self.epoch + 1}}.{{batch}}"
            print(f"STEP {{where}} attempt {{attempt}} worker {{rank}}", flush=True)
            if (attempt, rank, self.epoch, batch) in kills:
                print(f"KILLING worker {{rank}} at epoch {{where}}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

    model.fit(data, epochs=EPOCHS, verbose=0, callbacks=backups + [Events()])
    if mk.is_chief():
        weights = np.concatenate([w.ravel() for w in model.get_weights()])
        np.save(out, np.append(weights, float(model.optimizer.iterations.numpy())))
"""


def _launch(tmp_path, mode):
    return launch(tmp_path, _SCRIPT, mode, "--max-restarts", "2")


def _trained_twice(log):
    """How many steps of worker 0 ran in more than one attempt (a step is epoch.batch)."""
    steps = re.findall(r"STEP (\d+\.\d+) attempt \d+ worker 0", log)
    return len(steps) - len(set(steps))


@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", ["keras", "resumable"])
def test_two_workers_killed_mid_epoch_resume_from_step_backups(tmp_path, mode):
    """SIGKILLs of worker 1 and of the chief mid-epoch (Keras's own callback); a torn step
    backup, then worker 1 (mk.resumable(every=4)): each ends equal to the uninterrupted run."""
    done, out = _launch(tmp_path, mode)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-5000:]
    strategy = mk.strategy(cpu_replicas=2)
    model = _model(strategy)
    model.fit(
        mk.distribute(_data(), strategy, global_batch_size=BATCH, seed=0), epochs=EPOCHS, verbose=0
    )
    reference = np.concatenate([w.ravel() for w in model.get_weights()])
    result = np.load(out)
    assert result[-1] == EPOCHS * STEPS, log[-5000:]  # optimizer.iterations: no step twice
    np.testing.assert_allclose(result[:-1], reference, rtol=0, atol=1e-6)
    if mode == "keras":
        assert "KILLING worker 1 at epoch 2.6" in log and "KILLING worker 0 at epoch 3.3" in log
        assert "the job finished after 2 restart(s)" in log, log[-5000:]
        # backups after epoch 2 step 4 and epoch 3 step 4 (16 and 20... steps 4, 8, 12, 16,
        # 20): each restart trained again at most the 3 steps since its last backup
        assert _trained_twice(log) <= 2 * 3, log[-5000:]
        assert "STEP 2.4 attempt 1 worker 0" in log and "STEP 2.3 attempt 1" not in log
    else:
        assert "KILLING the chief half-way through its step backup" in log
        said = "was cut short (its weights and epoch do not match): resuming from the previous one"
        assert said in log, log[-5000:]
        # the previous backup: after epoch 2 step 0 (8 steps), so epoch 2 resumes at step 0
        # the chief died in its backup after epoch 2 step 4: its record says step 3
        said = "worker 0 killed by SIGKILL at epoch 2 step 3; resuming from the backup at epoch 2"
        assert f"{said} step 0: 3 step(s) redone" in log, log[-5000:]
        said = "worker 1 killed by SIGKILL at epoch 3 step 6; resuming from the backup at epoch 3"
        assert f"{said} step 4: 2 step(s) redone" in log, log[-5000:]
        assert "STEP 3.4 attempt 2 worker 0" in log and "STEP 3.3 attempt 2" not in log
        assert_quoted_in(quoted_block("resume.md", "the restart line says the step too:"), log)


class _TermAt(_Steps):
    """Sends this process SIGTERM at the start of (epoch, batch): a cloud VM being reclaimed."""

    def __init__(self, at):
        super().__init__([])
        self.at = at

    def on_train_batch_begin(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.fixture
def sigterm_handler_restored():
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


@pytest.mark.slow
def test_a_preemption_checkpoint_and_a_step_backup_resume_from_the_later(
    tmp_path, capfd, sigterm_handler_restored
):
    """A SIGTERM saves at once; a crash after it resumes from the step backup written since."""
    from mirrorkit.exit_statuses import PREEMPTED

    reference, _ = _reference("distribute shuffled")
    path, ckpt = str(tmp_path / "backup"), str(tmp_path / "preempt")

    def run(*extra, trained):
        strategy = mk.strategy(cpu_replicas=2)
        model = _model(strategy)
        data, _ = _input("distribute shuffled", strategy)
        saving = [mk.resumable(path, every=3), mk.PreemptionCheckpoint(ckpt, data)]
        model.fit(data, epochs=EPOCHS, verbose=0, callbacks=saving + [_Steps(trained), *extra])
        weights = np.concatenate([w.ravel() for w in model.get_weights()])
        return weights, int(model.optimizer.iterations.numpy())

    trained = []
    with pytest.raises(SystemExit) as stopped:  # backups every 3 steps: the last at epoch 2 step 1
        run(_TermAt((1, 0)), trained=trained)
    assert stopped.value.code == PREEMPTED
    said = capfd.readouterr().out
    saved = re.search(r"checkpoint saved in .* at epoch 2 step (\d)", said)
    assert saved and int(saved[1]) > 1, said  # TF agrees on a step after the one in flight
    with pytest.raises(RuntimeError, match="on purpose"):  # resumes from the preemption ckpt
        run(_Steps([], fail_at=(2, 6)), trained=trained)
    said = capfd.readouterr()
    assert f"resuming from the preemption checkpoint at epoch 2 step {saved[1]}" in said.out
    later = f"the preemption checkpoint in {ckpt} (epoch 2 step {saved[1]}) is later than the "
    assert f"{later}backup in {path} (epoch 2 step 1), restored before it" in said.err, said
    # the crash: the step backup written since in epoch 3 is later than the checkpoint
    weights, iterations = run(trained=trained)
    said = capfd.readouterr()
    backed_up = re.search(
        rf"resuming from the backup in {re.escape(path)} at epoch 3 step (\d)", said.out
    )
    assert backed_up, said
    later = f"the backup in {path} (epoch 3 step {backed_up[1]}) is later than the preemption "
    assert f"{later}checkpoint in {ckpt} (epoch 2 step {saved[1]}): resuming from the backup" in (
        said.err
    ), said
    assert_quoted_in(quoted_block("resume.md", "resumes from the later one, saying so:"), said.err)
    assert iterations == EPOCHS * STEPS
    np.testing.assert_allclose(weights, reference, rtol=0, atol=1e-6)
