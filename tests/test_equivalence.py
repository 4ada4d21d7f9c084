"""Data parallelism is one big batch: N replicas end where one device ends.

The one-device reference trains in a fresh process of its own (the session's
`one_device_runs`); the replica runs train in one other fresh process that
fixes 4 logical CPUs first and serves 2 replicas from them (each run on a
strategy and model of its own). The same model, weights, data and global batch
must give the same weights and the same loss and metric history within 1e-5.
"""

from __future__ import annotations

import numpy as np
import pytest

TOLERANCE = 1e-5

pytestmark = pytest.mark.multiprocess


#: (replicas, learning-rate scale) of the runs: 4 first, so that the process fixes 4 CPUs.
RUNS = [(4, 1.0), (2, 1.0), (2, 2.0)]


def _replica_runs():
    """In one fresh process: `train_both_optimizers` for every entry of RUNS."""
    from _training import train_both_optimizers

    return {run: train_both_optimizers(*run) for run in RUNS}


@pytest.fixture(scope="module")
def replica_runs():
    from mirrorkit.launcher.processes import run_function

    return run_function(_replica_runs, timeout_s=300)[0]


@pytest.fixture(scope="module")
def one_device(one_device_runs):
    return one_device_runs


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
def test_replicas_match_one_device(replica_runs, one_device, replicas, optimizer):
    assert_same_run(replica_runs[replicas, 1.0][optimizer], one_device[optimizer])


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_comparison_detects_unaveraged_gradients(replica_runs, one_device, optimizer):
    # Summed instead of averaged gradients over 2 replicas scale each step by 2,
    # as a doubled learning rate does. The comparison above must catch that.
    with pytest.raises(AssertionError):
        assert_same_run(replica_runs[2, 2.0][optimizer], one_device[optimizer])
