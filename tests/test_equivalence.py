"""Data parallelism is one big batch: N replicas end where one device ends.

Each replica count trains in its own fresh process (TensorFlow fixes logical
devices at first use). The same model, weights, data and global batch must
give the same weights and the same loss and metric history within 1e-5.
"""

from __future__ import annotations

import numpy as np
import pytest
from _training import train_both_optimizers

TOLERANCE = 1e-5

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def one_device():
    from mirrorkit.launcher.processes import run_function

    return run_function(train_both_optimizers, (1,), timeout_s=300)[0]


def assert_same_run(got, want, tolerance=TOLERANCE):
    got_weights, got_history = got
    want_weights, want_history = want
    assert len(got_weights) == len(want_weights)
    for i, (g, w) in enumerate(zip(got_weights, want_weights, strict=True)):
        np.testing.assert_allclose(g, w, rtol=0, atol=tolerance, err_msg=f"weight {i}")
    assert got_history.keys() == want_history.keys()
    for key in want_history:
        np.testing.assert_allclose(
            got_history[key], want_history[key], rtol=0, atol=tolerance, err_msg=key
        )


@pytest.mark.parametrize("replicas", [2, 4])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_replicas_match_one_device(fresh, one_device, replicas, optimizer):
    runs = _runs_for(fresh, replicas)
    assert_same_run(runs[optimizer], one_device[optimizer])


_cache: dict[int, dict] = {}


def _runs_for(fresh, replicas):
    if replicas not in _cache:
        _cache[replicas] = fresh(train_both_optimizers, replicas)
    return _cache[replicas]


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_comparison_detects_unaveraged_gradients(fresh, one_device, optimizer):
    # Summed instead of averaged gradients over 2 replicas scale each step by 2,
    # as a doubled learning rate does. The comparison above must catch that.
    doubled = _doubled(fresh)
    with pytest.raises(AssertionError):
        assert_same_run(doubled[optimizer], one_device[optimizer])


def _doubled(fresh):
    if "doubled" not in _cache:
        _cache["doubled"] = fresh(train_both_optimizers, 2, 2.0)
    return _cache["doubled"]
