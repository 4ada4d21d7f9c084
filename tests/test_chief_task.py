"""Jobs whose TF_CONFIG names a ``chief`` task, and an ``evaluator`` beside the workers.

Kubeflow's TFJob, Vertex AI and TensorFlow's own guides lay a job out as one
``chief`` plus ``worker`` tasks, numbered chief first. Every TF_CONFIG here is
written by the test itself (not by ``mirrorkit launch``), and every process is
a real TensorFlow process talking through the collective runtime.
"""

import numpy as np
import pytest
from _multiworker import own_tf_configs, run_workers
from test_throughput import check_straggler_reports, fit_with_one_slow_worker

pytestmark = pytest.mark.multiprocess
TOLERANCE = 1e-5
NUM_IDS, GLOBAL_BATCH = 200, 20


def _task_of_a_job_with_a_chief():
    """What one task sees and does; a training task also shuffles ids and trains."""
    from _training import LEARNING_RATES, train_small_model

    import mirrorkit as mk
    from mirrorkit.cluster import cluster_info

    here = cluster_info.from_environment()
    strategy = mk.strategy()
    facts = {
        "task": here.task_type,
        "is_chief": mk.is_chief(),
        "strategy": type(strategy).__name__,
        "topology": mk.describe().to_dict(),
        "text": str(mk.describe()),
    }
    if not here.is_training_worker:
        try:
            mk.strategy("multi_worker")
        except ValueError as err:
            facts["multi_worker_error"] = str(err)
        return facts
    ids = np.arange(NUM_IDS, dtype="int64")
    shuffled = mk.distribute((ids, ids), strategy, global_batch_size=GLOBAL_BATCH)  # seed drawn
    facts["ids"] = [
        int(i)
        for batch in shuffled
        for local in strategy.experimental_local_results(batch[0])
        for i in local.numpy()
    ]
    facts["sgd"] = train_small_model(strategy, "sgd", LEARNING_RATES["sgd"])
    return facts


@pytest.fixture(scope="module")
def job_with_a_chief_and_an_evaluator():
    tasks = ["chief", "worker", "evaluator"]
    results = run_workers(_task_of_a_job_with_a_chief, n=3, env=own_tf_configs(tasks))
    return dict(zip(tasks, results, strict=True))


def test_chief_and_worker_train_like_one_process(
    job_with_a_chief_and_an_evaluator, one_device_runs
):
    # train_small_model(mk.strategy("one_device"), "sgd", LEARNING_RATES["sgd"]), fresh process
    want_weights, want_history = one_device_runs["sgd"]
    for task in ("chief", "worker"):
        weights, history = job_with_a_chief_and_an_evaluator[task]["sgd"]
        for i, (got, want) in enumerate(zip(weights, want_weights, strict=True)):
            np.testing.assert_allclose(got, want, rtol=0, atol=TOLERANCE, err_msg=f"{task} {i}")
        for key in want_history:
            np.testing.assert_allclose(history[key], want_history[key], rtol=0, atol=TOLERANCE)


def test_ranks_chief_first_and_only_the_chief_is_chief(job_with_a_chief_and_an_evaluator):
    chief = job_with_a_chief_and_an_evaluator["chief"]
    worker = job_with_a_chief_and_an_evaluator["worker"]
    assert chief["is_chief"] and not worker["is_chief"]
    assert chief["strategy"] == worker["strategy"] == "CollectiveAllReduceStrategy"
    for facts, rank in ((chief, 0), (worker, 1)):
        topology = facts["topology"]
        assert (topology["num_workers"], topology["worker_index"]) == (2, rank)
        assert topology["num_replicas"] == 2  # the evaluator adds no replica
        assert topology["is_chief"] == (rank == 0)


def test_the_drawn_shuffle_seed_is_shared(job_with_a_chief_and_an_evaluator):
    chief = job_with_a_chief_and_an_evaluator["chief"]["ids"]
    worker = job_with_a_chief_and_an_evaluator["worker"]["ids"]
    # One permutation split between the two: with different seeds the halves would overlap.
    assert len(chief) == len(worker) == NUM_IDS // 2
    assert sorted(chief + worker) == list(range(NUM_IDS))


def test_the_evaluator_is_no_training_worker(job_with_a_chief_and_an_evaluator):
    evaluator = job_with_a_chief_and_an_evaluator["evaluator"]
    assert evaluator["task"] == "evaluator" and not evaluator["is_chief"]
    assert evaluator["strategy"] != "CollectiveAllReduceStrategy"  # a strategy of its own
    topology = evaluator["topology"]
    assert topology["task_type"] == "evaluator" and topology["worker_index"] is None
    assert topology["num_workers"] == 1 and topology["num_replicas"] == 1
    assert "this is the evaluator task, not a training worker" in evaluator["text"]
    assert "'evaluator', which is not a training worker" in evaluator["multi_worker_error"]


def test_throughput_report_has_both_workers_and_flags_the_worker_task():
    reports = run_workers(fit_with_one_slow_worker, 1, n=2, env=own_tf_configs(["chief", "worker"]))
    check_straggler_reports(reports, slow_worker=1)  # the `worker` task is rank 1
