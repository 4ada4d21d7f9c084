"""Keras repairs on one host (4 logical CPUs in the pytest process)."""

import fnmatch
import functools
import json
import pathlib
import re
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from _docs_tables import tables
from _models import tiny_model
from _quoted import assert_quoted_in, quoted_block

import mirrorkit as mk
from mirrorkit import compat
from mirrorkit.patching import catalogue
from mirrorkit.patching.repair import WITH_ENABLE

ROOT = pathlib.Path(__file__).resolve().parent.parent


_model = functools.partial(tiny_model, 4, 2, "adam")


def test_enable_is_idempotent_and_disable_restores():
    from keras.src.backend.tensorflow import trainer

    compat.disable()
    original = trainer.reduce_per_replica
    everything = [repair.name for repair in compat.REPAIRS]
    assert len(set(everything)) == len(everything), everything
    # A repair whose bug this Keras has fixed steps aside (python_logs on Keras 3.15), one whose
    # replacement does not fit this Keras stays off (per_output_loss on 3.16), and
    # keras_hub_inputs waits for keras-hub to be imported; the first-use ones wait for theirs.
    needed = [
        repair.name
        for repair in compat.REPAIRS
        if repair.when == WITH_ENABLE and repair.wanted_here
    ]
    assert compat.enable() == needed
    patched = trainer.reduce_per_replica
    assert patched is not original and patched.__wrapped__ is original
    assert compat.enable() == needed
    assert trainer.reduce_per_replica is patched
    compat.disable()
    assert trainer.reduce_per_replica is original and compat.active() == []
    compat.enable()


def _matches(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def _targets() -> dict[str, object]:
    """What each repair's Keras module or class holds at its target now (absent: None)."""
    found = {}
    for repair in catalogue.repairs():
        if repair.module.split(".")[0] not in sys.modules:  # keras_hub, keras_tuner: not imported
            continue
        owner, attr = repair._owner_and_attr()
        found[f"{repair.module}.{repair.target}"] = vars(owner).get(attr)
    return found


def _register_a_step_hook() -> None:
    """A step hook on a model: `step_hooks.register` applies `step_chain` (first use)."""
    from mirrorkit.training import step_hooks

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    step_hooks.register(model, step_hooks.StepHook("noop", lambda call, it: call(it), "call"))


def test_disable_restores_keras_whatever_order_the_repairs_went_on_in():
    """A step hook, then enable(2 replicas), then disable(): Keras is as it was.

    The first step hook applies `step_chain`; 2 replicas add `fit_notices`, which wraps the
    same `make_train_function` on top of it. Taken off in `REPAIRS`' order, `step_chain` came
    off first and put back Keras's original under `fit_notices`'s wrapper, which then
    restored `step_chain`'s: a repair stayed on Keras while `active()` said none did.
    """
    compat.disable()
    before = _targets()
    try:
        _register_a_step_hook()
        compat.enable(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
        assert "fit_notices" in compat.active() and "step_chain" in compat.active()
        compat.disable()
        after = _targets()
        changed = [target for target in before if after[target] is not before[target]]
        assert changed == [] and compat.active() == [], changed
    finally:
        compat.enable()


def test_a_repair_wrapped_by_another_comes_off_from_under_it():
    """Removing the inner of two repairs of one internal leaves the outer one in place."""
    from mirrorkit.compat import one_device_loss, step_function

    inner, outer = one_device_loss.REPAIRS[0], step_function.REPAIR  # both of _make_function
    compat.disable()
    trainer, attr = outer._owner_and_attr()  # Keras's TensorFlow trainer (renamed in 3.16)
    keras_own = vars(trainer)[attr]
    try:
        compat.enable(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
        assert inner.name == "one_device_step" and inner.active and outer.active
        assert vars(trainer)[attr] is outer.installed  # the higher Repair.place
        inner.remove()
        assert not inner.active and outer.active
        assert vars(trainer)[attr] is outer.installed
        assert outer.original is keras_own  # it now wraps Keras's own
        assert "step_function" in compat.active() and "one_device_step" not in compat.active()
        compat.disable()
        assert vars(trainer)[attr] is keras_own
    finally:
        compat.disable()
        compat.enable()


def test_compat_enable_keeps_no_strategy_alive():
    """The strategies enable() was called for are held weakly (for repairs declared later)."""
    import gc
    import weakref

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    compat.enable(strategy)
    held = weakref.ref(strategy)
    del strategy
    gc.collect()
    assert held() is None
    compat.enable()


def test_only_a_canary_that_reads_keras_is_called_one():
    """keras_hub's and keras_tuner's repairs apply once imported: no Keras code is read."""
    from mirrorkit.compat import keras_hub_inputs, keras_tuner_trials, optimizer_variables

    assert optimizer_variables.REPAIR.checks_keras
    assert not keras_hub_inputs.REPAIR.checks_keras
    assert not any(repair.checks_keras for repair in keras_tuner_trials.REPAIRS)


def test_repairs_are_said_in_one_line_once(monkeypatch, capfd):
    from mirrorkit import notices

    monkeypatch.setattr(notices, "_said", set())
    compat.disable()
    capfd.readouterr()
    assert compat.enable()
    compat.disable()
    compat.enable()
    said = [line for line in capfd.readouterr().err.splitlines() if "mirrorkit:" in line]
    assert said == [
        f"mirrorkit: Keras {keras.__version__} repaired for tf.distribute; "
        "mirrorkit.compat.active() lists the repairs"
    ]


def test_the_docs_quote_the_repairs_two_replicas_get(monkeypatch, capfd):
    """The Keras repairs page quotes mk.strategy(cpu_replicas=2)'s line as the chief prints it."""
    from mirrorkit import notices

    monkeypatch.setattr(notices, "_said", set())
    compat.disable()
    capfd.readouterr()
    mk.strategy(cpu_replicas=2)
    said = capfd.readouterr().err
    quote = quoted_block("compat.md", "`mk.strategy(cpu_replicas=2)` on Keras")
    if f"Keras {keras.__version__} " not in quote.lines[0]:
        pytest.skip(f"the docs quote another Keras: {quote.lines}")
    assert_quoted_in(quote, said)


def _in_order(names) -> list[str]:
    """`names` as `compat.active()` orders them: the catalogue's order."""
    wanted = set(names)
    order = [r.name for r in catalogue.repairs()]
    assert wanted <= set(order), wanted - set(order)
    return [name for name in order if name in wanted]


def _applied_per_the_page(rows: int) -> list[str]:
    """The repairs compat.md's table "Which repairs a strategy gets" gives its first `rows` rows.

    The table is made from each repair's ``applies_to`` (docs/repair_tables.py): this checks
    that the label it gives each is what a strategy really gets. A repair waiting for its package
    (keras-hub, keras-tuner), or one this Keras does not want (`Repair.wanted_here`), is left
    out, as `enable` leaves it out.
    """
    table = tables().strategies_table()
    cells = [row.split(" | ")[1] for row in table.splitlines()[2:]][:rows]
    names = [n for cell in cells for n in re.findall(r"`([a-z_]+)`(?! is imported)", cell)]
    return _in_order(r.name for r in catalogue.repairs() if r.name in names and r.wanted_here)


def test_strategy_applies_what_the_repairs_page_says():
    compat.disable()
    mk.strategy("one_device")  # every strategy, and every one but TensorFlow's default
    assert compat.active() == _applied_per_the_page(2)
    mk.strategy(cpu_replicas=2)  # and two or more replicas
    assert compat.active() == _applied_per_the_page(3)
    assert "symbolic_build" in compat.active() and "multi_worker_reduce" not in compat.active()
    compat.enable()


def _first_batch_smaller_than_replicas():
    x = np.ones((5, 4), "float32")
    y = np.zeros((5, 2), "float32")
    # First global batch: 1 example for 2 replicas; then batches of 4.
    return (
        tf.data.Dataset.from_tensor_slices((x, y))
        .take(1)
        .batch(1)
        .concatenate(tf.data.Dataset.from_tensor_slices((x[1:], y[1:])).batch(4))
    )


@pytest.mark.upstream
def test_first_batch_smaller_than_replica_count_fails_upstream(taken_off):
    model = mk.build(_model, mk.strategy(cpu_replicas=2))
    taken_off("symbolic_build")  # alone: the others stay in place
    with pytest.raises(Exception, match="(?i)shape|incompatible|AddN"):
        model.fit(_first_batch_smaller_than_replicas(), epochs=1, verbose=0)


def test_first_batch_smaller_than_replica_count_trains():
    model = mk.build(_model, mk.strategy(cpu_replicas=2))
    history = model.fit(_first_batch_smaller_than_replicas(), epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()


def _string_model(vocabulary):
    text = keras.Input((1,), dtype="string")
    ids = keras.layers.StringLookup(vocabulary=vocabulary)(text)
    hidden = keras.layers.Flatten()(keras.layers.Embedding(len(vocabulary) + 1, 4)(ids))
    model = keras.Model(text, keras.layers.Dense(1)(hidden))
    model.compile(optimizer="sgd", loss="mse")
    return model


def _strings():
    words = np.array([["cat"], ["dog"], ["eel"], ["cat"]] * 4)
    return tf.data.Dataset.from_tensor_slices((words, np.ones((16, 1), "float32"))).batch(8)


@pytest.mark.upstream
def test_string_inputs_fail_upstream(taken_off):
    model = mk.build(lambda: _string_model(["cat", "dog", "eel"]), mk.strategy(cpu_replicas=2))
    taken_off("symbolic_build")  # alone: the others stay in place
    with pytest.raises(Exception, match="string"):
        model.fit(_strings(), epochs=1, verbose=0)


def test_string_inputs_with_string_lookup_train():
    model = mk.build(lambda: _string_model(["cat", "dog", "eel"]), mk.strategy(cpu_replicas=2))
    history = model.fit(_strings(), epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2


def _custom_loop(model, strategy):
    x = tf.ones((8, 4))
    y = tf.zeros((8, 2))
    data = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    )

    @tf.function
    def step(batch):
        def replica_step(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(xb) - yb) ** 2) / strategy.num_replicas_in_sync
            grads = tape.gradient(loss, model.trainable_variables)
            model.optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        return strategy.run(replica_step, args=batch)

    for batch in data:
        step(batch)
    return model.optimizer.iterations.numpy()


@pytest.mark.upstream
def test_custom_loop_with_adam_fails_upstream(taken_off):
    """keras#23085: fails where the optimizer_variables repair is needed; trains where Keras
    has shipped its fix (#23087, keras-nightly 3.16) and the repair steps aside."""
    from mirrorkit.compat import optimizer_variables

    strategy = mk.strategy(cpu_replicas=2)
    taken_off("optimizer_variables")  # alone: the others stay in place
    with strategy.scope():
        model = _model()  # built under the scope, but not through mk.build
    if not optimizer_variables.REPAIR.needed():
        assert _custom_loop(model, strategy) == 1
        return
    with pytest.raises(Exception, match="placeholder"):
        _custom_loop(model, strategy)


def test_custom_loop_with_adam_after_build():
    strategy = mk.strategy(cpu_replicas=2)
    model = mk.build(_model, strategy)
    assert model.optimizer.built
    assert _custom_loop(model, strategy) == 1


def test_custom_loop_with_adam_built_in_the_step():
    """keras#23085, repaired: the slots made inside the traced step are eager and mirrored."""
    strategy = mk.strategy(cpu_replicas=2)
    with strategy.scope():
        model = _model()  # not through mk.build: the optimizer is built by its first apply
    assert not model.optimizer.built
    assert _custom_loop(model, strategy) == 1
    slots = [v for v in model.optimizer.variables if "iteration" not in v.path]
    assert slots and all(isinstance(v.value, tf.distribute.DistributedValues) for v in slots)


def _train(strategy, **compile_kwargs):
    from tests._training import train_small_model

    return train_small_model(strategy, "adam", 0.01, epochs=2, **compile_kwargs)


@pytest.fixture(scope="module")
def one_device_reference():
    """`_train` on one device in float32: trained once for the tests that compare with it."""
    policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("float32")
    try:
        return _train(mk.strategy("one_device"))
    finally:
        keras.mixed_precision.set_global_policy(policy)


def _assert_same_training(a, b, atol=1e-5):
    (weights_a, history_a), (weights_b, history_b) = a, b
    for wa, wb in zip(weights_a, weights_b, strict=True):
        np.testing.assert_allclose(wa, wb, atol=atol)
    for key in history_a:
        np.testing.assert_allclose(history_a[key], history_b[key], atol=atol)


@pytest.mark.upstream
def test_steps_per_execution_fails_upstream(taken_off):
    strategy = mk.strategy(cpu_replicas=2)
    taken_off("step_function")  # alone: the others stay in place
    with pytest.raises(Exception, match="placeholder") as caught:
        _train(strategy, steps_per_execution=4)
    assert_quoted_in(
        quoted_block("compat.md", "followed by `fit` on two or more"), str(caught.value)
    )


def test_steps_per_execution_on_two_replicas_equals_one_device(one_device_reference):
    reference = one_device_reference
    _assert_same_training(_train(mk.strategy(cpu_replicas=2), steps_per_execution=4), reference)
    _assert_same_training(_train(mk.strategy(cpu_replicas=2), steps_per_execution=3), reference)


@pytest.mark.upstream
def test_jit_compile_fails_upstream(taken_off):
    strategy = mk.strategy(cpu_replicas=2)
    taken_off("step_function")  # alone: the others stay in place
    with pytest.raises(Exception, match="located in device") as caught:
        _train(strategy, jit_compile=True)
    assert_quoted_in(
        quoted_block("compat.md", "on two or more replicas fails, with or"), str(caught.value)
    )


def test_jit_compile_on_two_replicas_trains_and_says_so(one_device_reference, capfd):
    reference = one_device_reference
    _assert_same_training(_train(mk.strategy(cpu_replicas=2), jit_compile=True), reference)
    said = capfd.readouterr().err
    assert "XLA cannot compile a step that spans" in said
    assert_quoted_in(
        quoted_block("compat.md", "The step is compiled without XLA, and the chief"), said
    )
    assert_quoted_in(
        quoted_block("scale.md", "There `compile(jit_compile=True)` trains without XLA"), said
    )


@pytest.fixture
def mixed_float16():
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.upstream
def test_mixed_precision_with_jit_fails_upstream(taken_off, mixed_float16):
    strategy = mk.strategy(cpu_replicas=2)
    taken_off("step_function")  # alone: the others stay in place
    with pytest.raises(Exception, match="located in device|merge_call"):
        _train(strategy, jit_compile=True)


def test_mixed_precision_with_jit_and_steps_per_execution_trains(
    one_device_reference, mixed_float16
):
    strategy = mk.strategy(cpu_replicas=2)
    weights, history = _train(strategy, jit_compile=True, steps_per_execution=2)
    assert np.isfinite(history["loss"]).all() and len(history["loss"]) == 2
    # Same run with float32 math off XLA: mixed precision changes numbers only a little.
    keras.mixed_precision.set_global_policy("float32")
    reference_weights, _ = one_device_reference
    for w, ref in zip(weights, reference_weights, strict=True):
        np.testing.assert_allclose(w, ref, atol=5e-2)


def _text_files(root, count=400):
    words = "good bad movie film great awful plot actor scene boring fun love hate".split()
    rng = np.random.default_rng(0)
    for i in range(count):
        folder = root / ("pos" if i % 2 else "neg")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i}.txt").write_text(" ".join(rng.choice(words, 20)))


def test_evaluate_on_a_cached_set_counts_every_example(tmp_path):
    """keras-io's text example: the build read a batch with an iterator it dropped part-way,
    which left a .cache()d test set filled part-way (3 of 10 evaluations saw 192-288 of 400)."""
    _text_files(tmp_path)
    strategy = mk.strategy(cpu_replicas=2)
    vectorize = keras.layers.TextVectorization(max_tokens=100, output_sequence_length=20)
    raw = keras.utils.text_dataset_from_directory(tmp_path, batch_size=32, verbose=False)
    vectorize.adapt(raw.map(lambda x, y: x))

    def make_model():
        inputs = keras.Input((None,), dtype="int64")
        x = keras.layers.GlobalMaxPooling1D()(keras.layers.Embedding(100, 8)(inputs))
        model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(x))
        model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
        return model

    model = mk.build(make_model, strategy)
    counts = []
    for _ in range(10):
        raw = keras.utils.text_dataset_from_directory(
            tmp_path, batch_size=32, verbose=False, shuffle=False
        )
        test = raw.map(lambda x, y: (vectorize(tf.expand_dims(x, -1)), y)).cache().prefetch(10)
        model.evaluate(test, verbose=0)
        counts.append(sum(int(x.shape[0]) for x, _ in test))
    assert counts == [400] * 10


class TruePositives(keras.metrics.Metric):
    """The BinaryTruePositives of Keras's Metric docstring: result() is its own variable."""

    def __init__(self, name="tp", **kwargs):
        super().__init__(name=name, **kwargs)
        self.true_positives = self.add_variable(shape=(), initializer="zeros", name="tp")

    def update_state(self, y_true, y_pred, sample_weight=None):
        hits = keras.ops.logical_and(keras.ops.cast(y_true, "bool"), y_pred > 0.5)
        self.true_positives.assign(
            self.true_positives + keras.ops.sum(keras.ops.cast(hits, "float32"))
        )

    def result(self):
        return self.true_positives


def _true_positives_history(strategy):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
        model.compile(optimizer="sgd", loss="binary_crossentropy", metrics=[TruePositives()])
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = (x[:, :1] > 0).astype("float32")
    data = mk.distribute((x, y), strategy, global_batch_size=16, shuffle=False)
    history = model.fit(data, epochs=2, verbose=0).history
    return history["tp"], model.evaluate(data, verbose=0, return_dict=True)["tp"]


def test_a_custom_metric_variable_is_logged_as_one_device_number():
    one = _true_positives_history(mk.strategy("one_device"))
    two = _true_positives_history(mk.strategy(cpu_replicas=2))
    assert all(isinstance(v, float) for v in [*two[0], two[1]]), two
    assert two[0] == pytest.approx(one[0]) and two[1] == pytest.approx(one[1])


@pytest.mark.upstream
def test_python_logs_repair_is_needed_exactly_where_keras_logs_a_variable(taken_off):
    from mirrorkit.compat import python_logs

    strategy = mk.strategy(cpu_replicas=2)
    taken_off("python_logs")  # alone: the others stay in place
    logged, _ = _true_positives_history(strategy)
    assert python_logs.REPAIR.needed() == (not isinstance(logged[0], float)), type(logged[0])


def test_scoped_patches_are_listed_while_in_place_and_described():
    """ThroughputCallback's input clock patches TensorFlow's iterators for the fit only."""
    strategy = mk.strategy(cpu_replicas=2)
    model = mk.build(_model, strategy)
    seen = []

    class Look(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append((compat.active(), compat.describe()))

    x, y = np.ones((16, 4), "float32"), np.zeros((16, 2), "float32")
    model.fit(x, y, batch_size=8, verbose=0, callbacks=[mk.ThroughputCallback(verbose=0), Look()])
    names, rows = seen[0]
    clock = [name for name in names if name.startswith("input_clock.")]
    assert "input_clock.DistributedIterator.get_next" in clock, names
    # active()'s patches first, then the single objects' (the timer's chain on this model)
    assert [row["name"] for row in rows][: len(names)] == names
    assert "step_hooks.train_function" in [row["name"] for row in rows[len(names) :]], rows
    assert all(row["target"] and row["upstream"] and row["applies"] for row in rows)
    by_name = {row["name"]: row for row in rows}
    assert by_name["symbolic_build"]["target"].endswith("TensorFlowTrainer._maybe_symbolic_build")
    assert "while the part of mirrorkit" in by_name[clock[0]]["applies"]
    after = compat.active()
    assert not [name for name in after if name.startswith("input_clock.")], after


def test_the_epoch_hook_a_shuffled_input_puts_in_place_is_listed_and_removed():
    """fit_epoch is applied by mk.distribute, not enable: active() and describe() still show it."""
    compat.disable()
    assert "fit_epoch" not in compat.active()
    strategy = mk.strategy(cpu_replicas=2)
    x, y = np.ones((16, 4), "float32"), np.zeros((16, 2), "float32")
    mk.distribute((x, y), strategy, global_batch_size=8, seed=0)  # shuffled
    assert "fit_epoch" in compat.active()
    (row,) = [row for row in compat.describe() if row["name"] == "fit_epoch"]
    assert row["target"] == "keras.callbacks.CallbackList.on_epoch_begin"
    assert row["applies"] == "with the first shuffled mk.distribute input"
    compat.disable()
    assert "fit_epoch" not in compat.active()
    assert "mirrorkit" not in keras.callbacks.CallbackList.on_epoch_begin.__module__


class _FailInEpoch(keras.callbacks.Callback):
    """Raises at the start of (epoch, batch): a crash the next fit resumes from the backup."""

    def __init__(self, epoch, batch):
        super().__init__()
        self.at, self.epoch = (epoch, batch), None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            raise RuntimeError("failed here on purpose")


class _StepBackupEpochs(keras.callbacks.Callback):
    """The epoch each step backup says, read after BackupAndRestore (before it) wrote it."""

    def __init__(self, backup, said):
        super().__init__()
        self.path, self.said = pathlib.Path(backup, "training_metadata.json"), said

    def on_train_batch_end(self, batch, logs=None):
        self.said.append(json.loads(self.path.read_text())["epoch"])


@pytest.mark.upstream
def test_keras_step_backups_in_a_resumed_epoch_record_epoch_0_upstream(taken_off, tmp_path):
    """Keras's BackupAndRestore(save_freq=N) sets the epoch its backups record only at an
    epoch's end, so a fit resumed in epoch 2 writes epoch 0 in that epoch's step backups (a
    second crash there resumes at epoch 1). If this stops failing, retire backup_step_epoch."""
    compat.enable()  # every repair, as on a strategy mk.strategy() made
    taken_off("backup_step_epoch")  # alone: the others stay in place
    backup, said = str(tmp_path / "steps"), []

    def fit(*callbacks):
        model = tiny_model(4, 1)
        x, y = np.ones((8, 4), "float32"), np.zeros((8, 1), "float32")
        backups = keras.callbacks.BackupAndRestore(backup, save_freq=1)
        model.fit(x, y, batch_size=2, epochs=3, verbose=0, callbacks=[backups, *callbacks])

    with pytest.raises(RuntimeError, match="on purpose"):
        fit(_FailInEpoch(1, 2))
    with pytest.raises(RuntimeError, match="on purpose"):  # resumed in epoch 2, fails there again
        fit(_StepBackupEpochs(backup, said), _FailInEpoch(1, 3))
    # each step backup of the resumed epoch 2 records epoch 0 (0-based; a second crash resumes
    # at epoch 1); the repair writes 1, where it must resume
    assert said and set(said) == {0}, said


def _two_outputs():
    model_input = keras.Input((4,))
    outputs = {
        "a": keras.layers.Dense(1, name="a")(model_input),
        "b": keras.layers.Dense(1, name="b")(model_input),
    }
    model = keras.Model(model_input, outputs)
    model.compile(optimizer="sgd", loss={"a": "mse", "b": "mse"})
    rng = np.random.default_rng(7)
    model.set_weights([rng.normal(size=w.shape).astype("float32") for w in model.get_weights()])
    return model


@pytest.mark.upstream
def test_per_output_loss_metrics_weigh_by_the_static_batch_upstream():
    """The canary of per_output_loss, taken off alone: a last batch of 3 split 2 + 1 over two
    replicas weighs each output's loss metric unlike one device (the total loss is right)."""
    from mirrorkit.compat import per_output_loss

    replicas, one_device = mk.strategy(cpu_replicas=2), mk.strategy("one_device")
    rng = np.random.default_rng(1)
    x = rng.normal(size=(7, 4)).astype("float32")
    y = {name: rng.normal(size=(7, 1)).astype("float32") for name in ("a", "b")}
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)  # 4, then 3: split 2 + 1
    one = mk.build(_two_outputs, one_device).evaluate(data, return_dict=True, verbose=0)
    if per_output_loss.REPAIR.fits:  # Keras 3.16 (nightly): it stays off there, unfitting
        repaired = mk.build(_two_outputs, replicas).evaluate(data, return_dict=True, verbose=0)
        assert repaired == pytest.approx(one, rel=1e-5)
    per_output_loss.REPAIR.remove()
    try:
        plain = mk.build(_two_outputs, replicas).evaluate(data, return_dict=True, verbose=0)
    finally:
        compat.enable(replicas)
    assert plain["loss"] == pytest.approx(one["loss"], rel=1e-5)
    assert abs(plain["a_loss"] - one["a_loss"]) > 0.1, (
        f"per_output_loss: Keras {keras.__version__} weighs each output's loss metric as one "
        f"device does ({plain} against {one}): retire the repair"
    )
