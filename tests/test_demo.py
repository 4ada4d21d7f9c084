"""`mirrorkit demo`: the bundled digits, the stated accuracy, tfds data sets, bad input."""

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from _quoted import assert_quoted_in, quoted_block

from mirrorkit.demo import data

DEMO = [sys.executable, "-m", "mirrorkit", "demo"]


def _run(args, timeout=300, no_network=False, **kw):
    command = [*DEMO, *args]
    if no_network:
        if (
            shutil.which("unshare") is None
            or subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode
        ):
            pytest.skip("cannot make a network namespace here to prove no network is used")
        command = ["unshare", "-rn", *command]  # loopback only: a download would fail
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kw)


def test_bundled_digits_load_with_the_right_shape_and_labels():
    images, labels = data.load_digits()
    assert images.shape == (1797, 8, 8) and images.dtype == np.uint8
    assert labels.shape == (1797,) and labels.dtype == np.uint8
    assert images.min() == 0 and images.max() == 16  # 4x4 block counts of a 32x32 bitmap
    counts = np.bincount(labels)
    assert len(counts) == 10 and counts.min() == 174 and counts.max() == 183
    assert labels[:10].tolist() == list(range(10))
    # The first image is a zero: ink around an empty centre.
    assert images[0, 3:5, 3:5].sum() == 0 and images[0].sum() > 200


def test_the_split_is_fixed_stratified_and_disjoint():
    (x_train, y_train), (x_test, y_test) = data.split_digits()
    (x_train2, _), (x_test2, _) = data.split_digits()
    assert np.array_equal(x_train, x_train2) and np.array_equal(x_test, x_test2)
    assert x_train.shape[1:] == (8, 8, 1) and len(x_train) + len(x_test) == 1797
    assert len(x_test) == 359
    assert np.bincount(y_test).min() >= 34 and np.bincount(y_test).max() <= 37
    train_rows = {row.tobytes() + bytes([y]) for row, y in zip(x_train, y_train, strict=True)}
    test_rows = {row.tobytes() + bytes([y]) for row, y in zip(x_test, y_test, strict=True)}
    # UCI digits has a few duplicate images; the split is by example, so allow those few.
    assert len(train_rows & test_rows) <= 5


def test_help_lists_the_flags():
    done = _run(["--help"], timeout=60)
    assert done.returncode == 0
    for flag in ("--dataset", "--data-dir", "--replicas", "--epochs", "--batch-size"):
        assert flag in done.stdout
    assert "0.95" in done.stdout and "CC BY 4.0" in done.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--replicas", "0"], "--replicas: expected a positive integer, got '0'"),
        (["--epochs", "two"], "--epochs: expected a positive integer, got 'two'"),
        (["--replicas", "3", "--batch-size", "64"], "must divide evenly among --replicas 3"),
    ],
)
def test_bad_flags_fail_at_start_with_the_flag_named(args, message):
    done = _run(args, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr


@pytest.mark.multiprocess
def test_unprepared_tfds_dataset_fails_fast_without_network(tmp_path):
    done = _run(["--dataset", "mnist", "--data-dir", str(tmp_path)], timeout=90, no_network=True)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--dataset 'mnist' is not prepared in" in done.stderr
    assert "never downloads" in done.stderr and "download_and_prepare()" in done.stderr
    assert "Traceback" not in done.stderr
    assert os.listdir(tmp_path) in ([], ["mnist"])  # nothing was fetched
    assert_quoted_in(quoted_block("index.md", "says how to prepare it:"), done.stderr)


@pytest.mark.multiprocess
def test_unknown_tfds_name_says_so(tmp_path):
    done = _run(["--dataset", "no_such_set_xyz", "--data-dir", str(tmp_path)], timeout=90)
    assert done.returncode == 2
    assert "knows no data set of that name" in done.stderr


@pytest.mark.multiprocess
def test_prepared_tfds_dataset_trains(tmp_path):
    sys.path.insert(0, os.path.dirname(__file__))
    try:
        import _tfds_builder
    finally:
        sys.path.pop(0)
    _tfds_builder.prepare(str(tmp_path))
    done = _run(
        ["--dataset", "tiny_images", "--data-dir", str(tmp_path), "--epochs", "1"],
        no_network=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tfds tiny_images (train / test), 300 training images of 8x8x3" in done.stdout
    assert re.search(r"test accuracy \d\.\d{4} on tiny_images", done.stdout)


@pytest.mark.multiprocess
def test_a_global_batch_the_default_replicas_do_not_divide_is_refused():
    done = _run(["--batch-size", "63", "--epochs", "1"], timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--batch-size 63 is the global batch and must divide evenly among the 2 replicas" in (
        done.stderr
    )


@pytest.mark.multiprocess
def test_demo_reaches_the_stated_accuracy_on_the_bundled_digits():
    done = _run([], no_network=True)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "replicas in sync  2" in out  # the topology (2 simulated CPU replicas)
    assert "Epoch 12/12" in out and re.search(r"22/22 - .* - accuracy: ", out)  # per-epoch
    assert "Throughput: 2 replicas on 1 worker(s), global batch 64" in out
    accuracy = float(re.search(r"test accuracy (\d\.\d+) on digits", out).group(1))
    assert accuracy >= 0.95, out
    assert "reached the stated 0.95" in out
    assert not re.search(r"cudart_stub|absl::InitializeLog", out + done.stderr)  # clean start
    quote = quoted_block("index.md", "`mirrorkit demo` prints this (lines shortened")
    assert_quoted_in(quote, done.stderr + out)
