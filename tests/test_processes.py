"""The fresh-process runner under mk.launch and the tests."""

import io
import os
import time

import pytest

from mirrorkit.launcher.processes import WorkerError, run_function

pytestmark = pytest.mark.multiprocess


def _rank_env(i):
    return {"RANK_UNDER_TEST": str(i)}


def _report():
    import os

    print("hello from", os.environ["RANK_UNDER_TEST"])
    return int(os.environ["RANK_UNDER_TEST"]) * 10


def test_values_and_prefixed_output():
    out = io.StringIO()
    assert run_function(_report, num_processes=2, env=_rank_env, stream=out) == [0, 10]
    lines = out.getvalue().splitlines()
    assert "[w0] hello from 0" in lines and "[w1] hello from 1" in lines


def _fail_on_one(pid_dir):
    import os
    import time

    rank = int(os.environ["RANK_UNDER_TEST"])
    open(os.path.join(pid_dir, str(os.getpid())), "w").close()
    if rank == 1:
        raise ValueError("worker one gives up")
    time.sleep(120)


def test_first_failure_stops_the_rest(tmp_path):
    start = time.monotonic()
    with pytest.raises(WorkerError) as err:
        run_function(
            _fail_on_one, (str(tmp_path),), num_processes=2, env=_rank_env, stream=io.StringIO()
        )
    assert time.monotonic() - start < 30
    assert err.value.worker == 1 and err.value.exit_code == 1
    assert "ValueError: worker one gives up" in err.value.worker_traceback
    for pid in os.listdir(tmp_path):
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)


def test_timeout_stops_everyone(tmp_path):
    with pytest.raises(TimeoutError, match="within 3 s"):
        run_function(
            _fail_on_one,
            (str(tmp_path),),
            env=lambda i: {"RANK_UNDER_TEST": "0"},
            timeout_s=3,
            stream=io.StringIO(),
        )
    for pid in os.listdir(tmp_path):
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)


def test_lambda_and_closure_travel():
    base = 5
    assert run_function(lambda x: x + base, (2,), stream=io.StringIO()) == [7]
