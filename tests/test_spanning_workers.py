"""On 2 real workers, what must span the replicas trains as one device in its own process.

Mixed precision with an overflow on worker 1 only (Keras alone: worker 0 applies the step
and waits in the all-reduce while worker 1 skips it, and the job hangs), clipping on the
averaged gradient, an in-batch softmax over the gathered global batch and a Dense layer on
sparse inputs into Adam. One 2-worker job runs every scenario; one fresh process gives the
one-device references. The 2-replica checks of each are tests/test_mixed_precision.py,
test_clipping.py, test_global_batch_loss.py and test_sparse_gradients.py.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from _multiworker import run_workers

from mirrorkit.launcher.processes import run_function

pytestmark = pytest.mark.multiprocess

TOLERANCE = 1e-5
FLOAT16_TOLERANCE = 2e-3


def _overflow_holders(strategy, inputs) -> list[bool]:
    """For each step: whether this worker's part of the batch holds the overflowing example."""
    return [
        bool(
            any(np.abs(part.numpy()).max() > 1e4 for part in strategy.experimental_local_results(x))
        )  # fmt: skip
        for x, _ in inputs
    ]


def mixed_precision(strategy):
    import keras
    import test_mixed_precision as mp

    import mirrorkit as mk

    x, y = mp.data()
    holders = _overflow_holders(
        strategy, mk.distribute((x, y), strategy, global_batch_size=mp.BATCH, shuffle=False)
    )
    result = mp.train(strategy)
    keras.mixed_precision.set_global_policy("float32")
    return {**result, "holders": holders}


def clipping(strategy):
    import test_clipping as clip

    model, history = clip.fit(strategy, **clip.CLIPPING["global_clipnorm"])
    return {"weights": model.get_weights(), "history": history,
            "iterations": int(model.optimizer.iterations.numpy())}  # fmt: skip


def in_batch(strategy):
    import test_global_batch_loss as ib

    model, loss = ib.fit(strategy)
    return {"weights": model.get_weights(), "history": {"loss": loss},
            "iterations": int(model.optimizer.iterations.numpy())}  # fmt: skip


def sparse(strategy):
    import test_sparse_gradients as sp

    model, history = sp.fit(strategy, sp.make_sparse_model, sp.multi_hot())
    return {"weights": model.get_weights(), "history": history,
            "iterations": int(model.optimizer.iterations.numpy())}  # fmt: skip


SCENARIOS = (mixed_precision, clipping, in_batch, sparse)


def run_all(one_device: bool):
    """In a fresh process or a worker: every scenario, on one device or on this job's workers."""
    import mirrorkit as mk

    strategy = mk.strategy("one_device") if one_device else mk.strategy()
    return {scenario.__name__: scenario(strategy) for scenario in SCENARIOS}


@pytest.fixture(scope="module")
def runs():
    with ThreadPoolExecutor(2) as pool:
        one = pool.submit(run_function, run_all, (True,), timeout_s=600)
        workers = pool.submit(run_workers, run_all, False, timeout_s=600)
        return one.result()[0], workers.result()


def _assert_as_one_device(one, worker, tolerance=TOLERANCE):
    assert worker["iterations"] == one["iterations"]
    for key, values in one["history"].items():
        np.testing.assert_allclose(worker["history"][key], values, atol=tolerance, err_msg=key)
    for i, (got, want) in enumerate(zip(worker["weights"], one["weights"], strict=True)):
        np.testing.assert_allclose(got, want, rtol=0, atol=tolerance, err_msg=f"weight {i}")


def test_an_overflow_on_worker_one_is_skipped_by_both_workers_without_a_hang(runs):
    one, workers = runs[0]["mixed_precision"], [w["mixed_precision"] for w in runs[1]]
    assert [w["holders"] for w in workers] == [[False] * 4, [False, True, False, False]]
    assert one["scales"] == [32768.0, 16384.0, 16384.0, 16384.0]
    for worker in workers:
        assert worker["scales"] == one["scales"]
        assert worker["iterations"] == one["iterations"]
        np.testing.assert_allclose(worker["loss"], one["loss"], rtol=FLOAT16_TOLERANCE)
        for got, want in zip(worker["weights"], one["weights"], strict=True):
            assert np.isfinite(got).all()
            np.testing.assert_allclose(got, want, rtol=0, atol=FLOAT16_TOLERANCE)


@pytest.mark.parametrize("scenario", ["clipping", "in_batch", "sparse"])
def test_both_workers_train_as_one_device(runs, scenario):
    for worker in runs[1]:
        _assert_as_one_device(runs[0][scenario], worker[scenario])
