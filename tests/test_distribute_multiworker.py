"""`mk.distribute` on two real workers through TensorFlow's collective runtime.

Both scenarios run in the session's shared 2-worker job (`two_worker_job` in
tests/conftest.py), one after the other on one strategy.
"""

import numpy as np
import pytest

pytestmark = pytest.mark.multiprocess
NUM_EXAMPLES = 1000
GLOBAL_BATCH = 64


def _local_ids(strategy, distributed, key=None):
    seen = []
    for batch in distributed:
        ids = batch[key] if key else batch[0]
        for value in strategy.experimental_local_results(ids):
            seen += value.numpy().reshape(-1).tolist()
    return seen


def _arrays_on_workers(strategy):
    import mirrorkit as mk

    ids = np.arange(NUM_EXAMPLES, dtype="int64")
    train = mk.distribute((ids, ids), strategy, global_batch_size=GLOBAL_BATCH)  # seed drawn
    evaluation = mk.distribute((ids, ids), strategy, global_batch_size=GLOBAL_BATCH, for_eval=True)
    return _local_ids(strategy, train), _local_ids(strategy, evaluation), train.dropped_per_epoch


def _sharded_twice_on_workers(strategy):
    """What the chief says of a dataset that already shards, then of one that does not."""
    import logging

    import tensorflow as tf

    import mirrorkit as mk
    from mirrorkit import notices

    said = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    notices.LOGGER.addHandler(handler)
    try:
        examples = tf.data.Dataset.range(64)
        mk.distribute(examples, strategy, global_batch_size=8, shuffle=False)
        unsharded = [m for m in said if "already takes one shard" in m]
        mk.distribute(examples.shard(2, 0), strategy, global_batch_size=8, shuffle=False)
        mk.distribute(examples, strategy, global_batch_size=8, shuffle=False, shard="off")
    finally:
        notices.LOGGER.removeHandler(handler)
    off = [m for m in said if "shard='off'" in m or "by off" in m]
    return unsharded, [m for m in said if "already takes one shard" in m], off


def _own_input_on_workers(strategy):
    """shard='off': each worker its own 64 examples, global batch 16 (8 of its own a step)."""
    import tensorflow as tf

    import mirrorkit as mk
    from mirrorkit.cluster import workers

    rank = workers.position(strategy).worker_index
    own = tf.data.Dataset.range(64).map(lambda i: i + 1000 * rank)
    batched = own.batch(16)  # batched by the global batch: re-batched by its share
    found = {}
    for name, data in (("examples", own), ("batched", batched)):
        made = mk.distribute(data, strategy, global_batch_size=16, shuffle=False, shard="off")
        steps = _local_steps(strategy, made)  # each step: this worker's replicas' examples
        ids = [i for step in steps for i in step]
        found[name] = (rank, ids, [len(step) for step in steps], made.steps_per_epoch)
    return found


def _local_steps(strategy, distributed):
    return [
        [i for value in strategy.experimental_local_results(batch) for i in value.numpy().tolist()]
        for batch in distributed
    ]


def distribute_scenarios(strategy, data_dir):
    """In each worker of the shared job: the scenarios, on its strategy."""
    return {
        "arrays": _arrays_on_workers(strategy),
        "tfds": _tfds_on_workers(strategy, data_dir),
        "sharded_twice": _sharded_twice_on_workers(strategy),
        "own_input": _own_input_on_workers(strategy),
    }


@pytest.fixture(scope="module")
def job(two_worker_job):
    return [scenarios["distribute"] for scenarios in two_worker_job]


def test_two_workers_share_each_epoch_without_overlap(job):
    results = [scenarios["arrays"] for scenarios in job]
    (train0, eval0, dropped), (train1, eval1, _) = results
    assert train0 and train1 and not set(train0) & set(train1)  # the drawn seed is shared
    seen = train0 + train1
    assert len(seen) == len(set(seen))
    assert len(set(range(NUM_EXAMPLES)) - set(seen)) == dropped == NUM_EXAMPLES % GLOBAL_BATCH
    assert sorted(eval0 + eval1) == list(range(NUM_EXAMPLES))  # every example exactly once
    assert not set(eval0) & set(eval1)


def test_a_dataset_that_already_shards_is_said_once_to_be_sharded_again(job):
    (unsharded, sharded, off), (_, on_worker_1, _) = [s["sharded_twice"] for s in job]
    assert unsharded == [] and on_worker_1 == []  # the chief says it, once
    assert len(sharded) == 1 and "divides it between the 2 workers again" in sharded[0]
    assert "(docs: inputs/#a-pipeline-that-already-shards-per-worker)" in sharded[0]
    from _quoted import assert_quoted_in, quoted_block

    # as mirrorkit's notices handler writes them: "mirrorkit: " and the record's message
    said = "".join(f"mirrorkit: {message}\n" for message in sharded)
    assert_quoted_in(quoted_block("inputs.md", "`dataset.shard`, the chief says so:"), said)
    assert off == [
        "input not split among the 2 workers (shard='off'): each worker reads all of its own "
        "input, its share of each global batch a step; give every worker as many examples"
    ]


def _tfds_on_workers(strategy, data_dir):
    from _tfds_builder import TinyImages

    import mirrorkit as mk

    data = mk.distribute(
        TinyImages(data_dir=data_dir),
        strategy,
        global_batch_size=16,
        split="train",
        as_supervised=False,
        seed=0,
    )
    return _local_ids(strategy, data, "id"), data.steps_per_epoch, data.dropped_per_epoch


def test_tfds_files_are_read_by_exactly_one_worker(tfds_dir, job):
    from _tfds_builder import NUM_FILES, NUM_TRAIN, ids_per_file

    builder = tfds_dir[1]
    files = ids_per_file(builder, "train")
    assert len(files) == NUM_FILES
    (ids0, steps, dropped), (ids1, steps1, _) = (scenarios["tfds"] for scenarios in job)
    assert steps == steps1 and len(ids0) == len(ids1) == steps * 8
    assert len(set(ids0 + ids1)) == len(ids0 + ids1)  # no example twice
    assert NUM_TRAIN - len(ids0 + ids1) == dropped
    for file_ids in files:  # each file's examples went to one worker only
        readers = [w for w, ids in enumerate((ids0, ids1)) if file_ids & set(ids)]
        assert len(readers) == 1, readers


def test_shard_off_trains_each_worker_on_all_of_its_own_input(job):
    """Each worker's 64 examples, global batch 16 on 2 workers: 8 steps of 8 of its own.

    TensorFlow gives a worker whose input is not sharded its share of each global batch a
    step, so each worker reads its 64 examples in 8 steps; the epoch said 4, and fit's one
    iterator stopped there, half of each worker's input unread.
    """
    for scenarios in job:
        for name in ("examples", "batched"):
            rank, ids, steps, steps_per_epoch = scenarios["own_input"][name]
            assert ids == [i + 1000 * rank for i in range(64)], name  # all its own, in order
            assert steps == [8] * 8 and steps_per_epoch == 8, (name, steps, steps_per_epoch)
