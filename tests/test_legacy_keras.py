"""TF_USE_LEGACY_KERAS (Ray Train sets it): mirrorkit keeps Keras 3 and says so once, on the chief.

In-process and fast; tests/test_ray.py checks the same notice under a real Ray
Train job, where Ray sets the variable itself.
"""

from __future__ import annotations

import json

import keras
import pytest
from _quoted import assert_quoted_in, quoted_block

import mirrorkit as mk
from mirrorkit.cluster import legacy_keras

NOTICE = "TF_USE_LEGACY_KERAS=1 is set (Ray Train sets it); mirrorkit uses Keras 3"


@pytest.mark.parametrize("value", ["1", "true", "True"])
def test_the_values_tensorflow_reads_as_true_are_requests(value):
    assert legacy_keras.requested({"TF_USE_LEGACY_KERAS": value})


@pytest.mark.parametrize("env", [{}, {"TF_USE_LEGACY_KERAS": "0"}, {"TF_USE_LEGACY_KERAS": ""}])
def test_unset_or_false_is_no_request_and_no_notice(env):
    assert not legacy_keras.requested(env)
    assert legacy_keras.notice("3.15.1", env) is None


def test_the_notice_names_the_variable_the_keras_in_use_and_tf_keras():
    line = legacy_keras.notice(keras.__version__, {"TF_USE_LEGACY_KERAS": "1"})
    assert line.startswith(NOTICE)
    assert f"(keras {keras.__version__})" in line
    assert "leaves the variable as it is" in line and "`import keras`" in line
    assert "routes `tf.keras` to tf_keras" in line


def test_mk_strategy_says_it_once_on_the_chief(monkeypatch, capsys):
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    strategy = mk.strategy("one_device")
    mk.strategy("one_device")
    err = capsys.readouterr().err
    assert err.count(NOTICE) == 1, err
    assert_quoted_in(quoted_block("clusters/ray.md", "It leaves the variable as it is"), err)
    with strategy.scope():  # the model mirrorkit builds is Keras 3 whatever the variable says
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    assert isinstance(model, keras.Model) and keras.__version__.startswith("3.")


def test_a_worker_that_is_not_the_chief_says_nothing(monkeypatch, capsys):
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    spec = {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}
    task = {"type": "worker", "index": 1}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": spec, "task": task}))
    legacy_keras.say_keras_3()
    assert NOTICE not in capsys.readouterr().err


def test_without_the_variable_nothing_is_said(monkeypatch, capsys):
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    legacy_keras.say_keras_3()
    assert "TF_USE_LEGACY_KERAS" not in capsys.readouterr().err
