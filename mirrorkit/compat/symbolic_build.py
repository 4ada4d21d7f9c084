"""Repair: build the model from one local replica's batch, not a cross-replica mean.

Upstream: keras-team/keras#20585 (multi-worker), keras-team/keras#19246 and
tensorflow/tensorflow#80951 (single host); docs: compat/#first-batch-build.
``TensorFlowTrainer._maybe_symbolic_build`` eagerly calls
``strategy.reduce("MEAN", first_batch, axis=None)`` on the whole ``(x, y)``
structure before ``fit``, ``evaluate``, ``train_on_batch`` and
``test_on_batch``. Under MultiWorkerMirroredStrategy that raises ``ValueError:
Attempt to convert a value (PerReplica...)``; under MirroredStrategy it needs
equal per-replica shapes and numeric dtypes, so a first batch smaller than the
replica count, or string inputs, fail. The build needs only shapes and dtypes,
which the first local replica's part of the input's ``element_spec`` has; the
replacement builds from it, with no collective and without reading a batch.
Reading one (as Keras does) made an iterator that was dropped part-way while
the loop's own iterator started: on a ``.cache()``d evaluation set that left
the cache filled part-way, and ``evaluate`` counted 160-256 of 400 examples
(docs: compat/#first-batch-build). When the input has no element spec
it reads Keras's epoch iterator, whatever the shape of its items
(docs: compat/#epoch-iterator-items).

A model whose class defines no ``call()`` (the keras.io GANs and VAE define
only ``train_step``) cannot be built from a batch: Keras's own symbolic build
fails ("Unable to automatically build the model") under any strategy, while
on one device Keras defers the build to the traced step. The replacement
defers it too (docs: compat/#models-without-call). A model built
outside every strategy's scope, handed a distributed dataset, gets an error
that names the cause and the fix instead of Keras's ``Only input tensors may
be passed as positional arguments`` about a ``PerReplica`` value.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from mirrorkit import internals
from mirrorkit.cluster.workers import spans_replicas
from mirrorkit.patching.repair import Repair

_USED_FOR = "the symbolic_build repair (building the model from one replica's batch)"


def _first_local(value):
    if isinstance(value, tf.distribute.DistributedValues):
        return value.values[0]
    return value


def _batch_iterator(item):
    """The data iterator in one item of Keras's epoch iterator, whatever its tuple shape.

    Keras 3.10 yields ``(step, iterator)``; Keras 3.11 and later yield
    ``(begin_step, end_step, iterator)``. Both end with the iterator.
    """
    it = item[-1] if isinstance(item, tuple) and item else None
    if it is None or not hasattr(it, "__next__"):
        raise internals.changed(
            "keras TFEpochIterator items",
            _USED_FOR,
            f"an item is {type(item).__name__} {item!r:.80}, not a tuple ending with the "
            "data iterator",
        )
    return it


def _first_local_spec(spec):
    """The first local replica's part of a distributed input's element spec."""
    if type(spec).__name__ == "PerReplicaSpec":
        components = internals.require(
            spec, "_component_specs", name="tf.distribute PerReplicaSpec._component_specs",
            used_for=_USED_FOR,
        )  # fmt: skip
        return components[0]
    return spec


def _epoch_dataset(epoch_iterator):
    """The (distributed) dataset Keras's epoch iterator reads."""
    return internals.require(
        epoch_iterator, "_distributed_dataset", name="keras TFEpochIterator._distributed_dataset",
        used_for=_USED_FOR,
    )  # fmt: skip


def _spec_batch(epoch_iterator):
    """Shapes and dtypes of one local batch, from the input's element spec (no batch read)."""
    dataset = _epoch_dataset(epoch_iterator)
    spec = getattr(dataset, "element_spec", None)  # public on every tf.data/tf.distribute input
    if spec is None:
        return None
    return tf.nest.map_structure(_first_local_spec, spec)


def defines_call(model: keras.Model) -> bool:
    """Whether `model`'s class (or a Keras model class it derives from) defines ``call()``."""
    owner = next((cls for cls in type(model).__mro__ if "call" in vars(cls)), None)
    return owner not in (None, keras.Model, keras.layers.Layer)


def _keras_data_parallel_set() -> bool:
    """Whether Keras's global distribution is a ``keras.distribution.DataParallel``."""
    current = getattr(getattr(keras, "distribution", None), "distribution", None)
    try:
        return type(current()).__name__ == "DataParallel" if current else False
    except Exception:  # noqa: BLE001 - a Keras without it: the general message
        return False


def _check_built_under_a_strategy(model, iterator) -> None:
    """Raises if a model made outside every strategy's scope is handed per-replica input."""
    if iterator is None:
        return
    spec = getattr(_epoch_dataset(iterator), "element_spec", None)
    per_replica = [s for s in tf.nest.flatten(spec) if type(s).__name__ == "PerReplicaSpec"]
    if not per_replica:
        return
    if _keras_data_parallel_set():  # keras.distribution.set_distribution after the model
        raise ValueError(
            f"{type(model).__name__} was built before keras.distribution.set_distribution("
            "DataParallel(...)), so its variables live on one device, but the DataParallel "
            "hands it batches split between replicas. Build (or load) the model after "
            "set_distribution, or inside distribution.scope() (docs: keras-distribution/)."
        )
    raise ValueError(
        f"{type(model).__name__} was built outside any strategy's scope, so its variables live "
        "on one device, but it was handed a distributed dataset (per-replica batches, e.g. "
        "from mk.distribute). Build and compile the model under the strategy that distributed "
        "the data: model = mk.build(make_model, strategy), or put the model's construction and "
        "compile() under `with strategy.scope():`. A model that is already trained can be "
        "saved and loaded again under the scope (model.save(path), then "
        "keras.models.load_model(path) inside `with strategy.scope():`)."
    )


def _replacement(original):
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = internals.require(
            self, "_distribute_strategy", name="keras Trainer._distribute_strategy",
            used_for=_USED_FOR,
        )  # fmt: skip
        symbolic_build = internals.require(
            self, "_symbolic_build", name="keras Trainer._symbolic_build", used_for=_USED_FOR
        )
        if strategy is None:
            _check_built_under_a_strategy(self, iterator)
            return original(self, iterator=iterator, data_batch=data_batch)
        if not defines_call(self):
            return  # as on one device: the traced step builds what it uses
        if iterator is not None:
            data_batch = _spec_batch(iterator)
        if iterator is not None and data_batch is None:
            for item in iterator:
                data_batch = keras.tree.map_structure(_first_local, next(_batch_iterator(item)))
                break
        try:
            with strategy.scope():
                symbolic_build(data_batch=data_batch)
        except RuntimeError as error:
            if "Mixing different tf.distribute.Strategy objects" not in str(error):
                raise
            raise RuntimeError(
                f"The model was made under {type(strategy).__name__}'s scope, but its optimizer "
                "or metrics were made outside it (usually model.compile(...) after the `with "
                "strategy.scope():` block): they must be made under the same strategy. Move "
                "compile into the block, or build and compile in one function passed to "
                f"mk.build. TensorFlow said: {error}"
            ) from error

    _maybe_symbolic_build.__wrapped__ = original
    return _maybe_symbolic_build


def _models_build_under_it(strategy) -> bool:
    """Whether Keras builds a model made under `strategy` symbolically: any but the default."""
    if spans_replicas(strategy):
        return True
    with strategy.scope():
        return tf.distribute.has_strategy()  # False only for TensorFlow's default strategy


REPAIR = Repair(
    name="symbolic_build",
    upstream="keras-team/keras#20585, #19246",
    module="keras.src.backend.tensorflow.trainer",
    target="TensorFlowTrainer._maybe_symbolic_build",
    replacement=_replacement,
    applies_to=_models_build_under_it,
    account="first-batch-build",
    tests=(
        "tests/test_compat.py::test_evaluate_on_a_cached_set_counts_every_example",
        "tests/test_multiworker.py::test_plain_keras_multi_worker_fit_fails_upstream",
        "tests/test_multiworker.py::test_two_workers_train_like_one_process",
        "tests/test_compat.py::test_first_batch_smaller_than_replica_count_fails_upstream",
        "tests/test_compat.py::test_first_batch_smaller_than_replica_count_trains",
        "tests/test_compat.py::test_string_inputs_fail_upstream",
        "tests/test_compat.py::test_string_inputs_with_string_lookup_train",
        "tests/test_internals.py::test_symbolic_build_reads_either_epoch_iterator_shape",
        "tests/test_own_train_step.py::test_a_model_without_call_fails_to_build_upstream",
        "tests/test_own_train_step.py::test_a_model_without_call_fits_under_a_one_device_strategy_too",
        "tests/test_keras_io_examples.py::test_final_weights_as_one_device[dcgan]",
        "tests/test_keras_io_examples.py::test_final_weights_as_one_device[wgan_gp]",
        "tests/test_keras_io_examples.py::test_final_weights_as_one_device[vae]",
        "tests/test_own_train_step.py::test_a_model_built_outside_the_scope_is_told_what_to_do",
    ),
)
