"""Clean output: TensorFlow's start-up lines, its notebook INFO log, whole-epoch plot ticks."""

import logging
import os
import subprocess
import sys
import textwrap

import pytest
from _quoted import assert_quoted_in, quoted_block

from mirrorkit.launcher.tf_noise import is_startup_line
from mirrorkit.strategies import tf_logging

# Lines TensorFlow 2.21 printed at start-up on this project's CPU machines, and older forms.
STARTUP_LINES = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1796015185.799183    5311 cudart_stub.cc:31] Could not find cuda drivers on "
    "your machine, GPU will not be used.",
    "I0000 00:00:1796015185.951365    5311 cpu_feature_guard.cc:227] This TensorFlow binary is "
    "optimized to use available CPU instructions in performance-critical operations.",
    "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow "
    "with the appropriate compiler flags.",
    "E0000 00:00:1796015190.667170    5311 cuda_platform.cc:52] failed call to cuInit: INTERNAL: "
    "CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
    "2024-05-01 12:00:00.123456: I tensorflow/core/util/port.cc:113] oneDNN custom operations "
    "are on. You may see slightly different numerical results due to floating-point round-off "
    "errors from different computation orders. To turn them off, set the environment variable "
    "`TF_ENABLE_ONEDNN_OPTS=0`.",
    "E0000 00:00:1719999999.123456   12345 cuda_dnn.cc:8310] Unable to register cuDNN factory: "
    "Attempting to register factory for plugin cuDNN when one has already been registered",
]

# Lines that look alike but say something real: they must come through.
REAL_LINES = [
    "E0000 00:00:1796015190.667170    5311 cuda_platform.cc:52] failed call to cuInit: "
    "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE (804)",  # a broken GPU set-up, not "no GPU"
    "E0000 00:00:1796015190.667170    5311 collective_ops.cc:1] Could not find cuda drivers",
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR!",
    "Epoch 1/3",
    "Traceback (most recent call last):",
    "mirrorkit: MirroredStrategy, 2 replicas on 1 worker (CPU:0-1)",
]


@pytest.mark.parametrize("line", STARTUP_LINES)
def test_known_startup_lines_are_recognised(line):
    assert is_startup_line(line)


@pytest.mark.parametrize("line", REAL_LINES)
def test_other_lines_are_not(line):
    assert not is_startup_line(line)


def _tf_worker():
    import tensorflow as tf

    print("worker computed", int(tf.constant(2) + 1), flush=True)


WORKER_SCRIPT = "import tensorflow as tf\nprint('worker computed', int(tf.constant(2) + 1))\n"


def _worker_lines(text):
    return [line[5:] for line in text.splitlines() if line.startswith("[w0] ")]


@pytest.mark.multiprocess
def test_mirrorkit_launch_drops_tf_startup_lines_unless_asked(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER_SCRIPT)
    base = [sys.executable, "-m", "mirrorkit", "launch", "-n", "1", "--no-pin", "--shared-network"]
    env = {k: v for k, v in os.environ.items() if k != "MIRRORKIT_TF_STARTUP_LOGS"}
    outputs = {}
    for keep in (False, True):
        flags = ["--tf-startup-logs"] if keep else []
        done = subprocess.run(
            [*base, *flags, "--log-dir", str(tmp_path / f"logs-{keep}"), str(script)],
            capture_output=True,
            text=True,
            timeout=240,
            env=env,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        outputs[keep] = _worker_lines(done.stdout)
        assert "worker computed 3" in outputs[keep]
    assert not [line for line in outputs[False] if is_startup_line(line)], outputs[False]
    kept = [line for line in outputs[True] if is_startup_line(line)]
    assert any("absl::InitializeLog" in line for line in kept), outputs[True]
    # The worker's own log file keeps everything.
    log = (tmp_path / "logs-False" / "worker-0.log").read_text()
    assert any(is_startup_line(line) for line in log.splitlines())


@pytest.mark.multiprocess
def test_mk_launch_drops_tf_startup_lines_unless_asked(capfd, monkeypatch):
    import mirrorkit as mk

    monkeypatch.delenv("MIRRORKIT_TF_STARTUP_LOGS", raising=False)
    for keep in (False, True):
        mk.launch(
            _tf_worker,
            num_workers=1,
            pin_cpus=False,
            private_network=False,
            tf_startup_logs=keep,
            timeout_s=240,
        )
        lines = _worker_lines(capfd.readouterr().out)
        assert "worker computed 3" in lines
        startup = [line for line in lines if is_startup_line(line)]
        if keep:
            assert any("absl::InitializeLog" in line for line in startup), lines
        else:
            assert not startup, lines
    assert "MIRRORKIT_TF_STARTUP_LOGS" not in os.environ  # tf_startup_logs=True left no trace


FIT_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import keras
    import mirrorkit as mk
    from mirrorkit.strategies import tf_logging

    if sys.argv[1] == "control":
        tf_logging._checked = True  # as if mirrorkit did not touch TensorFlow's logger
    strategy = mk.strategy(cpu_replicas=2)
    model = mk.build(lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]),
                     strategy)
    model.compile(optimizer="sgd", loss="mse")
    x = np.ones((64, 4), "float32")
    model.fit(mk.distribute((x, x[:, :1]), strategy, global_batch_size=16, seed=0), epochs=1,
              verbose=0)
    print("fit done", flush=True)
    """
)


@pytest.mark.multiprocess
def test_interactive_fit_prints_no_tensorflow_info_lines(tmp_path):
    # `python -i` is interactive the way a notebook kernel is: TensorFlow sets INFO itself.
    script = tmp_path / "fit.py"
    script.write_text(FIT_SCRIPT)
    outputs = {}
    for mode in ("mirrorkit", "control"):
        done = subprocess.run(
            [sys.executable, "-i", str(script), mode],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=240,
        )
        outputs[mode] = done.stdout + done.stderr
        assert "fit done" in outputs[mode], outputs[mode]
    assert "INFO:tensorflow" in outputs["control"]  # what a notebook showed before
    assert "INFO:tensorflow" not in outputs["mirrorkit"], outputs["mirrorkit"]
    assert "TensorFlow's INFO log is kept at WARNING" in outputs["mirrorkit"]  # said once
    said = outputs["mirrorkit"]
    assert_quoted_in(quoted_block("notebook.md", "puts that logger back to WARNING"), said)
    assert_quoted_in(quoted_block("keras-code.md", "one line on the chief:"), said)


@pytest.fixture
def tf_logger(monkeypatch):
    import tensorflow as tf

    logger = tf.get_logger()
    level, handlers = logger.level, list(logger.handlers)
    monkeypatch.setattr(tf_logging, "_checked", False)
    monkeypatch.setattr(tf_logging, "_interactive", lambda: True)
    yield logger
    logger.setLevel(level)
    logger.handlers[:] = handlers


def _tensorflow_default(logger):
    """What `tf.get_logger()` does in an interactive session (INFO, its own handler)."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(logging.BASIC_FORMAT, None))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def test_tensorflow_interactive_default_becomes_warning(tf_logger):
    _tensorflow_default(tf_logger)
    assert tf_logging.quiet_interactive_info()
    assert tf_logger.level == logging.WARNING
    tf_logger.setLevel(logging.INFO)  # the user asks again, after mk.strategy(): kept
    assert not tf_logging.quiet_interactive_info()
    assert tf_logger.level == logging.INFO


def test_a_level_the_user_set_is_kept(tf_logger):
    _tensorflow_default(tf_logger)
    tf_logger.setLevel(logging.DEBUG)
    assert not tf_logging.quiet_interactive_info()
    assert tf_logger.level == logging.DEBUG


def test_info_without_tensorflows_handler_is_the_users(tf_logger):
    tf_logger.handlers[:] = []  # the user configured logging (basicConfig) before TensorFlow
    tf_logger.setLevel(logging.INFO)
    assert not tf_logging.quiet_interactive_info()
    assert tf_logger.level == logging.INFO


def test_throughput_plot_shows_whole_epochs(tmp_path):
    pytest.importorskip("matplotlib")
    from mirrorkit.throughput.report import EpochThroughput, ThroughputReport

    report = ThroughputReport(2, 1, 64)
    for epoch in (1, 2, 3):
        report.epochs.append(EpochThroughput(epoch, 10, 1000.0, 500.0, 1000.0, 0.06, 0.07, 0.08, 1))
    figure = report.plot(str(tmp_path / "plot.png"))
    for axes in figure.axes:
        low, high = axes.get_xlim()
        ticks = [t for t in axes.get_xticks() if low <= t <= high]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
