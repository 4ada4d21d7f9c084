"""Keras's own callbacks and logging under `mirrorkit launch -n 2`, with no change to the script.

One launch of two real workers (TensorFlow's collective runtime on loopback)
runs `SCRIPT`, a plain Keras script that shares one output directory between
the workers: TensorBoard, CSVLogger, progress bars at ``verbose=1``, 2 and
``"auto"``, EarlyStopping and ReduceLROnPlateau on a value that differs
between the workers, TerminateOnNaN on ``step_logs="local"`` losses where one
worker's own data holds a NaN, a user callback that stops one worker only,
and ``model.save``/``save_weights``/``export`` (a SavedModel, and a LiteRT file where
Keras exports one) and an ``ExportArchive``'s ``write_out`` on every worker. A second
launch runs the same script with the repairs taken away (``docs/compat.md``,
"Logs written by every worker" and the sections after it) and checks that
plain Keras writes twice and hangs.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from _quoted import assert_quoted_in, quoted_block

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = r'''
import json, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras, numpy as np, tensorflow as tf
import mirrorkit as mk
from mirrorkit.compat import chief_logs
from mirrorkit.patching import attached

out, mode = sys.argv[1], sys.argv[2]
# Plain Keras hangs in mode "upstream": a collective timeout ends it. (Not with the repairs:
# on a loaded machine one worker may trail the other by more than that.)
strategy = mk.strategy(timeout_s=30) if mode == "upstream" else mk.strategy()
rank = mk.describe(strategy).worker_index
if mode == "upstream":  # mirrorkit's other repairs stay: without them fit fails at once
    from mirrorkit.compat import agreed_stop, chief_logs, chief_saves, shared_monitor
    for repair in (*chief_logs.REPAIRS, *agreed_stop.REPAIRS, *shared_monitor.REPAIRS,
                   *chief_saves.REPAIRS):
        repair.remove()
result = {"rank": rank}

def save_result():
    with open(os.path.join(out, f"result-{rank}.json"), "w") as f:
        json.dump(result, f)

def make_model(learning_rate=0.05):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate), loss="mse")
    return model

rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)

class WorkerFigure(keras.callbacks.Callback):
    """A figure of this worker's own: improving on worker 0, worsening on worker 1."""
    def on_epoch_end(self, epoch, logs=None):
        logs["worker_figure"] = 0.5 ** epoch if rank == 0 else 1.0 + epoch

class LearningRates(keras.callbacks.Callback):
    """This worker's learning rate at each epoch's end, after ReduceLROnPlateau's decision."""
    def on_epoch_end(self, epoch, logs=None):
        rate = float(np.array(self.model.optimizer.learning_rate))
        result.setdefault("learning_rates", []).append(rate)
        save_result()  # now: in mode "upstream" worker 0 hangs before fit ends

class Steps(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.steps = 0
    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1

class StopOnWorkerOne(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if rank == 1 and batch == 1:
            self.model.stop_training = True

# 1. Logs, files and decisions of one plain fit(verbose=1), 4 epochs of 4 steps.
model = mk.build(make_model, strategy)
tensorboard = keras.callbacks.TensorBoard(os.path.join(out, "tb"))
class WorkerDir(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        result["tensorboard_dir"] = attached.attached(tensorboard, chief_logs.WORKER_DIR)
history = model.fit(
    x, y, batch_size=16, epochs=4, verbose=1, validation_data=(x[:16], y[:16]),
    callbacks=[
        WorkerFigure(),
        keras.callbacks.ReduceLROnPlateau(monitor="worker_figure", mode="min", patience=1,
                                          factor=0.5),
        keras.callbacks.EarlyStopping(monitor="worker_figure", mode="min", patience=1,
                                      restore_best_weights=True),
        LearningRates(),
        tensorboard,
        keras.callbacks.CSVLogger(os.path.join(out, "log.csv"), append=True),
        WorkerDir(),
    ],
)
result["history"] = {k: [float(v) for v in vs] for k, vs in history.history.items()}
result["learning_rate"] = float(np.array(model.optimizer.learning_rate))
result["weights"] = [w.tolist() for w in model.get_weights()]
for name in (f"model-w{rank}.keras", "model.keras"):
    model.save(os.path.join(out, name))
model.save_weights(os.path.join(out, f"w{rank}.weights.h5"))
model.export(os.path.join(out, f"export-w{rank}"), verbose=False)
archive = keras.export.ExportArchive()  # a SavedModel with an endpoint of its own
archive.track(model)
archive.add_endpoint("predict", model.call,
                     input_signature=[tf.TensorSpec((None, 4), tf.float32)])
archive.write_out(os.path.join(out, f"archive-w{rank}"), verbose=False)
try:  # a LiteRT file: Keras converts the SavedModel it writes inside the export
    model.export(os.path.join(out, f"lite-w{rank}.tflite"), format="litert", verbose=False)
    result["litert"] = True
except ValueError as error:  # a Keras without LiteRT export
    if "Unrecognized format" not in str(error):
        raise
    result["litert"] = False
save_result()

# 2. TerminateOnNaN on each worker's own loss; worker 1's own data has a NaN at step 3.
def per_worker(context):
    mine = x[:32].copy()
    if context.input_pipeline_id == 1:
        mine[16] = np.nan
    return tf.data.Dataset.from_tensor_slices((mine, mine.sum(axis=1, keepdims=True)))
data = mk.distribute(per_worker, strategy, global_batch_size=16)
model = mk.build(make_model, strategy, step_logs="local")
steps = Steps()
model.fit(data, epochs=2, verbose=2, callbacks=[keras.callbacks.TerminateOnNaN(), steps])
result["nan_steps"] = steps.steps
save_result()

# 3. A user callback that stops worker 1 only, after its second step.
model = mk.build(make_model, strategy)
steps = Steps()
model.fit(x, y, batch_size=16, epochs=2, verbose="auto", callbacks=[StopOnWorkerOne(), steps])
result["user_stop_steps"] = steps.steps
save_result()
'''


def _launch(tmp_path, mode):
    script = tmp_path / "plain_keras.py"
    script.write_text(SCRIPT)
    out = tmp_path / mode
    out.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "mirrorkit", "launch", "-n", "2", "--log-dir", str(out / "logs")]
        + [str(script), str(out), mode],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    results = {}
    for path in glob.glob(str(out / "result-*.json")):
        with open(path) as f:
            found = json.load(f)
        results[found["rank"]] = found
    return done, out, results


def _event_files(directory):
    return glob.glob(os.path.join(directory, "events.out.tfevents.*"))


def _progress_lines(out, worker):
    """What a progress bar printed in `worker`'s own log (progress bars overwrite with \\r)."""
    text = (out / "logs" / f"worker-{worker}.log").read_text()
    return re.findall(r"Epoch \d+/\d+|\d+/\d+\S* .*?/step", text.replace("\r", "\n"))


@pytest.mark.multiprocess
def test_keras_callbacks_act_once_and_stop_together_on_two_workers(tmp_path):
    done, out, results = _launch(tmp_path, "repaired")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    first, second = results[0], results[1]
    # One progress bar, from the chief, for verbose=1, 2 and "auto".
    assert _progress_lines(out, 1) == []
    assert len([s for s in _progress_lines(out, 0) if "Epoch 1/" in s]) == 3
    # One TensorBoard run; the other worker's temporary directory is gone.
    assert len(_event_files(out / "tb" / "train")) == 1
    assert len(_event_files(out / "tb" / "validation")) == 1
    assert first["tensorboard_dir"] is None and second["tensorboard_dir"]
    assert not os.path.exists(second["tensorboard_dir"])
    # EarlyStopping and ReduceLROnPlateau decide on the workers' mean figure:
    # 1.0 then (0.5 + 2.0) / 2 = 1.25, no better, so both stop after epoch 2, at lr / 2.
    for worker in (first, second):
        assert len(worker["history"]["loss"]) == 2
        assert worker["learning_rate"] == pytest.approx(0.025)
        assert worker["learning_rates"] == pytest.approx([0.05, 0.025])
    assert "differs between workers" in done.stdout + done.stderr
    for key in ("loss", "val_loss"):  # History is complete, and the job's, on every worker
        assert first["history"][key] == pytest.approx(second["history"][key], abs=1e-6)
    for a, b in zip(first["weights"], second["weights"], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    # One CSV from the chief: a header and one row per epoch.
    rows = (out / "log.csv").read_text().splitlines()
    assert len(rows) == 3 and rows[0].startswith("epoch,") and rows[1].startswith("0,")
    assert sorted(p.name for p in out.glob("*-w*")) == [
        "archive-w0",
        "export-w0",
        *(["lite-w0.tflite"] if first["litert"] else []),
        "model-w0.keras",
    ]
    assert sorted(p.name for p in out.glob("w*.weights.h5")) == ["w0.weights.h5"]
    assert "only the chief's file is kept" in done.stdout + done.stderr
    # TerminateOnNaN on worker 1's own NaN loss at step 3, and a user callback on
    # worker 1 after step 2: both workers stop there.
    assert first["nan_steps"] == second["nan_steps"] == 3
    assert first["user_stop_steps"] == second["user_stop_steps"] == 2
    assert "set model.stop_training" in done.stdout + done.stderr
    # The chief's notices, as the Keras repairs page quotes them (without the launcher's [w0])
    said = re.sub(r"(?m)^\[w\d+\] ", "", done.stdout + done.stderr)
    for quote in (
        quoted_block("compat.md", "`TensorBoard` callback, the chief prints:"),
        quoted_block("compat.md", "one worker set it, all stop, and the chief prints who set"),
        quoted_block("compat.md", "When the values differed, the chief prints:"),
        quoted_block("compat.md", "nothing it reads can leave the workers out of step. The chief"),
        quoted_block("compat.md", "`ExportArchive.write_out` and `model.export` call):"),
    ):
        assert_quoted_in(quote, said)


@pytest.mark.upstream
@pytest.mark.multiprocess
def test_plain_keras_callbacks_write_twice_and_hang_on_two_workers(tmp_path):
    # When this starts failing, Keras made its callbacks chief-aware (docs/compat.md).
    done, out, results = _launch(tmp_path, "upstream")
    assert len(_progress_lines(out, 1)) > 0  # a progress bar per worker
    assert len(_event_files(out / "tb" / "train")) == 2  # two runs interleaved in one
    assert len(_event_files(out / "tb" / "validation")) == 2
    rows = (out / "log.csv").read_text().splitlines()
    assert len([row for row in rows if row.startswith("epoch,")]) == 2  # both append to it
    assert (out / "model-w1.keras").exists()  # the non-chief's own save
    assert (out / "archive-w1" / "saved_model.pb").exists()
    # Worker 1 stops at the end of epoch 2 (its own figure worsens); worker 0 trains on
    # and waits for it in epoch 3's all-reduce, until worker 1's next collectives (or
    # the 30 s collective timeout) end the job with an error.
    assert done.returncode != 0
    assert len(results[1]["history"]["loss"]) == 2
    assert 0 not in results or "nan_steps" not in results[0]
    # Each worker's ReduceLROnPlateau decides on its own figure: worker 1's worsens at epoch 2
    # and it halves its own learning rate; worker 0's improves and it keeps its own.
    assert results[0]["learning_rates"][:2] == pytest.approx([0.05, 0.05])
    assert results[1]["learning_rates"] == pytest.approx([0.05, 0.025])


def test_monitored_value_is_the_workers_mean_or_their_common_value():
    from mirrorkit.compat.shared_monitor import agreed_value

    same = np.array([[1.0, 0.25], [1.0, 0.25]])
    local = np.float32(0.25)
    assert agreed_value("EarlyStopping", "m", local, same) is local
    assert agreed_value("EarlyStopping", "m", None, np.zeros((2, 2))) is None
    assert agreed_value("EarlyStopping", "m", 0.5, np.array([[1.0, 0.5], [1.0, 2.0]])) == 1.25


def test_monitored_value_logged_by_some_workers_only_is_an_error():
    from mirrorkit.compat.shared_monitor import agreed_value

    with pytest.raises(ValueError, match=r"worker\(s\) 0 log 'm' and worker\(s\) 1 do not"):
        agreed_value("ReduceLROnPlateau", "m", 0.5, np.array([[1.0, 0.5], [0.0, 0.0]]))
    with pytest.raises(ValueError) as caught:
        agreed_value("EarlyStopping", "m", 0.5, np.array([[1.0, 0.5], [0.0, 0.0]]))
    quote = quoted_block("compat.md", "worker raises the same `ValueError` at the same epoch")
    assert_quoted_in(quote, f"ValueError: {caught.value}")


def test_only_callbacks_that_may_stop_in_a_batch_hook_cost_a_collective_per_batch():
    import keras

    import mirrorkit as mk
    from mirrorkit.compat.agreed_stop import may_stop_mid_epoch

    class StopsAtBatchEnd(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            pass

    class Logger(keras.callbacks.TensorBoard):  # a subclass may add a stop: checked
        pass

    per_batch = [
        keras.callbacks.TerminateOnNaN(),
        StopsAtBatchEnd(),
        keras.callbacks.LambdaCallback(on_batch_end=lambda batch, logs: None),
        Logger(),
    ]
    per_epoch = [
        keras.callbacks.EarlyStopping(),
        keras.callbacks.ReduceLROnPlateau(),
        keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: None),
        keras.callbacks.TensorBoard(),
        keras.callbacks.CSVLogger("unused.csv"),
        keras.callbacks.ModelCheckpoint("unused.keras"),
        keras.callbacks.ProgbarLogger(),
        mk.callbacks.HangWatchdog(60),
    ]
    assert [may_stop_mid_epoch(c) for c in per_batch] == [True] * len(per_batch)
    assert [may_stop_mid_epoch(c) for c in per_epoch] == [False] * len(per_epoch)
    # On averaged step logs every worker's TerminateOnNaN reads the same loss.
    assert not may_stop_mid_epoch(keras.callbacks.TerminateOnNaN(), averaged_step_logs=True)
    assert may_stop_mid_epoch(StopsAtBatchEnd(), averaged_step_logs=True)
