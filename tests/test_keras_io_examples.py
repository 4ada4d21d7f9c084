"""keras.io examples converted to mirrorkit train as the unconverted example does on one device.

Each example in ``tests/keras_io/`` (issue 18, item 6) runs twice, deterministically: as the
keras.io code on one device, and converted to mirrorkit on 2 CPU replicas. Every example of
one placement runs in one fresh process (TensorFlow starts once per placement), the two
placements at the same time; each example's comparisons are their own tests. Loss and metric
history, ``optimizer.iterations`` and any evaluation, and the final weights must agree within
1e-5. `KNOWN_DIFFERENCES` lists the comparisons that differ for reasons outside mirrorkit.
The count of lines each conversion changed is checked against what its header states.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from keras_io import EXAMPLES, changed_lines, load, run_all, write_all

from mirrorkit.launcher.processes import run_function

TOLERANCE = 1e-5
REPLICAS = 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(one device, 2 replicas): example name -> outcome, each placement in a fresh process."""
    workdirs = {}
    for placement in ("one_device", "replicas"):
        workdirs[placement] = str(tmp_path_factory.mktemp(f"keras_io_{placement}"))
        write_all(workdirs[placement])  # the same stand-in data twice; checkpoints kept apart
    with ThreadPoolExecutor(2) as pool:
        one = pool.submit(run_function, run_all, (workdirs["one_device"], None), timeout_s=900)
        two = pool.submit(run_function, run_all, (workdirs["replicas"], REPLICAS), timeout_s=900)
        return one.result()[0], two.result()[0]


def _close(what, expected, got):
    expected, got = np.asarray(expected, dtype="float64"), np.asarray(got, dtype="float64")
    assert expected.shape == got.shape, f"{what}: shape {got.shape}, one device {expected.shape}"
    diff = float(np.max(np.abs(expected - got))) if expected.size else 0.0
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


def _results(runs, name):
    one, two = runs[0][name], runs[1][name]
    assert "error" not in one, f"the unconverted example failed:\n{one.get('error')}"
    assert "error" not in two, f"the example on {REPLICAS} replicas failed:\n{two.get('error')}"
    return one, two


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", _cases("history"))
def test_history_and_steps_as_one_device(runs, name):
    one, two = _results(runs, name)
    assert two["iterations"] == one["iterations"], "optimizer.iterations"
    assert sorted(two["history"]) == sorted(one["history"]), "History keys"
    for key, values in one["history"].items():
        _close(f"History[{key!r}]", values, two["history"][key])
    for key in sorted(set(one) - {"history", "weights", "iterations"}):
        _close(key, one[key], two[key])


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
    one, two = _results(runs, name)
    assert len(two["weights"]) == len(one["weights"])
    for i, (expected, got) in enumerate(zip(one["weights"], two["weights"], strict=True)):
        _close(f"weight {i} of {len(one['weights'])}", expected, got)


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
