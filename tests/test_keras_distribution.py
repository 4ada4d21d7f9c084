"""Keras 3's ``keras.distribution.DataParallel`` trains data-parallel on TensorFlow through
mirrorkit (docs: keras-distribution/): keras.io's guide, as written plus ``import
mirrorkit``, on 2 replicas and on 2 workers under ``mirrorkit launch``, against one device,
each in its own process; what Keras offers on TensorFlow without mirrorkit (one replica,
silently); the distributions mirrorkit refuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
from _quoted import assert_quoted_in, quoted_block

from mirrorkit.strategies import keras_distribution

GUIDE = Path(__file__).resolve().parent / "_data_parallel_guide.py"
TOLERANCE = 1e-5


def _keras_cannot_make_one() -> str:
    """Keras's own error making a DataParallel on TensorFlow, or "" where it can (3.15 on)."""
    try:
        keras.distribution.DataParallel(devices=["cpu:0"])
    except AttributeError as error:  # Keras 3.10: the TF backend has no num_processes
        return str(error)
    return ""


CANNOT = _keras_cannot_make_one()
needs_a_data_parallel = pytest.mark.skipif(
    bool(CANNOT), reason=f"this Keras cannot make a DataParallel on TensorFlow: {CANNOT}"
)


def _run(tmp_path, name, *flags, launch=False):
    """The guide in a fresh process (or a 2-worker job); its results and its output."""
    out = tmp_path / name
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    launcher = [sys.executable, "-m", "mirrorkit", "launch", "-n", "2"]
    prefix = launcher if launch else [sys.executable]
    done = subprocess.run(
        [*prefix, str(GUIDE), str(out), *flags],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    paths = [Path(f"{out}-{rank}.json") for rank in (0, 1)] if launch else [out]
    return [json.loads(p.read_text()) for p in paths], output


def _assert_as_one_device(one, other):
    assert other["iterations"] == one["iterations"] == 24
    np.testing.assert_allclose(other["loss"], one["loss"], rtol=TOLERANCE)
    np.testing.assert_allclose(other["evaluation"], one["evaluation"], rtol=TOLERANCE)
    for mine, theirs in zip(other["weights"], one["weights"], strict=True):
        np.testing.assert_allclose(mine, theirs, atol=TOLERANCE)


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
    (found,), _ = _run(tmp_path_factory.mktemp("one"), "one.json")
    assert found["replicas"] == 1 and found["devices"] == ["cpu:0"]
    return found


@needs_a_data_parallel
@pytest.mark.multiprocess
@pytest.mark.parametrize("way", ["mirrorkit first", "keras first", "distribution.scope()"])
def test_the_guides_data_parallel_on_two_replicas_equals_one_device(tmp_path, one_device, way):
    flags = {"keras first": ["--keras-first"], "distribution.scope()": ["--scope"]}.get(way, [])
    (two,), output = _run(tmp_path, "two.json", "--devices", "2", *flags)
    assert two["replicas"] == 2 and two["devices"] == ["cpu:0", "cpu:1"]
    # set back to none at the scope's end; the model keeps its strategy
    assert two["distribution"] == ("NoneType" if way == "distribution.scope()" else "DataParallel")
    assert "keras.distribution.DataParallel of 2 device(s) trains on MirroredStrategy" in output
    assert_quoted_in(quoted_block("keras-distribution.md", "On a machine with two devices"), output)
    _assert_as_one_device(one_device, two)


@needs_a_data_parallel
@pytest.mark.multiprocess
def test_the_guides_data_parallel_on_two_workers_equals_one_device(tmp_path, one_device):
    workers, output = _run(tmp_path, "worker", launch=True)
    for found in workers:
        assert found["replicas"] == 2 and found["devices"] == ["cpu:0", "cpu:1"]
        _assert_as_one_device(one_device, found)
    assert "trains on MultiWorkerMirroredStrategy, 2 replica(s)" in output
    assert_quoted_in(quoted_block("keras-distribution.md", "its strategy is"), output)


@needs_a_data_parallel
@pytest.mark.upstream
@pytest.mark.multiprocess
def test_data_parallel_trains_on_one_replica_upstream(tmp_path, one_device):
    """Keras's TensorFlow backend without mirrorkit: the DataParallel over 2 devices is set,
    and the model trains on one replica, with no word."""
    (plain,), output = _run(tmp_path, "plain.json", "--devices", "2", "--without-mirrorkit")
    assert plain["distribution"] == "DataParallel" and plain["devices"] == ["cpu:0", "cpu:1"]
    assert plain["replicas"] == 1
    assert "DataParallel" not in output


@needs_a_data_parallel
@pytest.mark.upstream
@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "repair", ["keras_distribution_data_parallel", "keras_distribution_public_name"]
)
def test_a_data_parallel_repair_taken_off_alone_trains_on_one_replica_upstream(tmp_path, repair):
    """Either repair of set_distribution taken off alone (Keras's function, or the name
    keras.distribution bound to it at import): the DataParallel trains on one replica."""
    (plain,), _ = _run(tmp_path, "plain.json", "--devices", "2", "--without", repair)
    assert plain["distribution"] == "DataParallel" and plain["devices"] == ["cpu:0", "cpu:1"]
    assert plain["replicas"] == 1, f"{repair}: taken off alone, it trains on 2: retire it"


@needs_a_data_parallel
@pytest.mark.multiprocess
def test_a_model_built_before_the_distribution_is_told_what_to_do(tmp_path):
    """Built before set_distribution: the model's variables are on one device, and fit says so."""
    done = subprocess.run(
        [sys.executable, str(GUIDE), str(tmp_path / "before.json"), "--devices", "2"]
        + ["--built-before"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert done.returncode == 1 and not (tmp_path / "before.json").exists()
    said = done.stderr.strip().splitlines()[-1]
    assert said == (
        "ValueError: Functional was built before keras.distribution.set_distribution("
        "DataParallel(...)), so its variables live on one device, but the DataParallel hands "
        "it batches split between replicas. Build (or load) the model after set_distribution, "
        "or inside distribution.scope() (docs: keras-distribution/)."
    )
    page = (Path(__file__).parents[1] / "docs" / "keras-distribution.md").read_text()
    assert f"`{said.split(', so')[0]} ...`" in page  # the page's row quotes it


@pytest.mark.skipif(not CANNOT, reason="this Keras makes a DataParallel on TensorFlow")
def test_keras_3_10_cannot_make_a_data_parallel_on_tensorflow():
    """What Keras 3.10 offers on TensorFlow: no DataParallel at all (docs: compat/)."""
    assert "num_processes" in CANNOT


@needs_a_data_parallel
def test_model_parallel_is_refused_and_nothing_is_set():
    keras_distribution.apply()  # in place in this process, whatever a test before removed
    mesh = keras.distribution.DeviceMesh(shape=(1,), axis_names=["model"], devices=["cpu:0"])
    layout_map = keras.distribution.LayoutMap(mesh)
    model_parallel = keras.distribution.ModelParallel(layout_map=layout_map)
    with pytest.raises(ValueError, match="mirrorkit trains keras.distribution.DataParallel"):
        keras.distribution.set_distribution(model_parallel)
    assert keras.distribution.distribution() is None
