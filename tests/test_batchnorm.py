"""Batch normalisation across replicas: synchronised equals one device; `mk.build` says so once."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from _quoted import assert_quoted_in, quoted_block

import mirrorkit as mk
from mirrorkit import notices
from mirrorkit.scale.batchnorm import unsynchronized_batch_norm

TOLERANCE = 1e-5
GLOBAL_BATCH = 16


def _model(synchronized):
    model = keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Dense(6),
            keras.layers.BatchNormalization(
                synchronized=synchronized, momentum=0.5, name="batch_normalization"
            ),
            keras.layers.Activation("relu"),
            keras.layers.Dense(2),
        ]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    rng = np.random.default_rng(7)
    model.set_weights(
        [
            w if "variance" in v.path or "gamma" in v.path else rng.normal(size=w.shape)
            for w, v in zip(model.get_weights(), model.weights, strict=True)
        ]
    )
    return model


def _train(replicas, synchronized):
    strategy = mk.strategy("one_device") if replicas == 1 else mk.strategy(cpu_replicas=replicas)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4 * GLOBAL_BATCH, 5)).astype("float32")
    y = rng.normal(size=(4 * GLOBAL_BATCH, 2)).astype("float32")
    model = mk.build(lambda: _model(synchronized), strategy)
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0)
    return model.get_weights()


def _largest_difference(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def one_device():
    return _train(1, synchronized=False)  # one device: synchronising changes nothing


@pytest.mark.slow  # five in-process fits, ~40 s on 2 shared cores
@pytest.mark.parametrize("replicas", [2, 4])
def test_synchronized_batch_norm_equals_one_device(one_device, replicas):
    assert _largest_difference(_train(replicas, synchronized=True), one_device) < TOLERANCE


@pytest.mark.slow  # five in-process fits, ~40 s on 2 shared cores
@pytest.mark.parametrize("replicas", [2, 4])
def test_per_replica_batch_norm_does_not(one_device, replicas):
    assert _largest_difference(_train(replicas, synchronized=False), one_device) > 1e-3


@pytest.fixture
def _forget_said():
    notices._said.discard("batchnorm-per-replica")
    yield
    notices._said.discard("batchnorm-per-replica")


def test_build_says_once_which_layers_and_the_option(capfd, _forget_said):
    strategy = mk.strategy(cpu_replicas=2)
    capfd.readouterr()
    mk.build(lambda: _model(synchronized=False), strategy)
    mk.build(lambda: _model(synchronized=False), strategy)
    said = capfd.readouterr().err
    assert said.count("BatchNormalization(synchronized=True)") == 1
    assert "1 BatchNormalization layer(s) (batch_normalization" in said
    assert "each replica's 1/2 of the global batch" in said
    assert_quoted_in(quoted_block("scale.md", "prints a notice, once:"), said)
    assert_quoted_in(quoted_block("compat.md", "layers that normalise per replica (here"), said)


@pytest.mark.parametrize("replicas, synchronized", [(1, False), (2, True)])
def test_nothing_is_said_when_it_trains_the_same(capfd, _forget_said, replicas, synchronized):
    strategy = mk.strategy("one_device") if replicas == 1 else mk.strategy(cpu_replicas=replicas)
    capfd.readouterr()
    mk.build(lambda: _model(synchronized), strategy)
    assert "BatchNormalization" not in capfd.readouterr().err


def test_nested_layers_are_found():
    inner = keras.Sequential([keras.Input((3,)), keras.layers.BatchNormalization(name="inner_bn")])
    outer = keras.Sequential(
        [keras.Input((3,)), inner, keras.layers.BatchNormalization(synchronized=True)]
    )
    assert unsynchronized_batch_norm(outer) == ["inner_bn"]
