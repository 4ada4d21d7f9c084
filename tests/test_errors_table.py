"""docs/errors.md is a test: every row's input still gets the message the row shows.

Each row of the table has an id; `CASES` maps the id to a function that gives
that input. A case either raises (the row shows the exception's type) or, for
the command line, returns ``("exit N", stderr)``; a notice (no error, but
something printed) returns ``("notice", stderr)``. The row's message must be a
substring of what comes back, and every row has a case and every case a row.
Every row also says what to do (its last column, "What to do", is not empty).
Everything runs in this process (4 logical CPUs, so 2 replicas) or as a
quick subprocess; nothing downloads.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import os
import pathlib
import re
import sys
import threading
from collections.abc import Callable

import numpy as np
import pytest
from _models import tiny_model

import mirrorkit as mk
from mirrorkit import notices
from mirrorkit.cluster import cluster_info
from mirrorkit.commands import launch
from mirrorkit.compat.keras_tuner_trials import same_trial
from mirrorkit.compat.shared_monitor import agreed_value

TABLE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "errors.md"
#: A table cell: anything but an unescaped ``|``.
_CELL = r"(?:[^|\\]|\\.)*"
#: A row: | `id` | input | `kind`: `message` | what to do |
ROW = re.compile(
    rf"^\| `(?P<id>[a-z0-9-]+)` \|(?P<input>{_CELL})"
    rf"\| `(?P<kind>[^`]+)`: (?P<message>{_CELL}?) \|(?P<what_to_do>{_CELL})\|$"
)
#: The header every table of the page has.
HEADER = ["Id", "Input", "You see", "What to do"]


def _matches() -> list[re.Match]:
    """Every row of the page's tables, each matched by `ROW` (a row that does not match fails)."""
    matches = []
    for line in TABLE.read_text().splitlines():
        if line.startswith("| `"):
            match = ROW.match(line)
            assert match, f"not | `id` | input | `kind`: `message` | what to do |: {line}"
            matches.append(match)
    return matches


def _rows() -> dict[str, tuple[str, str]]:
    rows = {}
    for match in _matches():
        assert match["id"] not in rows, f"row id {match['id']} appears twice"
        message = match["message"].strip()
        assert message.startswith("`") and message.endswith("`"), match[0]
        # a message that holds backticks is a double-backtick span: `` a `b` c ``
        text = message[3:-3] if message.startswith("`` ") else message[1:-1]
        rows[match["id"]] = (match["kind"], text.replace("\\|", "|"))
    return rows


# --- helpers ---------------------------------------------------------------------------------


def _strategy2():
    return mk.strategy(cpu_replicas=2)


def _xy(n=16, m=None):
    return np.ones((n, 3), "float32"), np.ones((n if m is None else m, 1), "float32")


def _distribute(data, **kwargs):
    kwargs.setdefault("global_batch_size", 8)
    return lambda: mk.distribute(data, _strategy2(), **kwargs)


def _env(**env) -> Callable[[], object]:
    return lambda: cluster_info.from_environment(env)


def _tf_config(text: str) -> Callable[[], object]:
    return _env(TF_CONFIG=text)


def _notice(fn: Callable[[], object]) -> Callable[[], tuple[str, str]]:
    def run():
        saved = set(notices._said)
        notices._said.clear()
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                fn()
        finally:
            notices._said.clear()  # what the case said stays unsaid for later tests
            notices._said.update(saved)
        return "notice", err.getvalue()

    return run


def _launch(*argv: str) -> Callable[[], tuple[str, str]]:
    """`mirrorkit launch ARGV` in this process: its exit code and what it wrote to stderr."""

    def run():
        parser = argparse.ArgumentParser(prog="mirrorkit launch")
        launch.add_arguments(parser)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                code = launch.run(parser.parse_args(list(argv)))
            except SystemExit as exit_:  # argparse
                code = exit_.code
        return f"exit {code}", err.getvalue()

    return run


def _hang_watchdog_from_env(value: str) -> Callable[[], object]:
    def run():
        old = os.environ.get("MIRRORKIT_HANG_TIMEOUT")
        os.environ["MIRRORKIT_HANG_TIMEOUT"] = value
        try:
            return mk.callbacks.HangWatchdog()
        finally:
            if old is None:
                del os.environ["MIRRORKIT_HANG_TIMEOUT"]
            else:
                os.environ["MIRRORKIT_HANG_TIMEOUT"] = old

    return run


def _launch_layout(*argv: str) -> Callable[[], object]:
    def run():
        parser = argparse.ArgumentParser(prog="mirrorkit launch")
        launch.add_arguments(parser)
        return launch.layout(parser.parse_args(list(argv)), env={})

    return run


def _sleep_script(tmp: pathlib.Path) -> str:
    path = tmp / "sleeps.py"
    path.write_text("import time\ntime.sleep(60)\n")
    return str(path)


def _worker_functions():
    """The functions mk.launch sends to its workers, defined here so that cloudpickle sends
    them by value: sent by reference, each worker would import this module, and with it
    TensorFlow (seconds of CPU per worker).
    """

    def returns_lock():
        return threading.Lock()

    def raises_in_worker():
        raise ValueError("bad learning rate")

    return returns_lock, raises_in_worker


_returns_lock, _raises_in_worker = _worker_functions()


def _launch_inside_worker():
    config = '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"index": 1}}'
    old = os.environ.get("TF_CONFIG")
    os.environ["TF_CONFIG"] = config.replace('{"index"', '{"type": "worker", "index"')
    try:
        mk.launch(_returns_lock, num_workers=2)
    finally:
        if old is None:
            del os.environ["TF_CONFIG"]
        else:
            os.environ["TF_CONFIG"] = old


def _sagemaker_hosts_alone():
    from mirrorkit.cluster import platforms

    saved = {k: os.environ.get(k) for k in ("SM_HOSTS", "SM_CURRENT_HOST")}
    os.environ.update(SM_HOSTS='["algo-1", "algo-2"]', SM_CURRENT_HOST="algo-1")
    try:
        platforms.say_notices()  # mk.strategy() calls it
    finally:
        for key, value in saved.items():
            if value is None:
                del os.environ[key]
            else:
                os.environ[key] = value


class DataFrame:
    """A stand-in with pandas' module and name: pandas is not installed in the test env."""

    __module__ = "pandas.core.frame"

    def __init__(self, columns):
        self._columns = columns

    def to_numpy(self):
        return np.stack(list(self._columns.values()), axis=1)


def _generator():
    yield from range(10)


def _padded():
    import tensorflow as tf

    return tf.data.Dataset.range(20).map(lambda i: tf.fill([i % 3 + 1], i)).padded_batch(4)


def _batched(size=10, count=64):
    import tensorflow as tf

    return tf.data.Dataset.range(count).batch(size)


def _compiled_outside_scope():
    import keras

    strategy = _strategy2()
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(mk.distribute(_xy(), strategy, global_batch_size=8), verbose=0)


def _fit_model_outside_scope():
    strategy = _strategy2()
    model = tiny_model()
    model.fit(mk.distribute(_xy(), strategy, global_batch_size=8), verbose=0)


def _validation_split_on_a_dataset():

    strategy = _strategy2()
    with strategy.scope():
        model = tiny_model()
    model.fit(mk.distribute(_xy(), strategy, global_batch_size=8), validation_split=0.2)


def _filtered_batches():
    import tensorflow as tf

    return tf.data.Dataset.range(64).filter(lambda i: i % 7 > 0).batch(8)


def _zip_of_batches():
    import tensorflow as tf

    xs, ys = (tf.data.Dataset.range(64).map(lambda i: tf.cast(i, tf.float32)) for _ in range(2))
    return tf.data.Dataset.zip((xs.batch(10), ys.batch(10)))


def _hidden_batches():
    import tensorflow as tf

    return tf.data.Dataset.range(64).batch(8).flat_map(tf.data.Dataset.from_tensors)


def _tfds_not_prepared(tmp: pathlib.Path):
    from _tfds_builder import TinyImages  # noqa: F401 - registers tiny_images

    return mk.distribute(
        "tiny_images", _strategy2(), global_batch_size=8, split="train", data_dir=str(tmp)
    )


def _nan_guard_with_loss_scaling():
    import keras

    model = tiny_model(optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()))
    x, y = _xy(8)
    model.fit(x, y, epochs=1, verbose=0, callbacks=[mk.callbacks.NaNGuard(check_loss=False)])


def _nan_guard_with_own_update():
    from _models import own_update_model

    x, y = _xy(16)
    model = mk.build(own_update_model, _strategy2())
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[mk.callbacks.NaNGuard()])


def _preemption_other_batch(tmp: pathlib.Path):
    """A preemption checkpoint of global batch 32 (the variable alone), resumed with 16."""
    import signal

    import tensorflow as tf

    ckpt = str(tmp / "preempt-32")
    saved = tf.train.Checkpoint(mirrorkit_global_batch=tf.Variable(32, dtype=tf.int64))
    tf.train.CheckpointManager(saved, ckpt, max_to_keep=1).save()
    strategy = _strategy2()
    model = mk.build(tiny_model, strategy)
    data = mk.distribute(_xy(32), strategy, global_batch_size=16, shuffle=False)
    before = signal.getsignal(signal.SIGTERM)  # TensorFlow's handler watches SIGTERM
    try:
        model.fit(data, epochs=1, verbose=0, callbacks=[mk.PreemptionCheckpoint(ckpt, data)])
    finally:
        signal.signal(signal.SIGTERM, before)


def _preemption_fit(ckpt: str, compile_kwargs: dict, data_fn) -> None:
    """`fit` of a tiny model with `mk.PreemptionCheckpoint` (raises at the start of fit)."""
    strategy = _strategy2()
    model = mk.build(lambda: tiny_model(**compile_kwargs), strategy)
    model.fit(data_fn(strategy), epochs=1, verbose=0, callbacks=[mk.PreemptionCheckpoint(ckpt, 16)])


def _unknown_length(strategy):
    import tensorflow as tf

    x, y = _xy(32)
    data = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda a, b: True)
    return mk.distribute(data, strategy, global_batch_size=16, shuffle=False)


def _flags(*argv: str) -> Callable[[], object]:
    def run():
        from absl import flags

        from mirrorkit import flags as mk_flags

        values = flags.FlagValues()
        mk_flags.define_flags(values)
        values(["prog", *argv])

    return run


def _on_the_jax_backend():
    """`mk.strategy()` where Keras says it runs on JAX (keras.backend.backend(); no jax needed)."""
    from unittest import mock

    with mock.patch("keras.backend.backend", return_value="jax"):
        return mk.strategy()


def _cases(tmp: pathlib.Path) -> dict[str, Callable[[], object]]:
    tf_config_2 = '{"cluster": {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}'
    slurm_step = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "n[1-2]"}
    slurm_step.update(SLURM_STEP_TASKS_PER_NODE="1(x2)", SLURMD_NODENAME="n1", SLURM_LOCALID="0")
    return {
        # strategy arguments
        "strategy-backend": _on_the_jax_backend,
        "strategy-kind": lambda: mk.strategy("mirror"),
        "strategy-all-reduce": lambda: mk.strategy(cpu_replicas=2, all_reduce="allgather"),
        "strategy-num-gpus": lambda: mk.strategy(num_gpus=4),
        "strategy-cpu-replicas-float": lambda: mk.strategy(cpu_replicas=2.0),
        "strategy-cpu-replicas-zero": lambda: mk.strategy(cpu_replicas=0),
        "strategy-cpu-replicas-fixed": lambda: mk.strategy(cpu_replicas=8),
        "strategy-two-device-choices": lambda: mk.strategy(devices=["CPU:0"], cpu_replicas=2),
        "strategy-devices-string": lambda: mk.strategy(devices="CPU:0"),
        "strategy-device-missing": lambda: mk.strategy("mirrored", devices=["CPU:0", "CPU:9"]),
        "strategy-nccl-on-cpus": lambda: mk.strategy(cpu_replicas=2, all_reduce="nccl"),
        "strategy-nccl-no-gpu": lambda: mk.strategy(all_reduce="nccl"),
        "strategy-bucket-mb": lambda: mk.strategy(cpu_replicas=2, bucket_mb=-1),
        "strategy-timeout-s": lambda: mk.strategy(cpu_replicas=2, timeout_s=0),
        "strategy-bucket-reduce-to-one": lambda: mk.strategy(
            cpu_replicas=2, all_reduce="reduce_to_one", bucket_mb=4
        ),
        "strategy-one-device-all-reduce": lambda: mk.strategy("one_device", all_reduce="ring"),
        "strategy-one-device-replicas": lambda: mk.strategy("one_device", cpu_replicas=2),
        "strategy-off-num-gpus": lambda: mk.strategy("off", num_gpus=1),
        "strategy-multi-worker-cpu-replicas": lambda: mk.strategy("multi_worker", cpu_replicas=2),
        "strategy-startup-timeout": lambda: mk.strategy("multi_worker", startup_timeout_s=-5),
        "strategy-startup-timeout-type": lambda: mk.strategy(startup_timeout_s="600"),
        # TF_CONFIG and Slurm
        "tf-config-json": _tf_config('{"cluster": '),
        "tf-config-no-cluster": _tf_config('{"task": {"type": "worker", "index": 0}}'),
        "tf-config-job": _tf_config('{"cluster": {"workers": ["a:1"]}}'),
        "tf-config-address": _tf_config('{"cluster": {"worker": ["localhost"]}}'),
        "tf-config-port": _tf_config('{"cluster": {"worker": ["a:70000"]}}'),
        "tf-config-no-task": _tf_config(tf_config_2 + "}"),
        "tf-config-task-type": _tf_config(tf_config_2 + ', "task": {"type": "chief", "index": 0}}'),
        "tf-config-index": _tf_config(tf_config_2 + ', "task": {"type": "worker", "index": 2}}'),
        "tf-config-index-type": _tf_config(
            tf_config_2 + ', "task": {"type": "worker", "index": "1"}}'
        ),
        "tf-config-ps": _tf_config(
            '{"cluster": {"ps": ["a:1"], "worker": ["b:1"]},'
            ' "task": {"type": "worker", "index": 0}}'
        ),
        "sagemaker-no-tf-config": _notice(_sagemaker_hosts_alone),
        "slurm-tasks-per-node": _env(**{**slurm_step, "SLURM_STEP_TASKS_PER_NODE": "two"}),
        "slurm-nodelist": _env(**{**slurm_step, "SLURM_STEP_NODELIST": "n[1-"}),
        "slurm-localid": _env(**{**slurm_step, "SLURM_LOCALID": "first"}),
        # mirrorkit launch
        "launch-missing-script": _launch("--no-pin", str(tmp / "missing.py")),
        "launch-nproc-word": _launch("-n", "two", "train.py"),
        "launch-nproc-zero": _launch("-n", "0", "train.py"),
        "launch-port-range": _launch("--port", "70000", "train.py"),
        "launch-reach-format": _launch("--reach", "8000", "train.py"),
        "launch-reach-elsewhere": _launch("--reach", "10.1.2.3:8000", "train.py"),
        "launch-port-hosts": _launch_layout(
            "--port", "65535", "--hosts", "a,b", "--node-rank", "0", "train.py"
        ),
        "launch-nnodes-no-hosts": _launch_layout("--nnodes", "2", "train.py"),
        "launch-nnodes-mismatch": _launch_layout(
            "--nnodes", "3", "--hosts", "a,b", "--node-rank", "0", "train.py"
        ),
        "launch-no-node-rank": _launch_layout("--hosts", "a,b", "train.py"),
        "launch-node-rank-range": _launch_layout("--hosts", "a,b", "--node-rank", "2", "train.py"),
        "launch-hang-timeout": _launch("-n", "2", "--hang-timeout", "0", "train.py"),
        "launch-max-restarts": _launch("-n", "2", "--max-restarts", "-1", "train.py"),
        "launch-host-port": _launch_layout("--hosts", "a,b:x", "--node-rank", "0", "train.py"),
        "launch-timeout": _launch(
            "--timeout", "3", "--no-pin", "--shared-network", _sleep_script(tmp)
        ),
        # mk.launch
        "mk-launch-num-workers": lambda: mk.launch(_returns_lock, num_workers=0),
        "mk-launch-unpicklable": lambda: mk.launch(
            _returns_lock, num_workers=1, pin_cpus=False, private_network=False
        ),
        "mk-launch-worker-raises": lambda: mk.launch(
            _raises_in_worker, num_workers=1, pin_cpus=False, private_network=False
        ),
        "mk-launch-in-worker": _launch_inside_worker,
        # batch sizes
        "batch-neither": _distribute(_xy(), global_batch_size=None),
        "batch-both": _distribute(_xy(), per_replica_batch_size=4),
        "batch-indivisible": _distribute(_xy(), global_batch_size=33),
        "batch-zero": _distribute(_xy(), global_batch_size=None, per_replica_batch_size=0),
        "batch-float": _distribute(_xy(), global_batch_size=8.0),
        "batch-larger-than-data": _distribute(_xy(3)),
        # data sources
        "data-mismatched-rows": _distribute(_xy(10, 9)),
        "data-empty": _distribute(_xy(0)),
        "data-padded-batch": _distribute(_padded()),
        "data-already-batched": _notice(_distribute(_batched(), global_batch_size=16)),
        "data-batches-kept": _notice(_distribute(_batched(), global_batch_size=None)),
        "data-batch-indivisible": _distribute(_batched(9), global_batch_size=None),
        "data-batches-uneven-last": _notice(_distribute(_batched(8, 63), global_batch_size=None)),
        "data-batches-uneven-kept": _notice(
            _distribute(_batched(8, 63), global_batch_size=None, drop_remainder=False)
        ),
        "data-class-weight-type": _distribute(_xy(), class_weight=[1.0, 2.0]),
        "data-class-weight-eval": _distribute(_xy(), for_eval=True, class_weight={0: 1.0}),
        "data-unknown-length": _notice(_distribute(_filtered_batches(), global_batch_size=None)),
        "data-zip-of-batches": _notice(_distribute(_zip_of_batches(), global_batch_size=16)),
        "data-maybe-batched": _notice(_distribute(_hidden_batches(), global_batch_size=16)),
        "data-ragged-lists": _distribute(([[1.0, 2.0], [3.0]], [0.0, 1.0])),
        "data-ragged-object-array": _distribute(
            np.array([np.ones(2), np.ones(3)], dtype=object), global_batch_size=2
        ),
        "data-generator": _distribute(_generator()),
        "data-generator-function": lambda: list(
            mk.distribute(lambda context: _generator(), _strategy2(), global_batch_size=8)
        ),
        "data-pandas": _distribute(DataFrame({"a": np.ones(8), "b": np.zeros(8)})),
        "data-tfds-not-prepared": lambda: _tfds_not_prepared(tmp),
        "data-shard": _distribute(_xy(), shard="rows"),
        "data-eval-shuffle": _distribute(_xy(), for_eval=True, shuffle=True),
        "data-eval-drop": _distribute(_xy(), for_eval=True, drop_remainder=True),
        # mk.build and callbacks
        "build-model-not-function": lambda: mk.build(tiny_model(), _strategy2()),
        "build-returns-none": lambda: mk.build(lambda: None, _strategy2()),
        "compile-outside-scope": _compiled_outside_scope,
        "fit-model-outside-scope": _fit_model_outside_scope,
        "fit-validation-split-dataset": _validation_split_on_a_dataset,
        "build-step-logs": lambda: mk.build(tiny_model, _strategy2(), step_logs="worker"),
        "build-compression": lambda: mk.build(
            tiny_model, _strategy2(), gradient_compression="int8"
        ),
        "throughput-baseline-missing": lambda: mk.ThroughputCallback(baseline="missing.json"),
        "throughput-baseline-negative": lambda: mk.ThroughputCallback(baseline=-5),
        "sync-check-every": lambda: mk.callbacks.ReplicaSyncCheck(every_n_steps=0),
        "nan-guard-loss-scale": _nan_guard_with_loss_scaling,
        "tuner-different-trials": lambda: same_trial(  # the table 2 workers share
            np.array([[2.0, 0.0, 7.0], [2.0, 1.0, 9.0]])
        ),
        "callbacks-hang-timeout": lambda: mk.callbacks.HangWatchdog(0),
        "callbacks-monitor-some-workers": lambda: agreed_value(  # the table 2 workers share
            "EarlyStopping", "m", 0.5, np.array([[1.0, 0.5], [0.0, 0.0]])
        ),
        "callbacks-hang-timeout-env": _hang_watchdog_from_env("soon"),
        "nan-guard-unchecked-step": _nan_guard_with_own_update,
        # restart, preemption and rescale
        "resumable-dir": lambda: mk.resumable(""),
        "preemption-dir": lambda: mk.PreemptionCheckpoint("", 32),
        "preemption-batch-size": lambda: mk.PreemptionCheckpoint("ckpt", "big"),
        "preemption-other-batch": lambda: _preemption_other_batch(tmp),
        "preemption-steps-per-execution": lambda: _preemption_fit(
            str(tmp / "p-spe"),
            {"steps_per_execution": 2},
            lambda s: mk.distribute(_xy(32), s, global_batch_size=16, shuffle=False),
        ),
        "preemption-epoch-length": lambda: _preemption_fit(str(tmp / "p-len"), {}, _unknown_length),
        # mirrorkit.flags
        "flags-batch-both": _flags("--batch_size=64", "--per_replica_batch_size=8"),
        "flags-bucket-mb": _flags("--bucket_mb=0"),
        "flags-task-index": _flags("--worker_hosts=a:1,b:2", "--task_index=2"),
        "flags-strategy": _flags("--distribution_strategy=bogus"),
        "flags-one-device": _flags("--distribution_strategy=one_device", "--cpu_replicas=2"),
    }


def outcome(fn: Callable[[], object]) -> tuple[str, str]:
    """What a case gives: (exception type name, message) or what it returned."""
    try:
        result = fn()
    except Exception as err:  # noqa: BLE001 - every error is what the table shows
        return type(err).__name__, str(err)
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], str):
        return result
    return "no error", repr(result)


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("errors")
    cwd, said = os.getcwd(), set(notices._said)
    os.chdir(tmp)  # the relative paths (missing.json, train.py) resolve here
    try:
        yield _cases(tmp)
    finally:
        os.chdir(cwd)
        notices._said.clear()  # notices said by these cases stay unsaid for later tests
        notices._said.update(said)


def test_every_row_has_a_case_and_every_case_a_row(cases):
    rows = _rows()
    assert len(rows) >= 40
    assert sorted(set(rows) - set(cases)) == [], "rows without a case"
    assert sorted(set(cases) - set(rows)) == [], "cases without a row"


def test_every_row_says_what_to_do():
    lines = TABLE.read_text().splitlines()
    headers = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line, below in zip(lines, lines[1:], strict=False)
        if line.startswith("|") and re.fullmatch(r"\|(?: ?:?-+:? ?\|)+", below.strip())
    ]
    assert headers, "no table"
    assert all(header == HEADER for header in headers), headers
    empty = [match["id"] for match in _matches() if not match["what_to_do"].strip()]
    assert empty == [], "rows whose What to do cell is empty"


@pytest.mark.parametrize("row_id", sorted(_rows()))
def test_row_still_gets_its_error(cases, row_id):
    kind, message = _rows()[row_id]
    got_kind, got_message = outcome(cases[row_id])
    assert (got_kind, message in got_message) == (kind, True), got_message


def _printed(fn: Callable[[], object]) -> str:
    """What a case shows: a notice's text, or its error as Python's last traceback line."""
    kind, text = outcome(fn)
    return text if kind == "notice" else f"{kind}: {text}"


def test_the_errors_other_pages_quote_are_what_their_cases_give(cases):
    """The errors and notices other user pages quote in full, from this table's cases."""
    from _quoted import assert_quoted_in, quoted_block

    nccl = quoted_block("keras-code.md", "On CPU replicas, `mk.strategy` stops with:")
    assert_quoted_in(nccl, _printed(cases["strategy-nccl-on-cpus"]))
    jax = quoted_block("versions.md", "On another backend, `mk.strategy()` stops")
    assert_quoted_in(jax, _printed(cases["strategy-backend"]))
    ps = quoted_block("multi-worker.md", "A `ps` job (parameter servers) is refused")
    assert_quoted_in(ps, _printed(cases["tf-config-ps"]))
    sagemaker = _printed(cases["sagemaker-no-tf-config"])
    assert_quoted_in(quoted_block("multi-worker.md", "then warns, on the first host"), sagemaker)
    alone = quoted_block("clusters/sagemaker.md", "warns about it on `algo-1` only:")
    assert_quoted_in(alone, sagemaker)
    master = quoted_block("clusters/kubeflow.md", "A `master` job is refused:")
    assert_quoted_in(master, _printed(_tf_config('{"cluster": {"master": ["a:1"]}}')))
    outside = quoted_block("index.md", "A model made in the block but compiled after it")
    assert_quoted_in(outside, _printed(cases["compile-outside-scope"]))


if __name__ == "__main__":  # print what every case gives today, to write the table
    import tempfile

    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    import conftest

    conftest.pytest_configure(None)  # the same 4 logical CPUs as under pytest
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        for case_id, fn in _cases(pathlib.Path(tmp)).items():
            kind, text = outcome(fn)
            print(f"## {case_id}\n{kind}: {text[:700]}\n", flush=True)


def _package_messages() -> str:
    """Every string of mirrorkit's code, an f-string's values written ``{}``, one per line."""
    texts = []
    for path in sorted((TABLE.parent.parent / "mirrorkit").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.JoinedStr):
                texts.append(
                    "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
                )
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                texts.append(node.value)
    return "\n".join(texts)


def test_the_messages_explained_elsewhere_are_mirrorkit_s():
    """Each quoted part of "Messages explained on other pages" is in a message of the code."""
    section = TABLE.read_text().split("## Messages explained on other pages", 1)[1]
    quoted = re.findall(r"^- `([^`]+)`(?:, then `([^`]+)`)?", section, re.MULTILINE)
    assert len(quoted) >= 4, section
    code = _package_messages()
    for parts in quoted:
        for part in filter(None, parts):
            # a number in the quote is a value the message formats in: {} in the code
            pattern = r"(?:\d+|\{\})".join(re.escape(p) for p in re.split(r"\d+", part))
            assert re.search(pattern, code), f"errors.md quotes {part!r}; no message says it"
