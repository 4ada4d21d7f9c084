"""The shuffled order of in-memory arrays as a function of (seed, epoch), so a resume replays it.

`mk.distribute` shuffles in-memory arrays by their indices. With TensorFlow's
``Dataset.shuffle(reshuffle_each_iteration=True)`` each order is drawn when an
iterator is made, so it depends on how many iterators Keras made before (one
at the start of ``fit`` and two an epoch in Keras 3.15), and a resumed run saw
the first orders again. Here the order of an epoch is
``stateless_shuffle(range(count), seed=[seed, epoch])``: the same on every
worker and replica (they share the seed), a fresh random order each epoch.

The epoch is a small host variable read when an iterator gives its first
element (not when Keras makes the iterator; it makes some it never reads),
which then counts on by one, so iterating the dataset by hand still gives a
new order each time. Every ``fit`` sets it to the epoch Keras begins
(`mirrorkit.feeding.fit_epoch`, a hook on ``CallbackList.on_epoch_begin``,
put in place by the first shuffled input), so epoch ``e`` always reads the
order ``e``: in an uninterrupted run, after Keras's own ``BackupAndRestore``
restored a backup, after ``fit(initial_epoch=e)``, `mk.resumable` and
`mk.PreemptionCheckpoint` alike. ``fit``'s one iterator over a repeating twin
(`mirrorkit.pipeline.repeating`) reads the epoch once, at its first element
(`epochs`), and counts the next epochs itself, whatever other iterators read.
`mk.PreemptionCheckpoint` also carries the seed, so a drawn seed
(``seed=None``) is replayed on resume; any other resume of a drawn seed is
said once (`resumed`).

Streamed sources (a tf.data pipeline, tfds files, or arrays with ``cache=`` or
``preprocess=``) keep TensorFlow's buffer shuffle, whose orders are not
replayed on resume; `say_if_not_replayed` says so once.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import tensorflow as tf

from mirrorkit import distributed_data
from mirrorkit.cluster import chief
from mirrorkit.feeding import fit_epoch

#: Every live in-memory shuffled order, and every live shuffled stream (a marker object).
_ORDERS: weakref.WeakSet = weakref.WeakSet()
_STREAMS: weakref.WeakSet = weakref.WeakSet()


class EpochOrder:
    """The shuffled indices of an in-memory epoch, drawn from (seed, epoch).

    Args:
        count: how many examples (indices ``0 .. count - 1``).
        seed: the shuffle seed every worker shares.
        seed_drawn: whether mirrorkit drew the seed (``seed=None``).

    Example:
    ```python
    from mirrorkit.pipeline.epoch_order import EpochOrder

    order = EpochOrder(10, seed=3)
    first = list(order.indices().as_numpy_iterator())  # epoch 0
    order.begin(0)
    assert list(order.indices().as_numpy_iterator()) == first  # epoch 0 again: the same
    assert list(order.indices().as_numpy_iterator()) != first  # epoch 1: another
    ```
    """

    def __init__(self, count: int, seed: int, seed_drawn: bool = False):
        self.seed, self.epoch = _host_variables(int(seed), 0)
        self.count = int(count)
        self.seed_drawn = bool(seed_drawn)
        self.used = False  # set when a fit first begins an epoch with it
        _ORDERS.add(self)
        fit_epoch.listen(_fit_begins_epoch)

    def begin(self, epoch: int) -> None:
        """The next iterator to give an element reads epoch `epoch`'s order."""
        self.epoch.assign(int(epoch))

    def indices(self) -> tf.data.Dataset:
        """The indices of one epoch, in the order of the epoch read at the first element."""

        def take_epoch(_):
            return self.epoch.assign_add(1, read_value=True) - 1

        dataset = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).map(take_epoch)
        dataset = dataset.flat_map(self.indices_of)
        return dataset.apply(tf.data.experimental.assert_cardinality(self.count))

    def indices_of(self, epoch: tf.Tensor) -> tf.data.Dataset:
        """The indices of epoch `epoch` (a scalar int64 tensor), in that epoch's order."""
        seed = tf.stack([self.seed.read_value(), epoch])
        shuffled = tf.random.experimental.stateless_shuffle(
            tf.range(self.count, dtype=tf.int64), seed=seed
        )
        return tf.data.Dataset.from_tensor_slices(shuffled)

    def epochs(self) -> tf.data.Dataset:
        """Endless epoch numbers, for ``fit``'s one iterator.

        The epoch read when an iterator gives its first element, then the next
        ones, counted by that iterator alone.
        """

        def start(_):
            return self.epoch.read_value()

        first = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).map(start)
        return first.flat_map(lambda epoch: tf.data.Dataset.range(epoch, tf.int64.max))


def _host_variables(*values: int) -> list[tf.Variable]:
    """Plain int64 variables on the host CPU, never a strategy's (even inside its scope).

    A strategy's scope is thread-local: a variable made in a scope would be a
    MirroredVariable with a copy on each replica's device (a GPU), which the
    tf.data host code could not read; a short thread outside it makes plain ones.
    """

    def make():
        try:
            with tf.init_scope(), tf.device("/cpu:0"):
                made.extend(tf.Variable(v, dtype=tf.int64, trainable=False) for v in values)
        except Exception as error:  # raised again in the caller's thread
            failed.append(error)

    made: list[tf.Variable] = []
    failed: list[Exception] = []
    if not tf.distribute.has_strategy():
        make()
    else:
        thread = threading.Thread(target=make, name="mirrorkit-epoch-order")
        thread.start()
        thread.join()
    if failed:
        raise failed[0]
    return made


class Stream:
    """Marks a shuffled streamed dataset (its orders are not replayed on resume)."""


def new_stream() -> Stream:
    """The mark of a new shuffled stream, for its dataset's record (`say_if_not_replayed`)."""
    marker = Stream()
    _STREAMS.add(marker)
    fit_epoch.listen(_fit_begins_epoch)
    return marker


def orders(data: Any = None) -> list[EpochOrder]:
    """`data`'s epoch order (a list of one, or none), or every live one when `data` is None."""
    if data is not None:
        found = distributed_data.record(data)
        return [found.epoch_order] if found is not None and found.epoch_order is not None else []
    return list(_ORDERS)


def say_if_not_replayed(data: Any = None) -> None:
    """On a resume: says once if a shuffled input will not see its uninterrupted orders."""
    if data is None:
        streamed = bool(list(_STREAMS))
    else:
        found = distributed_data.record(data)
        streamed = found is not None and found.shuffle_stream is not None
    if streamed:
        chief.say_once(
            "resume-shuffled-stream",
            "resuming a shuffled streamed input (a tf.data pipeline, tfds files, or arrays with "
            "cache= or preprocess=): its buffer shuffle draws new orders, so the resumed epochs "
            "see other orders than an uninterrupted run (in-memory arrays replay theirs; "
            "shuffle=False keeps any input's order)",
        )


def _fit_begins_epoch(callbacks: Any, epoch: int, first: bool) -> None:
    """Every live order takes Keras's `epoch`; a resumed fit says what differs (`resumed`)."""
    live = orders()
    for order in live:
        order.begin(epoch)
    if first and epoch > 0:
        resumed([order for order in live if not order.used])
    for order in live:
        order.used = True


def resumed(fresh: list[EpochOrder] | None = None) -> None:
    """A ``fit`` that begins past epoch 0: says once each reason its orders differ.

    Args:
        fresh: the orders this process had not trained on before (their
            seed, if drawn, is this run's, not the interrupted run's).
    """
    say_if_not_replayed()
    if any(order.seed_drawn for order in fresh or []):
        chief.say_once(
            "resume-drawn-seed",
            "resuming a shuffled input whose seed was drawn (seed=None): this run drew "
            "another, so the resumed epochs see other orders than an uninterrupted run; "
            "pass seed= to mk.distribute to replay them",
        )
