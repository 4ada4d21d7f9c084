"""Each private TensorFlow/Keras internal mirrorkit touches has a guard that fires.

Every test takes one internal away (monkeypatch: a TensorFlow or Keras release
that renamed it) and checks that the user gets an `InternalChangedError` or an
`InternalChangedWarning` naming the internal and the tested range, instead of
an AttributeError deep in a traceback or a silent no-op.
"""

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf
from _models import tiny_model
from _quoted import assert_quoted_in, quoted_block
from keras.src.backend.tensorflow import optimizer as tf_optimizer
from keras.src.backend.tensorflow import trainer

import mirrorkit as mk
from mirrorkit import compat, internals, versions
from mirrorkit.compat import multi_worker_reduce, step_function, symbolic_build

TESTED = versions.tested_range()


@pytest.fixture
def repairs_restored():
    compat.disable()
    yield
    compat.disable()
    compat.enable()


_model = functools.partial(tiny_model, 4, 2, "adam")


def _data(n=16):
    x = np.ones((n, 4), "float32")
    return tf.data.Dataset.from_tensor_slices((x, np.zeros((n, 2), "float32"))).batch(8)


def test_require_names_the_internal_and_the_tested_range():
    class Owner:
        pass

    with pytest.raises(internals.InternalChangedError) as caught:
        internals.require(Owner(), "_gone", name="Owner._gone", used_for="a test")
    message = str(caught.value)
    assert "Owner._gone" in message and "a test" in message and TESTED in message
    assert f"Keras {keras.__version__}" in message


# symbolic_build: the epoch iterator's items and the trainer's private fields


@pytest.mark.parametrize("item", [(0, "it"), (0, 1, "it")])
def test_symbolic_build_reads_either_epoch_iterator_shape(item):
    data = iter([{"x": 1}])
    item = tuple(data if v == "it" else v for v in item)
    assert symbolic_build._batch_iterator(item) is data


def test_symbolic_build_unknown_epoch_iterator_item_is_named():
    with pytest.raises(internals.InternalChangedError, match="TFEpochIterator items"):
        symbolic_build._batch_iterator(7)


def test_symbolic_build_without_the_trainer_strategy_field_is_named():
    build = symbolic_build._replacement(lambda *args, **kwargs: None)
    with pytest.raises(internals.InternalChangedError, match="Trainer._distribute_strategy"):
        build(object())


def test_symbolic_build_without_the_epoch_iterator_dataset_is_named():
    missing = "TFEpochIterator._distributed_dataset"
    with pytest.raises(internals.InternalChangedError, match=missing):
        symbolic_build._spec_batch(object())


def test_symbolic_build_without_per_replica_component_specs_is_named():
    PerReplicaSpec = type("PerReplicaSpec", (), {})  # the name, without its components
    with pytest.raises(internals.InternalChangedError, match="PerReplicaSpec._component_specs"):
        symbolic_build._first_local_spec(PerReplicaSpec())


# step_function: Keras's per-step closure and the trainer module's `tf`


def test_step_function_renamed_closure_is_an_error_not_a_no_op(monkeypatch):
    monkeypatch.setattr(step_function, "_STEP_CLOSURE", "closure_keras_never_had")
    model = mk.build(lambda: _model(steps_per_execution=2), mk.strategy(cpu_replicas=2))
    with pytest.raises(internals.InternalChangedError, match="_make_function"):
        model.fit(_data(), epochs=1, verbose=0)


def test_step_function_without_trainer_tf_is_named(monkeypatch):
    monkeypatch.delattr(trainer, "tf")
    with pytest.raises(internals.InternalChangedError, match=r"trainer\.tf"):
        with step_function.step_compiled_as(inline=True):
            pass


# multi_worker_reduce: Keras's own multi-worker test


def test_multi_worker_reduce_without_keras_check_is_named(repairs_restored, monkeypatch):
    monkeypatch.delattr(trainer, "_collective_all_reduce_multi_worker")
    with pytest.raises(internals.InternalChangedError, match="_collective_all_reduce_multi_worker"):
        multi_worker_reduce.REPAIR.apply()
    assert not multi_worker_reduce.REPAIR.active


# Repair targets (every repair): a missing target warns, the repair is not applied


def test_repair_with_missing_target_warns_and_stays_off(repairs_restored, monkeypatch):
    from keras.src.callbacks import model_checkpoint

    monkeypatch.delattr(model_checkpoint.ModelCheckpoint, "_save_model")
    (repair,) = [r for r in compat.REPAIRS if r.name == "chief_checkpoint_save"]
    with pytest.warns(
        internals.InternalChangedWarning, match="ModelCheckpoint._save_model"
    ) as said:
        assert repair.apply() is False
    assert not repair.active
    quote = quoted_block("compat.md", "here for a release without")
    assert_quoted_in(quote, "\n".join(str(warning.message) for warning in said))


# optimizer._all_reduce_sum_gradients: gradient compression and the throughput clock


def test_compression_without_all_reduce_hook_is_named(monkeypatch):
    from mirrorkit.training import compression

    monkeypatch.delattr(tf_optimizer.TFOptimizer, "_all_reduce_sum_gradients")
    strategy = mk.strategy(cpu_replicas=2)
    with strategy.scope():
        model = _model()
    with pytest.raises(internals.InternalChangedError, match="_all_reduce_sum_gradients"):
        compression.apply(model, "fp16", strategy)


def test_step_clock_without_all_reduce_hook_warns(monkeypatch):
    from mirrorkit.throughput.step_clock import StepClock

    monkeypatch.delattr(tf_optimizer.TFOptimizer, "_all_reduce_sum_gradients")
    strategy = mk.strategy(cpu_replicas=2)
    with strategy.scope():
        model = _model()
    with pytest.warns(internals.InternalChangedWarning, match="_all_reduce_sum_gradients"):
        assert StepClock().install(model) is False


# model._loss_tracker: ThroughputCallback's global batch size


def test_throughput_without_loss_tracker_warns(monkeypatch):
    model = _model()
    monkeypatch.delattr(model, "_loss_tracker")
    callback = mk.ThroughputCallback(verbose=0)
    callback.set_model(model)
    with pytest.warns(internals.InternalChangedWarning, match="_loss_tracker"):
        assert callback._batch_from_loss_tracker(1) is None


# tf.data's private dataset classes: mk.distribute must not batch twice


@pytest.fixture
def batched_unverified(monkeypatch):
    from mirrorkit.pipeline import batched

    monkeypatch.setattr(batched, "_verified", False)
    return batched


def test_batched_detection_works_on_this_tensorflow(batched_unverified):
    found = batched_unverified.find(tf.data.Dataset.range(10).map(lambda x: x).batch(4))
    assert found == batched_unverified.Batching(4, False, drop_remainder=False, num_examples=10)


def test_renamed_batch_dataset_class_is_an_error(monkeypatch, batched_unverified):
    monkeypatch.setattr(batched_unverified, "_BATCHING", ("_RenamedBatchDataset",))
    with pytest.raises(internals.InternalChangedError, match="tf.data dataset classes"):
        mk.distribute(
            tf.data.Dataset.range(8).batch(4), mk.strategy(cpu_replicas=2), global_batch_size=4
        )


def test_renamed_input_link_is_an_error(monkeypatch, batched_unverified):
    monkeypatch.setattr(batched_unverified, "_INPUT_LINK", "_renamed_input_dataset")
    with pytest.raises(internals.InternalChangedError, match="_renamed_input_dataset"):
        batched_unverified.find(tf.data.Dataset.range(8).batch(4))


# Strategy builders: a MirroredStrategy's communication options and collective key base


def _strip_after_init(monkeypatch, attr, value=None):
    from tensorflow.python.distribute import mirrored_strategy

    original = mirrored_strategy.MirroredExtended.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if value is None:
            delattr(self, attr)
        else:
            setattr(self, attr, value)

    monkeypatch.setattr(mirrored_strategy.MirroredExtended, "__init__", init)


def test_communication_options_missing_is_named(monkeypatch):
    _strip_after_init(monkeypatch, "_communication_options")
    with pytest.raises(internals.InternalChangedError, match=r"extended\._communication_options"):
        mk.strategy(cpu_replicas=2, bucket_mb=4)


def _mirrored_two_cpus():
    from mirrorkit.strategies import kinds

    return kinds.mirrored(
        devices=None, num_gpus=None, cpu_replicas=2, all_reduce="auto", bucket_mb=None,
        timeout_s=None,
    )  # fmt: skip


def test_collective_key_base_missing_is_named(monkeypatch):
    assert _mirrored_two_cpus().num_replicas_in_sync == 2
    monkeypatch.delattr(tf.distribute.MirroredStrategy, "_collective_key_base")
    with pytest.raises(internals.InternalChangedError, match="_collective_key_base"):
        _mirrored_two_cpus()


def test_collective_key_base_not_taken_is_named(monkeypatch):
    _strip_after_init(monkeypatch, "_collective_key_base", value=-1)
    with pytest.raises(internals.InternalChangedError, match="did not take the base"):
        _mirrored_two_cpus()


def test_default_strategy_lookup_missing_is_named(monkeypatch):
    from tensorflow.python.distribute import distribute_lib

    from mirrorkit.strategies import kinds

    monkeypatch.delattr(distribute_lib, "_get_default_strategy")
    with pytest.raises(internals.InternalChangedError, match="_get_default_strategy"):
        kinds.BUILDERS["default"]()  # what mk.strategy("default") calls (it may have cached one)


# Other modules' guards: mirrorkit.flags (--num_packs) and NaNGuard


def test_num_packs_without_cross_device_ops_is_named(monkeypatch):
    from mirrorkit.flags import consume

    strategy = mk.strategy(cpu_replicas=2)
    monkeypatch.delattr(strategy.extended, "_cross_device_ops")
    with pytest.raises(internals.InternalChangedError, match="_cross_device_ops"):
        consume.set_num_packs(strategy, "hierarchical_copy", 2)


def test_nan_guard_without_all_reduce_hook_is_named(monkeypatch):
    monkeypatch.delattr(tf_optimizer.TFOptimizer, "_all_reduce_sum_gradients")
    model = mk.build(_model, mk.strategy(cpu_replicas=2))
    guard = mk.callbacks.NaNGuard()
    guard.set_model(model)
    with pytest.raises(internals.InternalChangedError, match="_all_reduce_sum_gradients"):
        guard.on_train_begin()


# gradient_accumulation: the optimizer's private accumulation machinery


def test_gradient_accumulation_without_optimizer_internal_is_named(monkeypatch):
    from keras.src.optimizers import base_optimizer

    def make():
        return tiny_model(4, 2, keras.optimizers.SGD(gradient_accumulation_steps=2))

    model = mk.build(make, mk.strategy(cpu_replicas=2))
    monkeypatch.delattr(base_optimizer.BaseOptimizer, "_get_variable_index")
    with pytest.raises(internals.InternalChangedError, match="_get_variable_index"):
        model.fit(_data(), epochs=1, verbose=0)


def test_renamed_reshuffle_field_is_an_error(monkeypatch, batched_unverified):
    monkeypatch.setattr(batched_unverified, "_RESHUFFLE_FIELD", "_renamed_reshuffle")
    with pytest.raises(internals.InternalChangedError, match="_renamed_reshuffle"):
        batched_unverified.caches_a_shuffle(tf.data.Dataset.range(8).batch(4))


# Private modules, loaded by internals.load_module / load: a moved one is named, not an ImportError


def test_step_function_with_a_moved_trainer_module_is_named(monkeypatch):
    monkeypatch.setattr(step_function, "_TRAINER", "keras.src.backend.tensorflow.moved_trainer")
    with pytest.raises(internals.InternalChangedError, match="moved_trainer") as caught:
        with step_function.step_compiled_as(inline=True):
            pass
    assert TESTED in str(caught.value)


def test_repair_with_a_moved_module_warns_and_stays_off(repairs_restored):
    import dataclasses

    repair = dataclasses.replace(multi_worker_reduce.REPAIR, module="keras.src.moved_trainer")
    with pytest.warns(internals.InternalChangedWarning, match="keras.src.moved_trainer"):
        assert repair.apply() is False
    assert not repair.active


# Private fields once read with a silent default: now an error or a said warning


def test_collective_key_base_missing_on_extended_is_named(monkeypatch):
    _strip_after_init(monkeypatch, "_collective_key_base")
    with pytest.raises(internals.InternalChangedError, match=r"extended\._collective_key_base"):
        _mirrored_two_cpus()


def test_all_reduce_description_without_its_fields_warns(monkeypatch):
    from mirrorkit.strategies import allreduce

    strategy = mk.strategy(cpu_replicas=2)
    assert allreduce.describe_ops(strategy) != "unknown"
    monkeypatch.delattr(strategy.extended, "_communication_options")
    monkeypatch.delattr(strategy.extended, "_cross_device_ops")
    with pytest.warns(internals.InternalChangedWarning, match="_communication_options"):
        assert allreduce.describe_ops(strategy) == "unknown"


def test_resumable_without_initial_epoch_warns(monkeypatch, tmp_path):
    from mirrorkit.faults import backup

    callback = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    backup._record_progress(callback, str(tmp_path / "progress.json"))
    model = _model()
    monkeypatch.delattr(model, "_initial_epoch")
    callback.set_model(model)
    with pytest.warns(internals.InternalChangedWarning, match="Model._initial_epoch"):
        callback.on_train_begin()


def test_nested_layers_without_flatten_layers_is_named(monkeypatch):
    from mirrorkit.scale import batchnorm

    model = _model()
    monkeypatch.delattr(keras.layers.Layer, "_flatten_layers")
    with pytest.raises(internals.InternalChangedError, match="_flatten_layers"):
        batchnorm.all_layers(model)
