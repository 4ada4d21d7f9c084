"""The canaries of the multi-worker callback and saving repairs, each taken off alone.

One launch of two real workers (``mirrorkit launch -n 2``) runs `SCRIPT`: for each repair in
turn, both workers take that one repair off (the others stay in place), run a small plain
Keras ``fit`` or save that it repairs, record what they saw, and put the repair back. Each
case of `test_a_callback_repair_taken_off_alone_fails_as_keras_does_upstream` then checks
Keras's own failure for its repair: the non-chief worker writes its own files, prints its
progress bar, leaves a file open, deletes the chief's backup, decides on its own figure, or
names the devices of one worker only. Where the failure would hang the job (one worker
stops, or its CSV logger raises, while the other goes on to the next collective), the case
records it where the workers would part and then lets every worker go on together.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = r'''
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras, numpy as np, tensorflow as tf
import mirrorkit as mk
from mirrorkit.compat import chief_logs
from mirrorkit.patching import attached, catalogue

out, names = sys.argv[1], sys.argv[2].split(",")
strategy = mk.strategy(timeout_s=60)
rank = mk.describe(strategy).worker_index
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)


def make_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


class WorkerFigure(keras.callbacks.Callback):
    """Worsening on worker 1, improving much more on worker 0: their mean improves."""
    def on_epoch_end(self, epoch, logs=None):
        logs["worker_figure"] = 10 * 0.5 ** epoch if rank == 0 else 1.0 + 0.1 * epoch


def fit(*callbacks, epochs=2, verbose=0):
    model = mk.build(make_model, strategy)
    history = model.fit(x, y, batch_size=16, epochs=epochs, verbose=verbose,
                        callbacks=list(callbacks))
    return model, history


def tensorboard(d):
    fit(keras.callbacks.TensorBoard(os.path.join(d, "tb")))
    return {}


def tensorboard_cleanup(d):
    board = keras.callbacks.TensorBoard(os.path.join(d, "tb"))
    fit(board)
    worker_dir = attached.attached(board, chief_logs.WORKER_DIR)
    return {"worker_dir_left": bool(worker_dir) and os.path.isdir(worker_dir)}


def csv_open(d):
    logger = keras.callbacks.CSVLogger(os.path.join(d, "log.csv"))
    fit(logger)
    # Keras opened (and truncated) the file on this worker too; before 3.11 it also left it
    # open here, where the chief_csv_close repair keeps a worker from closing what it did not
    # open
    return {"opened": getattr(logger, "csv_file", None) is not None}


def csv_close(d):
    fit(keras.callbacks.CSVLogger(os.path.join(d, "log.csv")))
    return {}


def progbar(d):
    print(f"CASE progbar begins on worker {rank}", flush=True)
    fit(verbose=1)
    print(f"CASE progbar ends on worker {rank}", flush=True)
    return {}


def model_save(d):
    model, _ = fit()
    model.save(os.path.join(d, f"model-w{rank}.keras"))
    return {}


def model_save_weights(d):
    model, _ = fit()
    model.save_weights(os.path.join(d, f"w{rank}.weights.h5"))
    return {}


def saved_model(d):
    model, _ = fit()
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("predict", model.call,
                         input_signature=[tf.TensorSpec((None, 4), tf.float32)])
    archive.write_out(os.path.join(d, f"archive-w{rank}"), verbose=False)
    return {}


def backup_save(d):
    fit(keras.callbacks.BackupAndRestore(os.path.join(d, f"backup-w{rank}")))
    return {}


def model_export(d):
    model, _ = fit()
    try:  # the one format whose file Keras writes itself, not through tf.saved_model.save
        model.export(os.path.join(d, f"lite-w{rank}.tflite"), format="litert", verbose=False)
    except ValueError as error:
        if "Unrecognized format" not in str(error):
            raise
        return {"skip": f"Keras {keras.__version__} exports no LiteRT file"}
    return {}


def checkpoint_save(d):
    fit(keras.callbacks.ModelCheckpoint(os.path.join(d, f"ckpt-w{rank}", "model.keras")))
    return {}


class ChiefLingers(keras.callbacks.Callback):
    """On the chief, before BackupAndRestore's clean-up: is the backup still there?"""
    def __init__(self, folder):
        super().__init__()
        self.folder, self.seen = folder, None

    def on_train_end(self, logs=None):
        if rank == 0:
            time.sleep(3)  # the other worker is past its own on_train_end by then
            self.seen = os.path.isdir(self.folder)


def backup_cleanup(d):
    folder = os.path.join(d, "backup")  # one folder for both workers, as on shared storage
    lingers = ChiefLingers(folder)
    fit(lingers, keras.callbacks.BackupAndRestore(folder))
    return {"backup_there": lingers.seen}


class StopsOnWorker1(keras.callbacks.Callback):
    """Sets model.stop_training on worker 1 only: after its first batch, or its first epoch."""
    def __init__(self, hook):
        super().__init__()
        self.hook = hook

    def on_train_batch_end(self, batch, logs=None):
        if self.hook == "batch" and rank == 1:
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        if self.hook == "epoch" and rank == 1:
            self.model.stop_training = True


class Observed(keras.callbacks.CallbackList):
    """What fit reads after the first such hook of its callbacks, which ran as they do in fit.

    Then every worker stops there: without the repair the workers would part (worker 1 stops,
    worker 0 waits for it in the next step's all-reduce), and the launch goes on either way.
    """
    def __init__(self, hook, callbacks, model):
        super().__init__(callbacks, add_history=True, model=model)
        self.hook, self.seen = hook, None

    def _observe(self, hook):
        if hook == self.hook and self.seen is None:
            self.seen = bool(self.model.stop_training)
            self.model.stop_training = True

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        self._observe("batch")

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        self._observe("epoch")


def stops(hook):
    def case(d):
        model = mk.build(make_model, strategy)
        observed = Observed(hook, [StopsOnWorker1(hook)], model)
        model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=observed)
        return {"stopping": observed.seen}
    return case


class Guarded(keras.callbacks.Callback):
    """Calls a callback's hooks as fit does; an error in one is kept, not raised (the other
    worker would wait for this one in the next collective)."""
    def __init__(self, inner):
        super().__init__()
        self.inner, self.raised = inner, None

    def set_model(self, model):
        super().set_model(model)
        self.inner.set_model(model)

    def _call(self, hook, *args):
        try:
            getattr(self.inner, hook)(*args)
        except Exception as error:
            self.raised = self.raised or f"{type(error).__name__}: {error}"

    def on_train_begin(self, logs=None):
        self._call("on_train_begin", logs)

    def on_epoch_end(self, epoch, logs=None):
        self._call("on_epoch_end", epoch, logs)

    def on_train_end(self, logs=None):
        self._call("on_train_end", logs)


def csv_rows(d):
    guarded = Guarded(keras.callbacks.CSVLogger(os.path.join(d, "log.csv")))
    fit(guarded)
    return {"raised": guarded.raised} if guarded.raised else {}


def devices(d):
    return {"devices": keras.distribution.list_devices()}


def reduce_lr(d):
    model, _ = fit(WorkerFigure(), keras.callbacks.ReduceLROnPlateau(
        monitor="worker_figure", mode="min", patience=1, factor=0.5), epochs=3)
    return {"learning_rate": float(np.array(model.optimizer.learning_rate))}


def early_stopping(d):
    _, history = fit(WorkerFigure(), keras.callbacks.EarlyStopping(
        monitor="worker_figure", mode="min", patience=1), epochs=4)
    return {"epochs": len(history.history["loss"])}


CASES = {
    "chief_tensorboard": tensorboard,
    "chief_tensorboard_cleanup": tensorboard_cleanup,
    "chief_csv_open": csv_open,
    "chief_csv_close": csv_close,
    "chief_progbar": progbar,
    "chief_model_save": model_save,
    "chief_model_save_weights": model_save_weights,
    "chief_saved_model": saved_model,
    "chief_backup_save": backup_save,
    "agreed_stop_begin": stops("batch"),
    "agreed_stop_batch": stops("batch"),
    "agreed_stop_epoch": stops("epoch"),
    "chief_csv_rows": csv_rows,
    "keras_distribution_devices": devices,
    "chief_backup_cleanup": backup_cleanup,
    "chief_checkpoint_save": checkpoint_save,
    "chief_model_export": model_export,
    "shared_reduce_lr": reduce_lr,
    "shared_early_stopping": early_stopping,
}
result = {"rank": rank}
for name in names:
    folder = os.path.join(out, name)
    os.makedirs(folder, exist_ok=True)
    repair = catalogue.named(name)
    repair.remove()  # alone: every other repair stays in place
    try:
        result[name] = CASES[name](folder)
    except Exception as error:  # after training: the other worker is not left waiting
        result[name] = {"raised": f"{type(error).__name__}: {error}"}
    finally:
        repair.apply()
    with open(os.path.join(out, f"result-{rank}.json"), "w") as f:
        json.dump(result, f)
'''

#: Each repair, and what plain Keras does on the worker that is not the chief without it.
CASES = (
    "chief_tensorboard",
    "chief_tensorboard_cleanup",
    "chief_csv_open",
    "chief_csv_close",
    "chief_progbar",
    "chief_model_save",
    "chief_model_save_weights",
    "chief_saved_model",
    "chief_backup_save",
    "agreed_stop_begin",
    "agreed_stop_batch",
    "agreed_stop_epoch",
    "chief_csv_rows",
    "keras_distribution_devices",
    "chief_backup_cleanup",
    "chief_checkpoint_save",
    "chief_model_export",
    "shared_reduce_lr",
    "shared_early_stopping",
)


@pytest.fixture(scope="module")
def taken_off_one_by_one(tmp_path_factory):
    """The launch: (its output, the folder, each worker's facts by repair)."""
    folder = tmp_path_factory.mktemp("canaries")
    script = folder / "canaries.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, "-m", "mirrorkit", "launch", "-n", "2", "--log-dir", str(folder / "logs")]
        + [str(script), str(folder), ",".join(CASES)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    facts = {}
    for path in glob.glob(str(folder / "result-*.json")):
        with open(path) as f:
            found = json.load(f)
        facts[found["rank"]] = found
    return folder, facts


def _event_files(directory):
    return glob.glob(os.path.join(directory, "events.out.tfevents.*"))


def _keras_fails(name, folder, facts):
    """Whether plain Keras's failure shows for repair `name`, from what the workers saw."""
    chief, other = facts[0][name], facts[1][name]
    where = folder / name
    if name == "chief_tensorboard":
        return len(_event_files(where / "tb" / "train")) == 2  # both workers' runs in one
    if name == "chief_tensorboard_cleanup":
        return other.get("worker_dir_left") is True and not chief.get("worker_dir_left")
    if name == "chief_csv_open":
        return other.get("opened") is True and chief.get("opened") is True
    if name == "chief_csv_close":  # Keras 3.10: worker 1 closes a file it never opened
        return "AttributeError" in other.get("raised", "") and "raised" not in chief
    if name == "chief_progbar":
        log = (folder / "logs" / "worker-1.log").read_text().replace("\r", "\n")
        case = log.split("CASE progbar begins", 1)[1].split("CASE progbar ends", 1)[0]
        return bool(re.search(r"\d+/\d+\S* .*?/step", case))
    saved = {
        "chief_model_save": "model-w1.keras",
        "chief_model_save_weights": "w1.weights.h5",
        "chief_saved_model": "archive-w1/saved_model.pb",
        "chief_backup_save": "backup-w1/training_metadata.json",
    }
    if name in saved:
        return (where / saved[name]).exists()  # the worker that is not the chief wrote it
    if name.startswith("agreed_stop_"):  # worker 1 stops, worker 0 goes on: a hang
        return other["stopping"] is True and chief["stopping"] is False
    if name == "chief_csv_rows":  # it writes rows to a file it never opened
        rows = (where / "log.csv").read_text().splitlines()
        return "raised" in other or len(rows) > 3
    if name == "keras_distribution_devices":  # not each worker's devices, each named once
        return any(len(set(found["devices"])) < 2 for found in (chief, other))
    if name == "chief_backup_cleanup":  # the other worker deleted the chief's backup
        return chief["backup_there"] is False
    if name == "chief_checkpoint_save":  # it made the checkpoint's folder itself
        return (where / "ckpt-w1").is_dir()
    if name == "chief_model_export":  # its own file, or (tf.saved_model.save still repaired)
        # the SavedModel Keras converts inside the export went elsewhere, and it fails
        return (where / "lite-w1.tflite").exists() or "SavedModel" in other.get("raised", "")
    if name == "shared_reduce_lr":  # each worker decided on its own figure
        return chief["learning_rate"] != other["learning_rate"]
    if name == "shared_early_stopping":  # worker 1's own figure worsens: both stop early
        return chief["epochs"] == other["epochs"] < 4
    raise AssertionError(name)


@pytest.mark.upstream
@pytest.mark.multiprocess
@pytest.mark.parametrize("repair", CASES)
def test_a_callback_repair_taken_off_alone_fails_as_keras_does_upstream(
    repair, taken_off_one_by_one
):
    import keras

    from mirrorkit.patching import catalogue

    if catalogue.named(repair).fixed_upstream:  # that release fixed it: the repair steps aside
        pytest.skip(f"{repair}: fixed in Keras {catalogue.named(repair).fixed_in}")
    folder, facts = taken_off_one_by_one
    assert all(repair in facts[rank] for rank in (0, 1)), facts
    if "skip" in facts[0][repair]:
        pytest.skip(f"{repair}: {facts[0][repair]['skip']}")
    assert _keras_fails(repair, folder, facts), (
        f"{repair}: taken off alone, Keras {keras.__version__} did not fail as it did on two "
        f"workers ({facts[0][repair]}, {facts[1][repair]}): retire the repair"
    )
