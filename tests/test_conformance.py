"""The conformance matrix (issue 18, item 5): every input kind Keras's fit accepts trains under
mirrorkit exactly as on one device, or gets a clear error that names the fix.

Input kinds (`_conformance.CASES`) x placements x operations. The placements: one device in
its own fresh process (plain Keras, no strategy: the reference), 2 CPU replicas
(``mk.strategy(cpu_replicas=2)``) in a fresh process, and 2 real workers
(MultiWorkerMirroredStrategy over loopback, `_multiworker.run_workers`). The operations: fit
with validation data (History: loss, metrics, val_loss, val_metrics per epoch), evaluate,
predict (row count and order), the final weights, ``optimizer.iterations``, and the notices
mirrorkit must say. Each placement runs its cases in one process; each (case, operation)
comparison is its own test. Numbers agree within 1e-5.

Every cell is ``multiprocess`` (so ``slow``): one process per placement for every case, and
one 2-worker job, all started at once and shared by the module's tests.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from _conformance import CASES, run_all, write_data
from _multiworker import run_workers

from mirrorkit.launcher.processes import run_function

pytestmark = pytest.mark.multiprocess

TOLERANCE = 1e-5
OPERATIONS = ("fit", "evaluate", "predict", "weights", "iterations", "notices")

#: (case, operation) -> why that cell fails today on 2 replicas and on 2 workers; such a cell
#: is a strict xfail naming its cause (it fails the suite once it passes: then remove it here).
KNOWN: dict[tuple[str, str], str] = {}


def _cells():
    """Every (case, operation); a known upstream failure is a strict xfail."""
    cells = []
    for name, case in CASES.items():
        ops = ("error",) if case.error else OPERATIONS
        for op in ops:
            marks = []
            if (name, op) in KNOWN:
                marks.append(pytest.mark.xfail(strict=True, reason=KNOWN[name, op]))
            cells.append(pytest.param(name, op, id=f"{name}-{op}", marks=marks))
    return cells


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    path = tmp_path_factory.mktemp("conformance")
    write_data(str(path))
    return str(path)


@pytest.fixture(scope="module")
def all_runs(workdir):
    """(one device, 2 replicas, every worker's results) on every case.

    Three jobs (4 fresh processes) run at once.
    """
    with ThreadPoolExecutor(3) as pool:
        one = pool.submit(run_function, run_all, (workdir, "one_device"), timeout_s=1200)
        two = pool.submit(run_function, run_all, (workdir, "replicas"), timeout_s=1200)
        workers = pool.submit(run_workers, run_all, workdir, "workers", n=2, timeout_s=1200)
        return one.result()[0], two.result()[0], workers.result()


@pytest.fixture
def runs(all_runs):
    """Case name -> (one device, 2 replicas) results."""

    def get(name):
        return all_runs[0][name], all_runs[1][name]

    return get


def _close(what, expected, got):
    if isinstance(expected, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(expected), (
            f"{what}: keys {sorted(got) if isinstance(got, dict) else type(got)}, "
            f"one device {sorted(expected)}"
        )
        for key in expected:
            _close(f"{what}[{key!r}]", expected[key], got[key])
        return
    if isinstance(expected, list) and expected and not np.isscalar(expected[0]):
        assert len(got) == len(expected), f"{what}: {len(got)} parts, one device {len(expected)}"
        for i, (e, g) in enumerate(zip(expected, got, strict=True)):
            _close(f"{what}[{i}]", e, g)
        return
    expected, got = np.asarray(expected, dtype="float64"), np.asarray(got, dtype="float64")
    assert expected.shape == got.shape, f"{what}: shape {got.shape}, one device {expected.shape}"
    diff = float(np.max(np.abs(expected - got))) if expected.size else 0.0
    assert diff <= TOLERANCE, (
        f"{what} differs from one device by {diff:.3g} (tolerance {TOLERANCE}): "
        f"{got.tolist() if got.size <= 12 else ''} vs {expected.tolist() if got.size <= 12 else ''}"
    )


def _check(name, op, one, got, chief=True):
    case = CASES[name]
    if case.error:
        assert "error" in got, f"{name}: accepted without an error: {got.get('history')}"
        for text in case.error:
            assert text in got["error"], f"{name}: the error does not say {text!r}:\n{got['error']}"
        return
    assert "error" not in one, f"{name}: one device failed:\n{one.get('traceback')}"
    assert "error" not in got, f"{name}: failed under mirrorkit:\n{got.get('traceback')}"
    if op == "fit":
        _close("History", one["history"], got["history"])
    elif op == "evaluate":
        _close("evaluate", one["evaluate"], got["evaluate"])
    elif op == "predict":
        _close("predict", one["predict"], got["predict"])
    elif op == "weights":
        _close("weights", one["weights"], got["weights"])
    elif op == "iterations":
        assert got["iterations"] == one["iterations"], (
            f"optimizer.iterations {got['iterations']}, one device {one['iterations']}"
        )
    elif op == "notices" and chief:
        said = "\n".join(got["notices"])
        for text in case.notices:
            assert text in said, f"{name}: mirrorkit did not say {text!r}; it said:\n{said}"
            assert sum(text in line for line in got["notices"]) == 1, f"{text!r} said twice"
        for text in case.unsaid:
            assert text not in said, (
                f"{name}: mirrorkit said {text!r}, which is wrong here:\n{said}"
            )


@pytest.mark.parametrize(("name", "op"), _cells())
def test_two_replicas(runs, name, op):
    one, two = runs(name)
    _check(name, op, one, two)


@pytest.mark.parametrize(("name", "op"), _cells())
def test_two_workers(runs, all_runs, name, op):
    one = runs(name)[0]
    for index, results in enumerate(all_runs[2]):
        _check(name, op, one, results[name], chief=index == 0)


def test_every_placement_ran_every_case(all_runs):
    one, two, workers = all_runs
    assert list(one) == list(CASES) == list(two)
    assert all(list(worker) == list(CASES) for worker in workers)
