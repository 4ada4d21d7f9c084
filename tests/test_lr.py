"""Learning-rate scaling and warm-up (`mk.scale_learning_rate`, `mk.WarmUp`)."""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest

import mirrorkit as mk
from mirrorkit import notices


@pytest.fixture(autouse=True)
def _forget_said():
    notices._said.clear()
    yield
    notices._said.clear()


def _value(schedule, step):
    return float(keras.ops.convert_to_numpy(schedule(step)))


def test_linear_and_sqrt_rules():
    assert mk.scale_learning_rate(0.1, 32, 256) == pytest.approx(0.8)
    assert mk.scale_learning_rate(0.1, 32, 256, rule="sqrt") == pytest.approx(0.1 * math.sqrt(8))
    assert mk.scale_learning_rate(0.4, 256, 64) == pytest.approx(0.1)  # scales down too


def test_scaling_is_said_once(capsys):
    mk.scale_learning_rate(0.1, 32, 256, warmup_epochs=5, steps_per_epoch=10)
    mk.scale_learning_rate(0.1, 32, 256, warmup_epochs=5, steps_per_epoch=10)
    said = capsys.readouterr().err
    assert said.count("learning rate 0.1 x 256/32 = 0.8, warm-up 5 epochs (50 steps)") == 1
    mk.scale_learning_rate(0.1, 32, 64, rule="sqrt")
    assert "learning rate 0.1 x sqrt(64/32) = 0.141421" in capsys.readouterr().err


def test_warmup_from_scale_ramps_from_base_to_scaled_rate():
    schedule = mk.scale_learning_rate(0.1, 32, 256, warmup_epochs=5, steps_per_epoch=10)
    assert isinstance(schedule, mk.WarmUp)
    assert _value(schedule, 0) == pytest.approx(0.1)
    assert _value(schedule, 25) == pytest.approx(0.1 + 0.7 * 25 / 50)
    assert _value(schedule, 50) == pytest.approx(0.8)
    assert _value(schedule, 1000) == pytest.approx(0.8)


def test_warmup_composes_with_the_users_schedule():
    steps = keras.optimizers.schedules.PiecewiseConstantDecay([100, 200], [0.8, 0.08, 0.008])
    schedule = mk.WarmUp(steps, warmup_steps=20)
    assert _value(schedule, 0) == 0.0
    assert _value(schedule, 10) == pytest.approx(0.4)
    assert _value(schedule, 20) == pytest.approx(0.8)
    assert _value(schedule, 150) == pytest.approx(0.08)  # milestones at absolute steps
    assert _value(schedule, 250) == pytest.approx(0.008)


def test_warmup_is_saved_with_the_model(tmp_path):
    decay = keras.optimizers.schedules.CosineDecay(0.8, decay_steps=100)
    schedule = mk.WarmUp(decay, warmup_steps=10, initial_learning_rate=0.1, say=False)
    restored = mk.WarmUp.from_config(schedule.get_config())
    for step in (0, 5, 10, 60):
        assert _value(restored, step) == pytest.approx(_value(schedule, step))

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=schedule), loss="mse")
    path = tmp_path / "m.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    saved = loaded.optimizer.get_config()["learning_rate"]
    assert saved["class_name"] == "WarmUp" and saved["config"]["warmup_steps"] == 10
    assert float(loaded.optimizer.learning_rate) == pytest.approx(0.1)  # step 0


def test_fit_uses_the_warmed_up_rate():
    x = np.ones((8, 2), "float32")
    y = np.zeros((8, 1), "float32")
    strategy = mk.strategy(cpu_replicas=2)
    schedule = mk.scale_learning_rate(0.01, 4, 8, warmup_steps=4)

    def make():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(learning_rate=schedule), loss="mse")
        return model

    model = mk.build(make, strategy)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)  # 2 optimizer steps
    assert int(model.optimizer.iterations.numpy()) == 2
    assert float(model.optimizer.learning_rate) == pytest.approx(0.01 + 0.01 * 2 / 4)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(base_lr=0, base_batch=32, global_batch=64), "base_lr must be a positive number"),
        (dict(base_lr="0.1", base_batch=32, global_batch=64), "base_lr must be a positive number"),
        (dict(base_lr=0.1, base_batch=32.0, global_batch=64), "base_batch must be a positive int"),
        (dict(base_lr=0.1, base_batch=32, global_batch=0), "global_batch must be a positive int"),
        (dict(base_lr=0.1, base_batch=32, global_batch=64, rule="log"), "rule must be one of"),
        (
            dict(base_lr=0.1, base_batch=32, global_batch=64, warmup_epochs=5),
            "warmup_epochs=5 needs steps_per_epoch",
        ),
        (
            dict(base_lr=0.1, base_batch=32, global_batch=64, warmup_epochs=5, warmup_steps=9),
            "not both",
        ),
        (
            dict(base_lr=0.1, base_batch=32, global_batch=64, steps_per_epoch=9),
            "steps_per_epoch only matters with warmup_epochs",
        ),
        (
            dict(base_lr=0.1, base_batch=32, global_batch=64, warmup_steps=0),
            "warmup_steps must be a positive integer",
        ),
    ],
)
def test_bad_arguments_say_what_was_wrong(kwargs, message):
    with pytest.raises(ValueError, match=message):
        mk.scale_learning_rate(**kwargs)


def test_bad_warmup_arguments():
    with pytest.raises(ValueError, match="`after` must be a learning rate"):
        mk.WarmUp("adam", warmup_steps=5)
    with pytest.raises(ValueError, match="warmup_steps must be a positive integer"):
        mk.WarmUp(0.1, warmup_steps=-1)
    with pytest.raises(ValueError, match="initial_learning_rate must be a number >= 0"):
        mk.WarmUp(0.1, warmup_steps=5, initial_learning_rate=-0.1)
