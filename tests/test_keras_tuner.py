"""KerasTuner's distributed tuning with a 2-worker `mirrorkit launch` as one tuner.

keras.io's "Distributed hyperparameter tuning" runs a chief oracle
(``KERASTUNER_TUNER_ID=chief``) and tuners that ask it for trials. Here the
oracle is a real process on this machine's 127.0.0.1, and the tuner is one
`mirrorkit launch -n 2` job whose workers live in the launch's private network
(they reach the oracle through the launcher's relay) and train each trial
together under `mk.strategy()`, importing ``keras_tuner`` after it, as the guide's
scripts do. Every trial's hyperparameters and score equal
those of the same search run on one device in its own process. A second test
gives the two workers different trials (no oracle, a different seed each; ``keras_tuner``
imported before ``mk.strategy()``) and checks that both stop with an error that names each
worker's trial, instead of training two different models against each other. Two canaries
show, in this process, the oracle's behaviour behind it: a tuner ID that asks again before
its trial is ended is handed that trial again, and oracles without a fixed seed draw
different trials.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys

import pytest
from _quoted import assert_quoted_in, quoted_block

pytest.importorskip("keras_tuner", reason="the tuner extra: pip install -e '.[tuner]'")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = r"""
import json, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras, numpy as np
import mirrorkit as mk

mode, directory, out = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "told_apart":
    import keras_tuner  # before mk.strategy(): the repairs apply with the strategy
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1))).astype("float32")

def build(hp):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((8,)),
        keras.layers.Dense(hp.Choice("units", [4, 8, 16]), activation="relu"),
        keras.layers.Dense(1),
    ])
    lr = hp.Float("learning_rate", 1e-3, 1e-1, sampling="log")
    model.compile(optimizer=keras.optimizers.SGD(lr), loss="mse")
    return model

strategy = mk.strategy() if mode in ("worker", "told_apart") else None
import keras_tuner  # after mk.strategy() (the workers' tuning): the repairs apply at the import
seed = 7 if mode != "told_apart" else 7 + mk.describe(strategy).worker_index
tuner = keras_tuner.Hyperband(  # keras.io's distributed tuning guide: Hyperband, EarlyStopping
    build, objective="val_loss", max_epochs=2, factor=2, seed=seed, directory=directory,
    project_name="search", distribution_strategy=strategy,
)
tuner.search(x, y, batch_size=16, validation_data=(x[:32], y[:32]), verbose=0, shuffle=False,
             callbacks=[keras.callbacks.EarlyStopping("val_loss", patience=1)])
if mode in ("chief", "one_device"):
    trials = tuner.oracle.get_best_trials(num_trials=100)
    found = {t.trial_id: {"values": t.hyperparameters.values, "score": t.score} for t in trials}
    with open(out, "w") as f:
        json.dump(found, f)
"""


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _python(script, *args, env=None):
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _launch(script, *args, env):
    return subprocess.run(
        [sys.executable, "-m", "mirrorkit", "launch", "-n", "2", str(script), *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=420,
    )


@pytest.mark.multiprocess
def test_a_two_worker_launch_tunes_as_one_device_against_a_chief_oracle(tmp_path):
    script = tmp_path / "tune.py"
    script.write_text(SCRIPT)
    port = str(_free_port())
    oracle_env = {"KERASTUNER_ORACLE_IP": "127.0.0.1", "KERASTUNER_ORACLE_PORT": port}
    one_device = _python(script, "one_device", tmp_path / "alone", tmp_path / "alone.json")
    oracle = _python(
        script,
        "chief",
        tmp_path / "oracle",
        tmp_path / "chief.json",
        env={**oracle_env, "KERASTUNER_TUNER_ID": "chief"},
    )
    try:
        job = _launch(
            script,
            "worker",
            tmp_path / "workers",
            tmp_path / "unused.json",
            env={**oracle_env, "KERASTUNER_TUNER_ID": "tuner0"},
        )
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
        assert f"KerasTuner's oracle at 127.0.0.1:{port} is reached" in job.stderr
        said, _ = oracle.communicate(timeout=120)
        assert oracle.returncode == 0, said[-3000:]
        said, _ = one_device.communicate(timeout=300)
        assert one_device.returncode == 0, said[-3000:]
    finally:
        for process in (oracle, one_device):
            process.kill()
    tuned = json.loads((tmp_path / "chief.json").read_text())
    alone = json.loads((tmp_path / "alone.json").read_text())
    assert sorted(tuned) == sorted(alone) and len(alone) >= 3, (tuned, alone)
    for trial_id, trial in alone.items():
        assert tuned[trial_id]["values"] == trial["values"]
        assert tuned[trial_id]["score"] == pytest.approx(trial["score"], rel=1e-4)


@pytest.mark.multiprocess
def test_workers_handed_different_trials_stop_naming_each_workers_trial(tmp_path):
    script = tmp_path / "tune.py"
    script.write_text(SCRIPT)
    job = _launch(script, "told_apart", tmp_path / "workers", tmp_path / "unused.json", env={})
    assert job.returncode != 0
    said = job.stdout + job.stderr
    assert "the workers of one multi-worker job must train the same KerasTuner trial" in said
    assert "worker 0 got trial 0; worker 1 got trial 0 (this worker's trial" in said
    assert "Give every worker of the job the same KERASTUNER_TUNER_ID" in said
    quote = quoted_block("compat.md", "have different seeds, without a chief oracle, each print:")
    worker_0 = [line.removeprefix("[w0] ") for line in said.splitlines() if line.startswith("[w0]")]
    assert_quoted_in(quote, "\n".join(worker_0))  # compat.md quotes worker 0's error


def _oracle(seed, directory):
    """A RandomSearchOracle over SCRIPT's search space, as a tuner makes it."""
    import keras_tuner

    hp = keras_tuner.HyperParameters()
    hp.Choice("units", [4, 8, 16])
    hp.Float("learning_rate", 1e-3, 1e-1, sampling="log")
    oracle = keras_tuner.oracles.RandomSearchOracle(
        objective="val_loss", max_trials=4, hyperparameters=hp, seed=seed
    )
    oracle._set_project_dir(str(directory), "search")  # as BaseTuner does; save() writes there
    return oracle


@pytest.mark.upstream
def test_an_oracle_hands_a_tuner_id_its_trial_again_until_the_chief_ends_it_upstream(tmp_path):
    """KerasTuner's Oracle.create_trial hands every ask under a tuner ID the trial running under
    it, so a worker that asks before its chief has ended the last trial trains that trial again
    while the chief trains the next. If this stops failing, retire keras_tuner_ask_together."""
    from keras_tuner.engine.trial import TrialStatus

    oracle = _oracle(7, tmp_path)
    first = oracle.create_trial("tuner0")  # the chief, then worker 1, of one job: the same trial
    assert oracle.create_trial("tuner0") is first
    oracle.update_trial(first.trial_id, {"val_loss": 0.5})  # the chief reports it
    again = oracle.create_trial("tuner0")  # worker 1 done, asks before the chief ends it
    first.status = TrialStatus.COMPLETED
    oracle.end_trial(first)
    following = oracle.create_trial("tuner0")  # the chief asks
    assert again is first and following.trial_id != first.trial_id, (again, following)


@pytest.mark.upstream
def test_oracles_without_a_fixed_seed_draw_different_trials_upstream(tmp_path):
    """Without a chief oracle each worker runs an oracle of its own; KerasTuner draws the seed of
    one built with seed=None (or 0) from Python's random state, which differs between the
    workers' processes, so their first trials differ. If this stops failing, retire
    keras_tuner_same_trial."""
    state = random.getstate()
    try:
        for seed in (None, 0):
            drawn = []
            for worker in (0, 1):
                random.seed(worker)  # each worker's process: a random state of its own
                oracle = _oracle(seed, tmp_path / f"{seed}-{worker}")
                drawn.append(oracle.create_trial("tuner0").hyperparameters.values)
            assert drawn[0] != drawn[1], (seed, drawn)
    finally:
        random.setstate(state)
