"""`mk.distribute`: one call from data to a per-replica distributed dataset."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from mirrorkit import chief, registry
from mirrorkit import workers as workers_lib
from mirrorkit.pipeline import batch_sizes, batched, sources, tfds_source

_SHARD_POLICIES = {
    "example": tf.data.experimental.AutoShardPolicy.DATA,
    "file": tf.data.experimental.AutoShardPolicy.FILE,
    "off": tf.data.experimental.AutoShardPolicy.OFF,
}
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
    >>> streaming_buffer(50_000, 256)
    2048
    >>> streaming_buffer(500, 32)
    500
    """
    buffer = max(MIN_SHUFFLE_BUFFER, 8 * global_batch_size)
    return buffer if count is None else min(count, buffer)


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
        data: an unbatched ``tf.data.Dataset`` (an already batched one is
            unbatched and rebatched, and that is said); NumPy arrays or
            tensors as ``x``, a dict, or ``(x, y[, sample_weight])``; a
            function ``fn(input_context) -> tf.data.Dataset`` run once per
            worker (return unbatched elements, or batches of
            ``input_context.get_per_replica_batch_size(global_batch_size)``);
            or a tensorflow-datasets name or builder, with ``split=``, already
            prepared on disk.
        strategy: the strategy to distribute for; the current one when None.
        per_replica_batch_size: examples per replica per step.
        global_batch_size: examples per step over all replicas. Give exactly
            one of the two; the other is derived.
        shuffle: shuffle before batching, with a new order each epoch; on by
            default in training, off for ``for_eval``.
        seed: makes the shuffled orders repeatable. When None, a seed is
            drawn once and shared by all workers (said once).
        drop_remainder: ``"auto"`` drops a last partial global batch in
            training and keeps it for evaluation; True or False force it.
        shard: how workers divide the data: ``"auto"`` (by file when there
            are at least as many files as workers, else by example),
            ``"file"``, ``"example"``, or ``"off"`` (every worker sees every
            example; you shard yourself).
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

    Returns:
        TensorFlow's own distributed dataset, which ``fit``, ``evaluate`` and
        ``predict`` accept, with attributes ``global_batch_size``,
        ``per_replica_batch_size``, ``num_examples`` and ``steps_per_epoch``
        (None when unknown) and ``dropped_per_epoch``.

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

    strategy = mk.strategy(cpu_replicas=2)
    model = mk.build(lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]),
                     strategy)
    model.compile(optimizer="sgd", loss="mse")
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
    if strategy is None:
        strategy = registry.current_strategy()
    sizes = batch_sizes.resolve(
        strategy.num_replicas_in_sync, per_replica_batch_size, global_batch_size
    )
    options = _Options.check(
        shuffle, drop_remainder, shard, for_eval, cache, prefetch, preprocess, shuffle_buffer_size
    )
    workers = workers_lib.num_workers(strategy)
    announce = options.shuffle and seed is None  # said once the pipeline is made, not before
    if options.shuffle:
        seed = _agreed_seed(strategy, workers) if seed is None else int(seed)
    if tfds_source.is_tfds(data):
        tfds_split = tfds_source.open_split(data, split, data_dir, as_supervised)
        if _reads_own_files(tfds_split, options, workers):
            made = _per_worker_tfds(tfds_split, strategy, sizes, options, seed, workers)
            return _say_seed(made, seed, announce)
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
        source = sources.from_dataset(data, sizes.global_batch_size)
    elif sources.is_array_data(data):
        source = sources.from_arrays(data)
    elif callable(data):
        return _from_function(data, strategy, sizes, options)
    else:
        raise TypeError(
            f"mk.distribute cannot read {_what(data)}. Pass an unbatched "
            "tf.data.Dataset, NumPy arrays as x or (x, y[, sample_weight]), a dict of arrays, a "
            "function fn(input_context) -> tf.data.Dataset, or a tfds name or builder with "
            "split=. (A keras.utils.PyDataset goes to fit() directly.)" + _hint(data)
        )
    made = _global_pipeline(source, strategy, sizes, options, seed, workers)
    return _say_seed(made, seed, announce)


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


class _Options:
    """The pipeline options after defaults and checks."""

    def __init__(self, **kwargs: Any):
        self.__dict__.update(kwargs)

    @classmethod
    def check(
        cls, shuffle, drop_remainder, shard, for_eval, cache, prefetch, preprocess, buffer
    ) -> _Options:
        if shard not in ("auto", *_SHARD_POLICIES):
            raise ValueError(f"shard must be 'auto', 'file', 'example' or 'off'; got {shard!r}")
        if drop_remainder not in ("auto", True, False):
            raise ValueError(
                f"drop_remainder must be 'auto', True or False; got {drop_remainder!r}"
            )
        if for_eval and drop_remainder is True:
            raise ValueError(
                "for_eval=True uses every example once; drop_remainder=True would drop some. "
                "Leave drop_remainder='auto'."
            )
        if for_eval and shuffle:
            raise ValueError(
                "for_eval=True keeps input order (so predict rows match inputs); shuffle=True "
                "contradicts it. Leave shuffle unset."
            )
        if preprocess is not None and not callable(preprocess):
            raise TypeError(f"preprocess must be a function of one example; got {preprocess!r}")
        if buffer is not None and (not isinstance(buffer, int) or buffer < 1):
            raise ValueError(f"shuffle_buffer_size must be a positive integer; got {buffer!r}")
        return cls(
            shuffle=(not for_eval) if shuffle is None else bool(shuffle),
            drop=(not for_eval) if drop_remainder == "auto" else drop_remainder,
            shard=shard,
            for_eval=bool(for_eval),
            cache=bool(cache),
            prefetch=bool(prefetch),
            preprocess=preprocess,
            buffer=buffer,
        )


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


def _global_pipeline(
    source: sources.Source,
    strategy: tf.distribute.Strategy,
    sizes: batch_sizes.BatchSizes,
    options: _Options,
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
    if source.read is not None and options.preprocess is None and not options.cache:
        # In-memory arrays: shuffle and batch indices, then gather whole batches.
        if options.shuffle:
            dataset = dataset.shuffle(count, seed=seed, reshuffle_each_iteration=True)
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
    if options.prefetch:
        dataset = dataset.prefetch(tf.data.AUTOTUNE)
    shard = "example" if options.shard == "auto" else options.shard
    tf_options = tf.data.Options()
    tf_options.experimental_distribute.auto_shard_policy = _SHARD_POLICIES[shard]
    if workers > 1:
        chief.say_once(
            f"shard-{shard}",
            f"input split among {workers} workers by {shard}"
            + (" (every worker reads all of it)" if shard == "example" else ""),
        )
    distributed = strategy.experimental_distribute_dataset(dataset.with_options(tf_options))
    steps = None
    dropped = 0
    if count is not None:
        steps = count // size if options.drop else math.ceil(count / size)
        dropped = count - steps * size if options.drop else 0
    if options.drop:
        _say_dropped(dropped, count, size)
    return _describe(distributed, sizes, count, steps, dropped)


def _reads_own_files(split: tfds_source.TfdsSplit, options: _Options, workers: int) -> bool:
    if workers < 2 or options.for_eval or not options.drop:
        return False
    if options.shard == "file" and split.num_files < workers:
        raise ValueError(
            f"shard='file' needs at least one file per worker, but "
            f"{split.builder.name}[{split.split}] has {split.num_files} files for {workers} "
            "workers. Use shard='example' (every worker reads all and keeps its share)."
        )
    return options.shard in ("auto", "file") and split.num_files >= workers


def _per_worker_tfds(
    split: tfds_source.TfdsSplit,
    strategy: tf.distribute.Strategy,
    sizes: batch_sizes.BatchSizes,
    options: _Options,
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
    _say_dropped(dropped, split.num_examples, sizes.global_batch_size)

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
        dataset = dataset.take(steps * local_replicas)
        return dataset.prefetch(tf.data.AUTOTUNE) if options.prefetch else dataset

    distributed = strategy.distribute_datasets_from_function(worker_pipeline)
    return _describe(distributed, sizes, split.num_examples, steps, dropped)


def _from_function(
    fn: Callable[[tf.distribute.InputContext], tf.data.Dataset],
    strategy: tf.distribute.Strategy,
    sizes: batch_sizes.BatchSizes,
    options: _Options,
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
        return dataset.prefetch(tf.data.AUTOTUNE) if options.prefetch else dataset

    distributed = strategy.distribute_datasets_from_function(worker_pipeline)
    return _describe(distributed, sizes, None, None, 0)


def _say_dropped(dropped: int, count: int | None, global_batch_size: int) -> None:
    if count is None:
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


def _describe(
    distributed: tf.distribute.DistributedDataset,
    sizes: batch_sizes.BatchSizes,
    count: int | None,
    steps: int | None,
    dropped: int,
) -> tf.distribute.DistributedDataset:
    distributed.global_batch_size = sizes.global_batch_size
    distributed.per_replica_batch_size = sizes.per_replica_batch_size
    distributed.num_examples = count
    distributed.steps_per_epoch = steps
    distributed.dropped_per_epoch = dropped
    return distributed
