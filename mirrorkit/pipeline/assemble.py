"""How `mk.distribute` assembles each kind of tf.data pipeline, and what it says about it.

Three shapes: one pipeline of global batches that TensorFlow splits among
workers and replicas (`global_pipeline`), tfds files read by each worker on
its own (`per_worker_tfds`), and the user's per-worker function
(`from_function`). Each returns TensorFlow's own distributed dataset with
the batch sizes and epoch length set on it (`describe`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import tensorflow as tf

from mirrorkit import distributed_data
from mirrorkit.cluster import chief
from mirrorkit.pipeline import (
    batch_sizes,
    batched,
    class_weights,
    epoch_order,
    sources,
    tfds_source,
)
from mirrorkit.pipeline.options import SHARD_POLICIES, Options

#: Fewest examples in the shuffle buffer of a streamed (not in-memory) source.
MIN_SHUFFLE_BUFFER = 1024


def streaming_buffer(count: int | None, global_batch_size: int) -> int:
    """Shuffle buffer of a streamed source: 8 global batches, at least 1,024, at most all.

    In-memory arrays are shuffled whole (their indices move, not the data).
    A stream (tfds files, a dataset) refills its buffer at every epoch start
    before the first batch, so a buffer of the whole set would stall each
    epoch for a full pass of decoding; tfds sources also shuffle their file
    order every epoch.

    Example:
    ```python
    from mirrorkit.pipeline.assemble import streaming_buffer

    assert streaming_buffer(50_000, 256) == 2048  # 8 global batches
    assert streaming_buffer(500, 32) == 500  # never more than the whole set
    ```
    """
    buffer = max(MIN_SHUFFLE_BUFFER, 8 * global_batch_size)
    return buffer if count is None else min(count, buffer)


def global_pipeline(
    source: sources.Source,
    strategy: tf.distribute.Strategy,
    sizes: batch_sizes.BatchSizes,
    options: Options,
    seed: int | None,
    workers: int,
) -> tf.distribute.DistributedDataset:
    """One pipeline of global batches; TensorFlow gives each worker and replica its part."""
    count = source.num_examples
    size = sizes.global_batch_size
    if not options.for_eval and count is not None and count < size:
        raise ValueError(
            f"The training data has {count} examples, fewer than one global batch of {size} "
            f"({sizes.per_replica_batch_size} per replica x {sizes.num_replicas} replicas), so "
            "an epoch would have no step. Use a smaller batch size or more data, or pass "
            "for_eval=True for evaluation data."
        )
    dataset = source.dataset
    order = None
    if source.read is not None and options.preprocess is None and not options.cache:
        # In-memory arrays: shuffle and batch indices, then gather whole batches. The order
        # of an epoch is drawn from (seed, epoch), so a resumed run replays it.
        if options.shuffle:
            order = options.order or epoch_order.EpochOrder(count, seed)
        if order is not None and options.repeat:  # fit's one iterator: each epoch batched alone
            dataset = order.epochs().flat_map(
                lambda epoch: order.indices_of(epoch).batch(size, drop_remainder=options.drop)
            )
        else:
            dataset = order.indices() if order is not None else dataset
            dataset = dataset.batch(size, drop_remainder=options.drop)
        dataset = dataset.map(source.read, num_parallel_calls=tf.data.AUTOTUNE)
    else:
        if source.read is not None:
            dataset = dataset.map(source.read, num_parallel_calls=tf.data.AUTOTUNE)
        if options.cache:
            dataset = dataset.cache()
        if options.shuffle:
            buffer = options.buffer or streaming_buffer(count, size)
            dataset = dataset.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)
        if options.preprocess is not None:
            dataset = dataset.map(options.preprocess, num_parallel_calls=tf.data.AUTOTUNE)
        dataset = dataset.batch(size, drop_remainder=options.drop)
    distributed = _distribute_global_batches(dataset, strategy, options, workers)
    steps = None
    dropped = 0
    if count is not None:
        steps = count // size if options.drop else math.ceil(count / size)
        dropped = count - steps * size if options.drop else 0
    if options.drop:
        say_dropped(dropped, count, size)
    elif count is not None and not options.for_eval:
        say_uneven_last_batch(count - (steps - 1) * size, sizes.num_replicas)
    if steps is None and not _repeats_forever(dataset):
        say_unknown_length()
    stream = options.shuffle and order is None
    steps = _steps_on_a_worker(steps, options, workers)
    return describe(distributed, sizes, count, steps, dropped, order=order, stream=stream)


def kept_batches(
    dataset: tf.data.Dataset,
    found: batched.Batching,
    strategy: tf.distribute.Strategy,
    sizes: batch_sizes.BatchSizes,
    options: Options,
    workers: int,
) -> tf.distribute.DistributedDataset:
    """An already-batched pipeline whose batch is the global batch: its batches, as they are.

    Its order, its own shuffle and its last partial batch stay what one device
    would see, and so does its length (Keras shows "n/N" and takes N steps).
    In training, a last partial batch that the replicas cannot share evenly is
    dropped by default: Keras averages the replicas' mean losses, so unequal
    shares would weigh examples unequally on that step (``drop_remainder=False``
    keeps it; ``True`` drops any partial last batch).
    """
    steps = int(dataset.cardinality())
    steps = steps if steps >= 0 else None
    count = found.num_examples
    last = found.last_batch_size
    size = sizes.global_batch_size
    dropped = 0
    partial = last is not None and last < size
    uneven = last is not None and last % sizes.num_replicas != 0
    if not options.for_eval and steps is not None and partial:
        if options.drop is True and (not options.drop_auto or uneven):
            dataset = _whole_batches(dataset, size, steps - 1)
            steps, dropped = steps - 1, last
            say_dropped(dropped, count, size, uneven_over=sizes.num_replicas if uneven else None)
        elif uneven:
            say_uneven_last_batch(last, sizes.num_replicas)
    chief.say_once(
        f"kept-batches-{size}",
        f"data is already batched with batch size {size}, the global batch: mk.distribute keeps "
        f"its batches, its order and its own shuffle as they are ({sizes.per_replica_batch_size} "
        "examples of each batch per replica)"
        + ("" if dropped or not partial else f", its last batch of {last} included"),
    )
    if options.cache:
        dataset = dataset.cache()
    if steps is None and not _repeats_forever(dataset):
        say_unknown_length()
    distributed = _distribute_global_batches(dataset, strategy, options, workers)
    return describe(distributed, sizes, count, _steps_on_a_worker(steps, options, workers), dropped)


def _steps_on_a_worker(steps: int | None, options: Options, workers: int) -> int | None:
    """The steps of an epoch on each worker, from the global batches of its input.

    A worker whose input is not sharded (``shard="off"``) reads all of it, its share of
    each global batch a step (TensorFlow's split): each global batch is `workers` steps.
    """
    if steps is None or workers < 2 or options.shard != "off":
        return steps
    return steps * workers


def _whole_batches(dataset: tf.data.Dataset, size: int, steps: int) -> tf.data.Dataset:
    """Keeps the batches of `size` examples: a shuffle of batches may have moved the partial one."""

    def whole(*element):
        first = tf.nest.flatten(element[0] if len(element) == 1 else element)[0]
        rows = first.nrows() if isinstance(first, tf.RaggedTensor) else tf.shape(first)[0]
        return tf.equal(tf.cast(rows, tf.int64), size)

    kept = dataset.filter(whole)
    return kept.apply(tf.data.experimental.assert_cardinality(steps))


def _distribute_global_batches(
    dataset: tf.data.Dataset, strategy: tf.distribute.Strategy, options: Options, workers: int
) -> tf.distribute.DistributedDataset:
    """Weights, prefetches and shards a pipeline of global batches; TensorFlow splits each."""
    dataset = repeat_if_asked(weigh_classes(dataset, options), options)
    if options.prefetch:
        dataset = dataset.prefetch(tf.data.AUTOTUNE)
    shard = "example" if options.shard == "auto" else options.shard
    tf_options = tf.data.Options()
    tf_options.experimental_distribute.auto_shard_policy = SHARD_POLICIES[shard]
    if workers > 1 and shard == "off":
        chief.say_once(
            "shard-off",
            f"input not split among the {workers} workers (shard='off'): each worker reads all "
            "of its own input, its share of each global batch a step; give every worker as many "
            "examples",
        )
    elif workers > 1:
        chief.say_once(
            f"shard-{shard}",
            f"input split among {workers} workers by {shard}"
            + (" (every worker reads all of it)" if shard == "example" else ""),
        )
    return strategy.experimental_distribute_dataset(dataset.with_options(tf_options))


def reads_own_files(split: tfds_source.TfdsSplit, options: Options, workers: int) -> bool:
    """Whether each worker reads its own files of a tfds split (training, files to go round)."""
    if workers < 2 or options.for_eval or not options.drop:
        return False
    if options.shard == "file" and split.num_files < workers:
        raise ValueError(
            f"shard='file' needs at least one file per worker, but "
            f"{split.builder.name}[{split.split}] has {split.num_files} files for {workers} "
            "workers. Use shard='example' (every worker reads all and keeps its share)."
        )
    return options.shard in ("auto", "file") and split.num_files >= workers


def per_worker_tfds(
    split: tfds_source.TfdsSplit,
    strategy: tf.distribute.Strategy,
    sizes: batch_sizes.BatchSizes,
    options: Options,
    seed: int | None,
    workers: int,
) -> tf.distribute.DistributedDataset:
    """Each worker reads its own files; every worker runs the same number of steps."""
    local_replicas = sizes.num_replicas // workers
    per_worker_batch = sizes.per_replica_batch_size * local_replicas
    counts = split.examples_per_pipeline(workers)
    steps = min(count // per_worker_batch for count in counts)
    if steps == 0:
        raise ValueError(
            f"{split.builder.name}[{split.split}] gives the workers {counts} examples, and one "
            f"worker has fewer than its share of one global batch ({per_worker_batch}); an "
            "epoch would have no step. Use a smaller batch size."
        )
    dropped = split.num_examples - steps * sizes.global_batch_size
    chief.say_once(
        "shard-file",
        f"each of {workers} workers reads its own files of {split.builder.name}[{split.split}] "
        f"({split.num_files} files; {counts} examples); every worker runs {steps} steps an epoch",
    )
    say_dropped(dropped, split.num_examples, sizes.global_batch_size)

    def worker_pipeline(context: tf.distribute.InputContext) -> tf.data.Dataset:
        dataset = split.read(context, shuffle_files=options.shuffle, seed=seed)
        if options.cache:
            dataset = dataset.cache()
        if options.shuffle:
            buffer = options.buffer or streaming_buffer(
                counts[context.input_pipeline_id], sizes.global_batch_size
            )
            worker_seed = None if seed is None else seed + context.input_pipeline_id
            dataset = dataset.shuffle(buffer, seed=worker_seed, reshuffle_each_iteration=True)
        if options.preprocess is not None:
            dataset = dataset.map(options.preprocess, num_parallel_calls=tf.data.AUTOTUNE)
        dataset = dataset.batch(sizes.per_replica_batch_size, drop_remainder=True)
        dataset = weigh_classes(dataset.take(steps * local_replicas), options)
        dataset = repeat_if_asked(dataset, options)
        return dataset.prefetch(tf.data.AUTOTUNE) if options.prefetch else dataset

    distributed = strategy.distribute_datasets_from_function(worker_pipeline)
    return describe(distributed, sizes, split.num_examples, steps, dropped, stream=options.shuffle)


def from_function(
    fn: Callable[[tf.distribute.InputContext], tf.data.Dataset],
    strategy: tf.distribute.Strategy,
    sizes: batch_sizes.BatchSizes,
    options: Options,
) -> tf.distribute.DistributedDataset:
    """Runs the user's per-worker pipeline function, batching or checking its batches."""

    def worker_pipeline(context: tf.distribute.InputContext) -> tf.data.Dataset:
        dataset = fn(context)
        if not isinstance(dataset, tf.data.Dataset):
            raise TypeError(
                f"The input function {getattr(fn, '__name__', fn)!r} returned "
                f"{type(dataset).__name__}; it must return a tf.data.Dataset."
            )
        per_replica = context.get_per_replica_batch_size(sizes.global_batch_size)
        found = batched.find(dataset)
        if found is None:
            dataset = dataset.batch(per_replica, drop_remainder=options.drop)
        elif found.batch_size is not None and found.batch_size != per_replica:
            raise ValueError(
                f"The input function {getattr(fn, '__name__', fn)!r} returned batches of "
                f"{found.batch_size} examples, but each replica takes {per_replica} (global "
                f"batch {sizes.global_batch_size} over {sizes.num_replicas} replicas). Batch "
                "with input_context.get_per_replica_batch_size(global_batch_size), or return "
                "unbatched examples and let mk.distribute batch them."
            )
        dataset = repeat_if_asked(weigh_classes(dataset, options), options)
        return dataset.prefetch(tf.data.AUTOTUNE) if options.prefetch else dataset

    distributed = strategy.distribute_datasets_from_function(worker_pipeline)
    return describe(distributed, sizes, None, None, 0)


def repeat_if_asked(dataset: tf.data.Dataset, options: Options) -> tf.data.Dataset:
    """The epoch's batches, repeated endlessly for ``fit``'s one iterator (`options.repeat`).

    Batched before it repeats, so no batch spans two epochs: each repetition is one
    epoch as the pipeline makes it (the same dropped remainder). A pipeline already
    endless (an in-memory shuffle's epochs, `EpochOrder.epochs`) is left as it is.
    """
    if not options.repeat or dataset.cardinality() == tf.data.INFINITE_CARDINALITY:
        return dataset
    return dataset.repeat()


def weigh_classes(dataset: tf.data.Dataset, options: Options) -> tf.data.Dataset:
    """Adds each example's class weight as its sample weight, as Keras's fit does."""
    if options.class_weight is None:
        return dataset
    return dataset.map(class_weights.weighting(options.class_weight))


def say_dropped(
    dropped: int, count: int | None, global_batch_size: int, uneven_over: int | None = None
) -> None:
    """Says once, on the chief, how many examples an epoch drops to keep whole batches.

    Args:
        dropped: examples dropped each epoch.
        count: examples in the data, when known.
        global_batch_size: examples per step.
        uneven_over: the replica count, when the last batch was dropped because
            the replicas cannot share it evenly (an already-batched input).
    """
    if uneven_over is not None:
        chief.say_once(
            f"dropped-uneven-{dropped}-{count}",
            f"each epoch uses {count - dropped} of {count} examples: the last batch of "
            f"{dropped} does not split evenly over {uneven_over} replicas, where Keras would "
            "weigh its examples unequally (not as one device does), so it is dropped; "
            "drop_remainder=False keeps it (that one step then differs slightly from one device)",
        )
    elif count is None:
        chief.say_once(
            "dropped-unknown",
            f"drop_remainder: a last partial global batch (under {global_batch_size} examples), "
            "if any, is dropped each epoch; drop_remainder=False keeps it",
        )
    elif dropped:
        chief.say_once(
            f"dropped-{dropped}-{count}",
            f"each epoch uses {count - dropped} of {count} examples: the last {dropped} do not "
            f"fill a global batch of {global_batch_size} and are dropped (a different {dropped} "
            "each epoch when shuffled); drop_remainder=False keeps them in a smaller last batch",
        )


def describe(
    distributed: tf.distribute.DistributedDataset,
    sizes: batch_sizes.BatchSizes,
    count: int | None,
    steps: int | None,
    dropped: int,
    order: epoch_order.EpochOrder | None = None,
    stream: bool = False,
) -> tf.distribute.DistributedDataset:
    """Gives TensorFlow's distributed dataset its record (`distributed_data`); returns it."""
    mark = epoch_order.new_stream() if stream else None
    made = distributed_data.DistributedRecord(  # its fields in order
        sizes.global_batch_size, sizes.per_replica_batch_size, count, steps, dropped, order, mark
    )
    return distributed_data.set_record(distributed, made)


def say_uneven_last_batch(last: int, num_replicas: int) -> None:
    """Says once that a kept last batch splits unevenly, so its step differs from one device."""
    if last % num_replicas:
        chief.say_once(
            f"uneven-last-{last}-{num_replicas}",
            f"the last batch of each epoch ({last} examples) does not split evenly over "
            f"{num_replicas} replicas; Keras averages the replicas' mean losses, so that one step "
            "weighs its examples unequally and differs slightly from one device (leave "
            "drop_remainder='auto' or pass True to drop it)",
        )


def _repeats_forever(dataset: tf.data.Dataset) -> bool:
    """Whether `dataset` repeats without end (its length is known: fit needs steps_per_epoch)."""
    return int(dataset.cardinality()) == tf.data.INFINITE_CARDINALITY


def say_unknown_length() -> None:
    """Says once that the input's length is unknown, what Keras does then, and the fix."""
    chief.say_once(
        "unknown-length",
        "the number of batches in data is unknown (a filter, a generator, flat_map, ...): Keras "
        "shows no total, runs each epoch until the data ends, and can count a step more than "
        "there were (optimizer.iterations runs ahead). If you know the length, apply "
        "tf.data.experimental.assert_cardinality(n) to the dataset before mk.distribute; or "
        ".repeat() it and pass steps_per_epoch= to fit",
    )


def say_cached_shuffle() -> None:
    """Says once that a training input caches after its shuffle, and what that does."""
    chief.say_once(
        "cached-shuffle",
        "data is .cache()d after it is shuffled (e.g. text_dataset_from_directory(...)...cache()): "
        "once that cache is complete, every epoch replays the first epoch's order. Whether it "
        "completes depends on how far an iterator reads past the last batch: under Keras on one "
        "device it may be dropped unfinished each epoch (a new order each epoch), while N "
        "replicas read to its end (the first order again), so epochs after the first can differ "
        "from one device. For a new order every epoch everywhere, cache before shuffling "
        "(shuffle=False in the utility, then .cache().shuffle(n))",
    )
