"""keras.io examples converted to mirrorkit train as the unconverted example does on one device.

Each example in ``tests/keras_io/`` runs deterministically as the keras.io code on one device
and converted to mirrorkit on 2 CPU replicas; the examples that write their own training step
or fine-tune a pretrained base (`OWN_STEPS`) also run converted on 2 real workers. Every
example of one placement runs in one fresh process, or one 2-worker job (TensorFlow starts
once per placement), the placements at the same time; each example's comparisons are their own
tests. Loss and metric history, every optimizer's ``iterations`` and any evaluation, and the
final weights must agree within 1e-5 (a logged value above 1 within 1e-5 of itself: float32
holds about 7 significant digits, so a loss of 172 is resolved to 1.5e-5). `KNOWN_DIFFERENCES`
lists the comparisons that differ for reasons outside mirrorkit. The count of lines each
conversion changed is checked against what its header states.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from _multiworker import run_workers
from keras_io import EXAMPLES, OWN_STEPS, changed_lines, load, run_all, write_all

from mirrorkit.launcher.processes import run_function

TOLERANCE = 1e-5
REPLICAS = 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(one device, 2 replicas, [worker 0, worker 1]): example name -> outcome, each placement
    in a fresh process (the workers: one 2-worker job, `OWN_STEPS` only)."""
    workdirs = {}
    for placement in ("one_device", "replicas", "workers"):
        workdirs[placement] = str(tmp_path_factory.mktemp(f"keras_io_{placement}"))
        write_all(workdirs[placement])  # the same stand-in data; checkpoints kept apart
    with ThreadPoolExecutor(3) as pool:
        one = pool.submit(run_function, run_all, (workdirs["one_device"], None), timeout_s=900)
        two = pool.submit(run_function, run_all, (workdirs["replicas"], REPLICAS), timeout_s=900)
        workers = pool.submit(
            run_workers, run_all, workdirs["workers"], None, OWN_STEPS, True, timeout_s=900
        )
        return one.result()[0], two.result()[0], workers.result()


def _close(what, expected, got, relative=False):
    expected, got = np.asarray(expected, dtype="float64"), np.asarray(got, dtype="float64")
    assert expected.shape == got.shape, f"{what}: shape {got.shape}, one device {expected.shape}"
    scale = np.maximum(1.0, np.abs(expected)) if relative else 1.0
    diff = float(np.max(np.abs(expected - got) / scale)) if expected.size else 0.0
    assert diff <= TOLERANCE, (
        f"{what} differs from one device by {diff:.3g} (tolerance {TOLERANCE}): "
        f"{got.tolist() if got.size < 20 else ''} vs {expected.tolist() if got.size < 20 else ''}"
    )


#: Differences from one device that are not mirrorkit's, found and explained; each still fails
#: its comparison (an xfail, strict unless TIMING_DEPENDENT), so a change upstream that removes
#: it shows up as XPASS.
KNOWN_DIFFERENCES = {
    ("text_classification_from_scratch", "history"): (
        "the training set is shuffled, then .cache()d: on one device Keras reads exactly its 3 "
        "batches, so TensorFlow discards the unfinished cache every epoch ('The calling iterator "
        "did not fully read the dataset being cached') and epoch 2 is reshuffled; under "
        "tf.distribute the iterator reads to the end, the cache completes and epoch 2 replays "
        "epoch 1's order (the same with plain Keras fit under MirroredStrategy, no mirrorkit)"
    ),
    ("text_classification_from_scratch", "weights"): "as for its history",
    ("image_classification_from_scratch", "weights"): (
        "the 8 biases that feed a BatchNormalization (and 2 moving means that track them) differ "
        "by up to 5.3e-4: their gradient is zero in exact arithmetic (BN subtracts the batch "
        "mean), so it is round-off, which differs with the all-reduce's summation order, and "
        "Adam's normalisation turns it into steps of the learning rate's size; the History and "
        "the other 53 weights agree within 1e-5"
    ),
}


#: Known differences whose appearance depends on timing (how far an iterator reads ahead):
#: not strict, so that a run where both sides happen to agree does not fail CI. What does not
#: depend on timing is checked strictly (`test_text_example_first_epoch_as_one_device`).
TIMING_DEPENDENT = {"text_classification_from_scratch"}


def _cases(part):
    return [
        pytest.param(
            name,
            marks=[
                pytest.mark.xfail(
                    strict=name not in TIMING_DEPENDENT, reason=KNOWN_DIFFERENCES[(name, part)]
                )
            ]
            if (name, part) in KNOWN_DIFFERENCES
            else [],
        )
        for name in EXAMPLES
    ]


def _skip_if_missing(outcome):
    """An example whose optional package is not installed (keras-rs: the ``rs`` extra, which
    CI's newest leg installs) is skipped, saying what to install."""
    if "missing" in outcome:
        pytest.skip(f"needs {', '.join(outcome['missing'])}: pip install -e '.[rs]'")


def _results(runs, name):
    one, two = runs[0][name], runs[1][name]
    _skip_if_missing(one)
    assert "error" not in one, f"the unconverted example failed:\n{one.get('error')}"
    assert "error" not in two, f"the example on {REPLICAS} replicas failed:\n{two.get('error')}"
    return one, two


def _assert_history_and_steps(one, two):
    assert two["iterations"] == one["iterations"], "every optimizer's iterations"
    assert sorted(two["history"]) == sorted(one["history"]), "History keys"
    for key, values in one["history"].items():
        _close(f"History[{key!r}]", values, two["history"][key], relative=True)
    for key in sorted(set(one) - {"history", "weights", "iterations"}):
        _close(key, one[key], two[key], relative="weights" not in key)  # logged or evaluated


def _assert_weights(one, two):
    assert len(two["weights"]) == len(one["weights"])
    for i, (expected, got) in enumerate(zip(one["weights"], two["weights"], strict=True)):
        _close(f"weight {i} of {len(one['weights'])}", expected, got)


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", _cases("history"))
def test_history_and_steps_as_one_device(runs, name):
    _assert_history_and_steps(*_results(runs, name))


@pytest.mark.multiprocess
def test_text_example_first_epoch_as_one_device(runs):
    """Its cache is filled in epoch 1 on both sides; only later epochs' orders may differ."""
    one, two = _results(runs, "text_classification_from_scratch")
    assert two["iterations"] == one["iterations"], "optimizer.iterations"
    for key, values in one["history"].items():
        _close(f"History[{key!r}][0]", values[:1], two["history"][key][:1])


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", _cases("weights"))
def test_final_weights_as_one_device(runs, name):
    _assert_weights(*_results(runs, name))


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", OWN_STEPS)
def test_own_training_steps_on_two_workers_as_one_device(runs, name):
    one = runs[0][name]
    _skip_if_missing(one)
    assert "error" not in one, f"the unconverted example failed:\n{one.get('error')}"
    for i, worker in enumerate(runs[2]):
        assert "error" not in worker[name], f"worker {i} failed:\n{worker[name].get('error')}"
        _assert_history_and_steps(one, worker[name])
        _assert_weights(one, worker[name])


@pytest.mark.parametrize("name", EXAMPLES)
def test_lines_changed_as_stated(name):
    module = load(name)
    assert changed_lines(module) == module.LINES_CHANGED
    header = open(module.__file__).read().split("\n\n")[0]
    assert "Original: https://keras.io/" in header and "Changed for mirrorkit" in header


def test_every_example_is_listed():
    here = os.path.join(os.path.dirname(__file__), "keras_io")
    found = {f[:-3] for f in os.listdir(here) if f.endswith(".py") and not f.startswith("_")}
    assert found == set(EXAMPLES)
