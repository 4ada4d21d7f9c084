"""predict and predict_on_batch on several replicas equal one device, with and without XLA.

Keras's own trainer tests (keras/src/trainers/trainer_test.py, `test_predict_flow_jit`,
`test_on_batch_methods_without_training_jit`) run here in their shape: a model that predict
itself builds, compiled with XLA, and an output structure (`mirrorkit.compat.predict_step`).
"""

import keras
import numpy as np
import pytest
from _quoted import assert_quoted_in, quoted_block

import mirrorkit as mk

TOLERANCE = 1e-6


class OutputStruct(keras.Model):
    def __init__(self):
        super().__init__()
        self.one = keras.layers.Dense(3, use_bias=False, kernel_initializer="ones")
        self.two = keras.layers.Dense(3, kernel_initializer="glorot_uniform")

    def call(self, x):
        return {"y_one": self.one(x), "y_two": self.two(x)}


def make(kind, jit_compile=True):
    keras.utils.set_random_seed(0)
    if kind == "unbuilt":  # no keras.Input: predict's first step builds it
        model = keras.Sequential([keras.layers.Dense(3), keras.layers.Dense(2)])
    elif kind == "built":
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])
    else:
        model = OutputStruct()
    model.jit_compile = jit_compile
    return model


def _inputs(n):
    return np.random.default_rng(1).normal(size=(n, 4)).astype("float32")


def predictions(strategy, kind, how, n, jit_compile=True):
    with strategy.scope():
        model = make(kind, jit_compile)
    x = _inputs(n)
    if how == "predict":
        return model.predict(x, batch_size=16, verbose=0)
    return model.predict_on_batch(x)


def assert_equal(one, two):
    one, two = keras.tree.flatten(one), keras.tree.flatten(two)
    assert [a.shape for a in two] == [a.shape for a in one]
    for a, b in zip(one, two, strict=True):
        np.testing.assert_allclose(b, a, atol=TOLERANCE)


#: The quick set (pytest -m "not slow", under 2 minutes) keeps one case with XLA asked for.
_CASES = [
    pytest.param(kind, how, jit, marks=[] if (kind, how, jit) == ("unbuilt", "predict", True)
                 else [pytest.mark.slow])
    for kind in ("unbuilt", "built", "struct") for how in ("predict", "predict_on_batch")
    for jit in (True, False)
]  # fmt: skip


@pytest.mark.parametrize("kind, how, jit_compile", _CASES)
def test_two_replicas_predict_as_one_device(kind, how, jit_compile):
    one = predictions(mk.strategy("one_device"), kind, how, 100 if how == "predict" else 16,
                      jit_compile)  # fmt: skip
    two = predictions(mk.strategy(cpu_replicas=2), kind, how, 100 if how == "predict" else 16,
                      jit_compile)  # fmt: skip
    assert_equal(one, two)


@pytest.mark.parametrize("rows", [pytest.param(1, marks=pytest.mark.slow), 5,
                                  pytest.param(7, marks=pytest.mark.slow)])  # fmt: skip
def test_predict_on_batch_splits_an_uneven_batch_into_one_devices_rows(rows):
    one = predictions(mk.strategy("one_device"), "built", "predict_on_batch", rows)
    four = predictions(mk.strategy(cpu_replicas=4), "built", "predict_on_batch", rows)
    assert four.shape == (rows, 2)
    assert_equal(one, four)


@pytest.mark.slow
def test_xla_is_left_out_of_predict_across_replicas_and_said_once(capfd):
    strategy = mk.strategy(cpu_replicas=2)
    predictions(strategy, "built", "predict", 32, jit_compile=False)
    assert "without XLA" not in capfd.readouterr().err
    predictions(strategy, "unbuilt", "predict", 32)
    predictions(strategy, "built", "predict_on_batch", 32)
    said = capfd.readouterr().err
    assert said.count("predict's step runs compiled without XLA") == 1
    assert "on the 2 replicas of MirroredStrategy" in said
    assert_quoted_in(
        quoted_block("compat.md", "compiled without XLA, as the train step is, and"), said
    )
    assert_quoted_in(
        quoted_block("scale.md", "predict steps run compiled without XLA, and the chief"), said
    )


@pytest.mark.upstream
@pytest.mark.parametrize("repair", ["predict_without_xla_build", "predict_on_batch_split"])
def test_keras_alone_cannot_predict_with_xla_or_one_batch_across_replicas(repair):
    """Each repair taken off alone: XLA fails to create the variables (without
    predict_without_xla_build); predict_on_batch repeats every row per replica (without
    predict_on_batch_split). If one stops failing, retire that repair."""
    from mirrorkit.patching import catalogue

    strategy = mk.strategy(cpu_replicas=2)
    taken = catalogue.named(repair)
    taken.remove()
    try:
        if repair == "predict_without_xla_build":
            with pytest.raises(Exception, match="lift variable creations") as caught:
                predictions(strategy, "unbuilt", "predict", 32)
            quote = quoted_block("compat.md", "`predict` builds itself (no `keras.Input`")
            assert_quoted_in(quote, str(caught.value))
        else:
            assert predictions(strategy, "built", "predict_on_batch", 16, False).shape == (32, 2)
    finally:
        taken.apply()
