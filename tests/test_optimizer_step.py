"""The optimizer step across replicas: every combination of the training recipes as one device.

`mirrorkit.compat.optimizer_step` runs one ordered pipeline from the gradients to the update
(average, accumulate, all-reduce with the hooks, loss scale, merge slices, clip, weight decay,
update, EMA). `_recipes.RECIPES` covers every pair of recipe choices (precision, clipping,
accumulation, compression, dense or Embedding, five optimizers, ``fit`` or an own
``train_step``); each trains on 2 replicas as on one device within the cell's precision, with
``iterations`` and the loss scale equal at every step (an overflow planted on replica 1 under
``mixed_float16``). A chosen set runs on 2 real workers with the overflow on worker 1.
Before the pipeline, compression under accumulation was announced and not applied, and
``use_ema`` with accumulation or ``ema_overwrite_frequency`` failed.
"""

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf
from _quoted import assert_quoted_in, quoted_block
from _recipes import FACTORS, RECIPES, differences, label, tolerance, train

import mirrorkit as mk
from mirrorkit import versions
from mirrorkit.compat import step_record

#: Keras before 3.15 (the tested 3.10): Muon cannot train on the TensorFlow backend at all.
MUON_FAILS_ON_TENSORFLOW = versions.parse(keras.__version__) < (3, 15)

#: The recipes the 2-worker job trains: every mixed_float16 one (the overflow on worker 1),
#: and a float32 one that accumulates and compresses.
ON_WORKERS = [
    r
    for r in RECIPES
    if r["precision"] == "mixed_float16"
    and not (r["optimizer"] == "muon" and MUON_FAILS_ON_TENSORFLOW)
] + [r for r in RECIPES if r["precision"] == "float32" and r["accumulation"] == 2][:1]


def test_the_recipes_cover_every_pair_of_choices():
    names = list(FACTORS)
    for a, b in itertools.combinations(names, 2):
        for pair in itertools.product(FACTORS[a], FACTORS[b]):
            assert any((r[a], r[b]) == pair for r in RECIPES), f"{a}={pair[0]}, {b}={pair[1]}"
    assert len(RECIPES) < 30  # pairwise, not the product (about 2,880 recipes)


@pytest.fixture(scope="module")
def strategies():
    return mk.strategy("one_device"), mk.strategy(cpu_replicas=2)


def _expected_stages(recipe):
    """What the step must say it runs on 2 replicas, stage by stage."""
    expected = {"average", "all-reduce", "update"}
    if recipe["accumulation"] > 1:
        expected.add("accumulate")
    if recipe["clip"] != "none":
        expected.add("clip")
    if recipe["precision"] == "mixed_float16":
        expected.add("loss scale")
    if recipe["optimizer"] == "ema":
        expected.add("ema")
    return expected


@pytest.mark.slow  # 23 pairs of fits, about 45 s
@pytest.mark.parametrize("recipe", RECIPES, ids=label)
def test_every_recipe_pair_trains_as_one_device(recipe, strategies):
    one_device, replicas = strategies
    if recipe["optimizer"] == "muon" and MUON_FAILS_ON_TENSORFLOW:
        # Keras 3.10's Muon.update_step reads variable.path of TensorFlow's variable: it fails
        # on one device as on any strategy, so there is nothing to equal (3.15 fixed it).
        with pytest.raises(AttributeError, match="has no attribute 'path'"):
            train(one_device, recipe)
        return
    one = train(one_device, recipe)
    two = train(replicas, recipe)
    assert differences(one, two) <= tolerance(recipe)
    ran = two["ran"]
    assert {stage.split(" (")[0] for stage in ran} >= _expected_stages(recipe), ran
    reduce = next(stage for stage in ran if stage.startswith("all-reduce"))
    assert (recipe["compression"] != "none") == ("compression" in reduce), ran
    if recipe["precision"] == "mixed_float16":
        assert one["scales"][1] == one["scales"][0] / 2  # the planted overflow was skipped


@pytest.mark.upstream
def test_ema_overwrite_fails_on_two_replicas_upstream(strategies):
    """Keras alone: ``ema_overwrite_frequency`` overwrites in a ``cond`` whose branch all-
    reduces, in the replica context: "`merge_call` called while defining a new graph". Keras
    3.16 (the nightly) does it from the cross-replica context: there it trains as one device,
    and the EMA stage of optimizer_step can go."""
    from _training import keras_own_step

    one_device, replicas = strategies
    recipe = {**RECIPES[0], "optimizer": "ema", "clip": "none", "compression": "none"}
    optimizer = keras.optimizers.SGD(use_ema=True, ema_overwrite_frequency=2)
    fixed = hasattr(optimizer, "_backend_maybe_overwrite_model_variables")
    one = train(one_device, recipe)
    with keras_own_step():
        if fixed:
            assert differences(one, train(replicas, recipe)) <= 1e-5
            return
        with pytest.raises(RuntimeError, match="merge_call") as caught:
            train(replicas, recipe)
    assert_quoted_in(
        quoted_block("compat.md", "`ema_overwrite_frequency` fails at the first step"),
        str(caught.value),
    )


def test_the_step_says_once_what_it_runs_and_describe_lists_it(strategies, capfd):
    from mirrorkit import compat, notices

    _, replicas = strategies
    notices._said.clear()
    recipe = {**RECIPES[0], "accumulation": 2, "compression": "fp16", "optimizer": "ema"}
    train(replicas, recipe)
    said = capfd.readouterr().err
    assert_quoted_in(quoted_block("compat.md", "once what each optimizer's step runs"), said)
    rows = {row["name"]: row for row in compat.describe()}
    assert rows["optimizer_step"]["target"].endswith("TFOptimizer._backend_apply_gradients")
    applies = rows["optimizer_step"]["applies"]
    assert "; the last steps ran: " in applies
    assert "SGD: average (over 2 replicas), accumulate (2 steps), all-reduce" in applies


#: The optimizer methods a step goes through: only compat/optimizer_step replaces them (the
#: gradient hooks wrap `_all_reduce_sum_gradients` per optimizer, as its all-reduce stage).
STEP_METHODS = {
    "apply",
    "apply_gradients",
    "scale_loss",
    "_backend_apply_gradients",
    "_backend_update_step",
    "_clip_gradients",
    "_apply_weight_decay",
    "_distributed_tf_update_step",
    "_all_reduce_sum_gradients",
    "_tf_apply",
    "_common_apply",
    "_stateful_handle_finite_grads",
    "_backend_maybe_overwrite_model_variables",
}


def test_one_module_owns_the_optimizer_step():
    from mirrorkit.compat import optimizer_step
    from mirrorkit.patching import catalogue

    owners = {
        repair.name: repair
        for repair in catalogue.repairs()
        if repair.target.rsplit(".", 1)[-1] in STEP_METHODS
    }
    assert set(owners) == {r.name for r in optimizer_step.REPAIRS}, sorted(owners)
    assert step_record.STAGES[0] == "average" and step_record.STAGES[-1] == "ema"


def _count_collectives(strategy, monkeypatch):
    """Counts each executed collective of the strategy's cross-device ops (a variable the
    traced step increments where the collective runs, in a cond's branch too)."""
    ops = strategy.extended._cross_device_ops
    counter = tf.Variable(0, dtype=tf.int64, trainable=False)
    for name in ("batch_reduce", "reduce"):
        original = getattr(ops, name)

        def counted(*args, original=original, **kwargs):
            counter.assign_add(1)
            return original(*args, **kwargs)

        monkeypatch.setattr(ops, name, counted)
    return counter


@pytest.mark.parametrize(
    "precision, accumulation, guard, per_step",
    [
        ("float32", 1, False, 1.0),
        ("float32", 1, True, 1.0),  # NaNGuard's flags ride in the gradients' all-reduce
        ("mixed_float16", 1, False, 1.0),  # the loss scale's check too (was 2)
        ("mixed_float16", 1, True, 1.0),
        ("float32", 2, False, 0.5),  # one all-reduce per optimizer step
        ("mixed_float16", 2, False, 1.5),  # the finite flags every micro-step
    ],
)
def test_collectives_per_step(precision, accumulation, guard, per_step, monkeypatch):
    strategy = mk.strategy(cpu_replicas=2)
    counter = _count_collectives(strategy, monkeypatch)
    recipe = {
        **RECIPES[0],
        "precision": precision,
        "accumulation": accumulation,
        "clip": "global_clipnorm",
        "compression": "none",
        "optimizer": "adamw",
    }
    callbacks = [mk.callbacks.NaNGuard()] if guard else []
    run = train(strategy, recipe, overflow_row=None, callbacks=callbacks)
    steps = len(run["iterations"])
    assert int(counter.numpy()) / steps == per_step


# -- on two workers -----------------------------------------------------------------------


def recipes_on_workers(strategy):
    """In each worker of the session's shared 2-worker job (`two_worker_job`)."""
    from _recipes import train_all

    assert type(strategy).__name__ == "CollectiveAllReduceStrategy"
    return train_all(strategy, ON_WORKERS)


@pytest.mark.multiprocess
def test_recipes_on_two_workers_with_an_overflow_on_worker_one(two_worker_job, strategies):
    workers = [scenarios["recipes"] for scenarios in two_worker_job]
    for recipe in ON_WORKERS:
        one = train(strategies[0], recipe)
        for worker, runs in enumerate(workers):
            got = runs[label(recipe)]
            found = differences(one, got)
            assert found <= tolerance(recipe), f"{label(recipe)} on worker {worker}: {found}"
            if recipe["precision"] == "mixed_float16":
                assert got["scales"][1] == got["scales"][0] / 2
    assert np.array_equal(workers[0][label(ON_WORKERS[0])]["weights"][0],
                          workers[1][label(ON_WORKERS[0])]["weights"][0])  # fmt: skip
