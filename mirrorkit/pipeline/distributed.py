"""`mk.distribute`: one call from data to a per-replica distributed dataset.

This module reads what the caller passed (which kind of data, which options,
the shared shuffle seed) and hands it to `mirrorkit.pipeline.assemble`,
which builds the tf.data pipeline for that kind.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from mirrorkit import compat, distributed_data
from mirrorkit.cluster import chief
from mirrorkit.cluster import workers as workers_lib
from mirrorkit.compat import keras_hub_inputs
from mirrorkit.pipeline import assemble, batch_sizes, batched, repeating, sources, tfds_source
from mirrorkit.pipeline.options import Options
from mirrorkit.strategies import current


def distribute(
    data: Any,
    strategy: tf.distribute.Strategy | None = None,
    *,
    per_replica_batch_size: int | None = None,
    global_batch_size: int | None = None,
    shuffle: bool | None = None,
    seed: int | None = None,
    drop_remainder: bool | str = "auto",
    shard: str = "auto",
    cache: bool = False,
    prefetch: bool = True,
    for_eval: bool = False,
    split: str | None = None,
    data_dir: str | None = None,
    as_supervised: bool = True,
    preprocess: Callable[..., Any] | None = None,
    shuffle_buffer_size: int | None = None,
    class_weight: dict[int, float] | None = None,
) -> tf.distribute.DistributedDataset:
    """Batches, shards and distributes `data` so each replica gets its own slice.

    Every replica receives a different part of each global batch; over an
    epoch every example is used once across all replicas and workers. In
    training (the default), a last partial global batch is dropped and the
    count said once; with ``for_eval=True`` every example is used exactly once
    and in order, so ``evaluate`` matches one device on the whole set and
    ``predict`` returns one row per input, in input order (TensorFlow splits
    the smaller last batch among the replicas).

    Args:
        data: a ``tf.data.Dataset``, unbatched or already batched (as
            ``image_dataset_from_directory`` and Keras's other dataset
            utilities make it: given neither batch size, or its own batch size,
            its batches are kept as they are, their length included, and its
            batch is the global batch; given another size, it is unbatched
            and batched again, said once); NumPy arrays or
            tensors as ``x``, a dict, or ``(x, y[, sample_weight])``; a
            function ``fn(input_context) -> tf.data.Dataset`` run once per
            worker (return unbatched elements, or batches of
            ``input_context.get_per_replica_batch_size(global_batch_size)``);
            or a tensorflow-datasets name or builder, with ``split=``, already
            prepared on disk.
        strategy: the strategy to distribute for; the current one when None.
        per_replica_batch_size: examples per replica per step.
        global_batch_size: examples per step over all replicas. Give exactly
            one of the two (or neither for an already-batched dataset); the
            other is derived.
        shuffle: shuffle before batching, with a new order each epoch; on by
            default in training, off for ``for_eval`` and for a dataset whose
            batches are kept (its own shuffle applies). In-memory arrays take
            the order of (seed, epoch), which `mk.resumable` and
            `mk.PreemptionCheckpoint` replay on resume
            (docs: resume/#shuffled-input-resumes-in-its-own-order).
        seed: makes the shuffled orders repeatable. When None, a seed is
            drawn once and shared by all workers (said once).
        drop_remainder: ``"auto"`` drops a last partial global batch in
            training and keeps it for evaluation; True or False force it. An
            already-batched dataset's kept batches lose their last partial
            batch in training only where the replicas cannot share it evenly.
        shard: how workers divide the data: ``"auto"`` (by file when there
            are at least as many files as workers, else by example),
            ``"file"``, ``"example"``, or ``"off"`` (each worker reads all of
            its own input, its share of each global batch a step: for an input
            you shard yourself, or the same examples on every worker).
        cache: cache the decoded examples in memory after the first epoch.
        prefetch: prefetch batches in the background.
        for_eval: evaluation or prediction input: no shuffle, no dropped
            examples, input order kept.
        split: the tfds split, e.g. ``"train"`` or ``"test[:50%]"``.
        data_dir: where the tfds dataset is prepared.
        as_supervised: read tfds examples as ``(input, label)`` tuples.
        preprocess: a function applied to each example after shuffling and
            before batching (decoding, augmentation).
        shuffle_buffer_size: examples in the shuffle buffer; in-memory arrays
            are shuffled whole, streamed sources keep 8 global batches (at
            least 1,024; see `streaming_buffer`).
        class_weight: ``{class id: weight}``: each ``(x, y)`` example gets
            its class's weight as its sample weight, exactly as Keras's
            ``fit(class_weight=...)`` does on one device (which cannot map a
            distributed dataset). ``fit(mk.distribute(...), class_weight=...)``
            comes here by itself (docs:
            compat/#class-weights-on-a-distributed-dataset).

    Returns:
        TensorFlow's own distributed dataset, which ``fit``, ``evaluate`` and
        ``predict`` accept, with attributes ``global_batch_size``,
        ``per_replica_batch_size``, ``num_examples`` and ``steps_per_epoch``
        (None when unknown) and ``dropped_per_epoch``, and
        ``with_class_weight(class_weight)``, which makes the same input with
        class weights.

    Raises:
        ValueError: both batch sizes or neither; a global size the replicas
            do not divide; training data smaller than one global batch; a
            per-worker function's batches of the wrong size; a tfds split that
            does not exist; contradictory options.
        TypeError: `data` is of a kind it cannot read.

    Example:
    ```python
    import keras
    import numpy as np
    import mirrorkit as mk

    def make_model():  # built and compiled inside the strategy's scope, by mk.build
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse", metrics=["mae"])
        return model

    strategy = mk.strategy(cpu_replicas=2)
    model = mk.build(make_model, strategy)
    x, y = np.ones((100, 4), "float32"), np.zeros((100, 1), "float32")
    train = mk.distribute((x, y), strategy, global_batch_size=32, seed=0)
    model.fit(train, epochs=2)  # 3 steps per epoch; the last 4 examples are dropped, said once
    model.evaluate(mk.distribute((x, y), strategy, global_batch_size=32, for_eval=True))
    ```
    """
    # Keras warns on every fit() that its shuffle=True does not apply to a dataset; this
    # dataset shuffles itself (shuffle=), so the warning would only mislead.
    warnings.filterwarnings(
        "ignore", message="`shuffle=True` was passed, but will be ignored", category=UserWarning
    )
    if strategy is None:  # resolved now, so that with_class_weight rebuilds for this strategy
        strategy = current.current_strategy()
    compat.apply_when_imported(keras_hub_inputs.REPAIR)  # a keras-hub task may take it
    arguments = dict(locals())
    made, seed = _distribute(**arguments)

    def with_class_weight(weights: dict[int, float]) -> tf.distribute.DistributedDataset:
        return distribute(**{**arguments, "seed": seed, "class_weight": weights})

    order = distributed_data.record(made).epoch_order  # not `made`: no cycle via the twin

    def twin(class_weight: dict[int, float] | None) -> tf.distribute.DistributedDataset:
        again = {**arguments, "seed": seed}
        if class_weight is not None:
            again["class_weight"] = class_weight
        # The same epoch order (seed and epoch): what restores or sets one sets the other.
        return _distribute(**again, repeat=True, order=order)[0]

    distributed_data.update(made, with_class_weight=with_class_weight)
    repeating.attach(made, twin, data)
    return made


def _distribute(
    data: Any,
    strategy: tf.distribute.Strategy | None,
    *,
    per_replica_batch_size: int | None,
    global_batch_size: int | None,
    shuffle: bool | None,
    seed: int | None,
    drop_remainder: bool | str,
    shard: str,
    cache: bool,
    prefetch: bool,
    for_eval: bool,
    split: str | None,
    data_dir: str | None,
    as_supervised: bool,
    preprocess: Callable[..., Any] | None,
    shuffle_buffer_size: int | None,
    class_weight: dict[int, float] | None,
    repeat: bool = False,
    order: Any = None,
) -> tuple[tf.distribute.DistributedDataset, int | None]:
    """`distribute`'s work; returns the dataset and the shuffle seed it used.

    `repeat` makes the twin that repeats its epochs (`mirrorkit.pipeline.repeating`),
    shuffling in-memory arrays by `order`, the dataset's own `EpochOrder`.
    """
    if strategy is None:
        strategy = current.current_strategy()
    found = batched.find(data) if isinstance(data, tf.data.Dataset) else None
    if isinstance(data, tf.data.Dataset) and not for_eval and batched.caches_a_shuffle(data):
        assemble.say_cached_shuffle()
    if found is not None and per_replica_batch_size is None and global_batch_size is None:
        sizes = _own_batch(found, strategy.num_replicas_in_sync)
    else:
        sizes = batch_sizes.resolve(
            strategy.num_replicas_in_sync, per_replica_batch_size, global_batch_size
        )
    keep_batches = (
        found is not None
        and found.batch_size == sizes.global_batch_size
        and shuffle is not True
        and preprocess is None
    )
    options = Options.check(
        False if keep_batches else shuffle,
        drop_remainder,
        shard,
        for_eval,
        cache,
        prefetch,
        preprocess,
        shuffle_buffer_size,
        class_weight,
    )
    options.repeat, options.order = repeat, order
    workers = workers_lib.num_workers(strategy)
    if isinstance(data, tf.data.Dataset) and workers > 1 and options.shard != "off":
        _say_sharded_twice(data, workers)
    if keep_batches:
        return assemble.kept_batches(data, found, strategy, sizes, options, workers), None
    announce = options.shuffle and seed is None  # said once the pipeline is made, not before
    if options.shuffle:
        seed = _agreed_seed(strategy, workers) if seed is None else int(seed)
    if tfds_source.is_tfds(data):
        tfds_split = tfds_source.open_split(data, split, data_dir, as_supervised)
        if assemble.reads_own_files(tfds_split, options, workers):
            made = assemble.per_worker_tfds(tfds_split, strategy, sizes, options, seed, workers)
            return _say_seed(made, seed, announce), seed
        if workers > 1:
            chief.say_once(
                "tfds-every-worker",
                f"every worker reads all of {tfds_split.builder.name}[{tfds_split.split}] and "
                "keeps its share of each batch ("
                + (
                    "evaluation: every example once, in order)"
                    if options.for_eval
                    else f"{tfds_split.num_files} files for {workers} workers)"
                ),
            )
        source = sources.Source(
            tfds_split.read(None, shuffle_files=options.shuffle, seed=seed),
            tfds_split.num_examples,
        )
    elif isinstance(data, tf.data.Dataset):
        source = sources.from_dataset(data, sizes.global_batch_size, found)
    elif sources.is_array_data(data):
        source = sources.from_arrays(data)
    elif callable(data):
        return assemble.from_function(data, strategy, sizes, options), None
    else:
        raise TypeError(
            f"mk.distribute cannot read {_what(data)}. Pass an unbatched "
            "tf.data.Dataset, NumPy arrays as x or (x, y[, sample_weight]), a dict of arrays, a "
            "function fn(input_context) -> tf.data.Dataset, or a tfds name or builder with "
            "split=. (A keras.utils.PyDataset goes to fit() directly.)" + _hint(data)
        )
    made = assemble.global_pipeline(source, strategy, sizes, options, seed, workers)
    made_order = distributed_data.record(made).epoch_order
    if made_order is not None and order is None:  # a twin's order is its dataset's
        made_order.seed_drawn = announce
    return _say_seed(made, seed, announce), seed


def _own_batch(found: batched.Batching, num_replicas: int) -> batch_sizes.BatchSizes:
    """The batch sizes of an already-batched dataset given neither size: its batch is global."""
    size = found.batch_size
    if size is None:
        raise ValueError(
            "data is already batched, but its batch size is not fixed in the pipeline (a tensor "
            "batch size), so mk.distribute cannot tell the global batch. Pass "
            "global_batch_size= (it then unbatches and batches again)."
        )
    if size % num_replicas:
        below = max(num_replicas, size // num_replicas * num_replicas)
        raise ValueError(
            f"data is already batched with batch size {size}, which does not divide among "
            f"{num_replicas} replicas (each would take a different share, and Keras would weigh "
            f"the shares unequally). Batch it by a multiple of {num_replicas} (e.g. {below} or "
            f"{below + num_replicas}), or pass global_batch_size= to have mk.distribute batch "
            "it again."
        )
    return batch_sizes.resolve(num_replicas, None, size)


def _what(data: Any) -> str:
    """Names what `data` is, down to the members of a tuple or dict that are not arrays."""
    if isinstance(data, (tuple, list)) and data:
        members = ", ".join(type(v).__name__ for v in data)
        return f"data of type {type(data).__name__}: data is a {type(data).__name__} of ({members})"
    return f"data of type {type(data).__name__}"


def _hint(data: Any) -> str:
    """What to do for the kinds of data users commonly try."""
    members = list(data) if isinstance(data, (tuple, list)) else [data]
    kinds = {type(v).__module__.split(".")[0] + "." + type(v).__name__ for v in members}
    if any(k.startswith("pandas.") for k in kinds):
        return (
            " For pandas, pass NumPy arrays: df.to_numpy() (and series.to_numpy()), or "
            "{name: df[name].to_numpy() for name in df} for named inputs."
        )
    if any(k.endswith((".generator", ".Iterator")) or "generator" in k for k in kinds):
        return (
            " For a Python generator, wrap its function as tf.data.Dataset.from_generator(fn, "
            "output_signature=...) and pass that dataset."
        )
    if any(k in ("builtins.list", "builtins.tuple") for k in kinds):
        return (
            " Python lists: convert each with np.asarray(...); rows of different lengths need "
            "tf.ragged.constant(...) or padding (keras.utils.pad_sequences)."
        )
    return ""


def _agreed_seed(strategy: tf.distribute.Strategy, workers: int) -> int:
    """A fresh random seed, the chief's, shared with every worker by one collective."""
    seed = int(np.random.default_rng().integers(2**31 - 1))
    if workers > 1:
        seed = int(workers_lib.gather(strategy, [seed])[0, 0])  # float64 holds it exactly
    return seed


def _say_seed(made: Any, seed: int | None, announce: bool) -> Any:
    """Says the agreed shuffle seed once a pipeline was made from it (never before an error)."""
    if announce:
        chief.say_once("shuffle-seed", f"shuffling with seed {seed}; pass seed={seed} to repeat it")
    return made


def _say_sharded_twice(data: tf.data.Dataset, workers: int) -> None:
    """Warns once when a dataset that already takes one shard is divided between workers again."""
    if batched.shards(data):
        chief.say_once(
            "sharded-twice",
            f"WARNING: this dataset already takes one shard of its input (dataset.shard), and "
            f"mk.distribute divides it between the {workers} workers again: each worker would "
            f"train on 1/{workers} of its own shard. If your pipeline shards per worker, hand "
            "mk.distribute a function of the input context that returns it "
            "(docs: inputs/#a-pipeline-that-already-shards-per-worker).",
            logging.WARNING,
        )
