import json

import pytest

from mirrorkit.cluster import cluster_info


def tf_config(cluster_spec, task=None):
    config = {"cluster": cluster_spec}
    if task is not None:
        config["task"] = task
    return json.dumps(config)


TWO_WORKERS = {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}


def test_two_workers():
    info = cluster_info.parse_tf_config(tf_config(TWO_WORKERS, {"type": "worker", "index": 1}))
    assert (info.num_workers, info.task_index, info.worker_index) == (2, 1, 1)
    assert info.is_multi_worker and not info.is_chief


def test_worker_zero_is_chief_without_chief_task():
    info = cluster_info.parse_tf_config(tf_config(TWO_WORKERS, {"type": "worker", "index": 0}))
    assert info.is_chief


def test_named_chief_counts_as_a_worker():
    spec = {"chief": ["127.0.0.1:1111"], "worker": ["127.0.0.1:2222"]}
    chief = cluster_info.parse_tf_config(tf_config(spec, {"type": "chief", "index": 0}))
    worker = cluster_info.parse_tf_config(tf_config(spec, {"type": "worker", "index": 0}))
    assert chief.is_chief and chief.num_workers == 2 and chief.worker_index == 0
    assert not worker.is_chief and worker.worker_index == 1


def test_evaluator_is_not_a_training_worker():
    spec = {"worker": ["127.0.0.1:2222"], "evaluator": ["127.0.0.1:3333"]}
    info = cluster_info.parse_tf_config(tf_config(spec, {"type": "evaluator", "index": 0}))
    assert info.num_workers == 1
    assert info.worker_index is None and not info.is_training_worker
    assert not info.is_chief and not info.is_multi_worker


def test_evaluator_beside_two_training_tasks_is_not_multi_worker():
    spec = {
        "chief": ["127.0.0.1:1111"],
        "worker": ["127.0.0.1:2222"],
        "evaluator": ["127.0.0.1:3333"],
    }
    evaluator = cluster_info.parse_tf_config(tf_config(spec, {"type": "evaluator", "index": 0}))
    assert evaluator.num_workers == 2 and not evaluator.is_multi_worker
    worker = cluster_info.parse_tf_config(tf_config(spec, {"type": "worker", "index": 0}))
    assert worker.is_multi_worker and worker.worker_index == 1
    assert worker.addresses == ("127.0.0.1:1111", "127.0.0.1:2222")  # training tasks only


@pytest.mark.parametrize(
    "spec, task, rank",
    [
        ({"chief": ["a:1"], "worker": ["b:1", "c:1"]}, ("chief", 0), 0),
        ({"chief": ["a:1"], "worker": ["b:1", "c:1"]}, ("worker", 0), 1),
        ({"chief": ["a:1"], "worker": ["b:1", "c:1"]}, ("worker", 1), 2),
        ({"worker": ["b:1", "c:1"]}, ("worker", 1), 1),
        ({"worker": ["b:1"], "evaluator": ["e:1"]}, ("evaluator", 0), None),
    ],
)
def test_rank_is_numbered_as_tensorflow_numbers_tasks(spec, task, rank):
    from tensorflow.python.distribute import multi_worker_util

    info = cluster_info.from_cluster_spec(spec, *task)
    assert info.worker_index == rank
    if rank is not None:  # TensorFlow's own numbering of the collective's members
        assert multi_worker_util.id_in_cluster(spec, *task) == rank
        assert info.is_chief == multi_worker_util.is_chief(spec, *task)


@pytest.mark.parametrize(
    "text, field",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        (tf_config({}), "'cluster'"),
        (tf_config({"workers": ["a:1"]}, {"type": "workers", "index": 0}), "'cluster.workers'"),
        (tf_config({"worker": "127.0.0.1:1"}), "'cluster.worker'"),
        (tf_config({"worker": ["127.0.0.1"]}, {"type": "worker", "index": 0}), "cluster.worker[0]"),
        (tf_config({"worker": ["h:99999"]}, {"type": "worker", "index": 0}), "cluster.worker[0]"),
        (tf_config(TWO_WORKERS), "no field 'task'"),
        (tf_config(TWO_WORKERS, {"type": "chief", "index": 0}), "'task.type'"),
        (tf_config(TWO_WORKERS, {"type": "worker", "index": 2}), "'task.index' is 2"),
        (tf_config(TWO_WORKERS, {"type": "worker", "index": "1"}), "'task.index' must be"),
        (tf_config({"chief": ["a:1", "b:2"]}, {"type": "chief", "index": 0}), "'cluster.chief'"),
    ],
)
def test_malformed_tf_config_names_the_field(text, field):
    with pytest.raises(ValueError) as err:
        cluster_info.parse_tf_config(text)
    assert field in str(err.value)


#: What srun sets in task 2 of ``srun -N2 --ntasks-per-node=2`` (the variables mirrorkit reads).
SLURM_STEP = {
    "SLURM_JOB_ID": "7",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "node[1-2]",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURMD_NODENAME": "node2",
    "SLURM_NODEID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_PROCID": "2",
    "SLURM_NTASKS": "4",
}


def test_slurm_multi_task_step():
    info = cluster_info.from_environment(SLURM_STEP)
    assert (info.source, info.num_workers, info.task_index, info.is_chief) == ("slurm", 4, 2, False)


def test_slurm_single_task_is_no_cluster():
    env = {**SLURM_STEP, "SLURM_STEP_NUM_TASKS": "1", "SLURM_STEP_TASKS_PER_NODE": "1"}
    env.update(SLURM_STEP_NODELIST="node2", SLURM_NTASKS="1", SLURM_PROCID="0")
    assert cluster_info.from_environment(env).source == "none"


def test_tf_config_wins_over_slurm():
    env = {**SLURM_STEP, "TF_CONFIG": tf_config(TWO_WORKERS, {"type": "worker", "index": 0})}
    assert cluster_info.from_environment(env).source == "TF_CONFIG"


def test_bad_slurm_variable():
    with pytest.raises(ValueError, match="SLURM_STEP_TASKS_PER_NODE"):
        cluster_info.from_environment({**SLURM_STEP, "SLURM_STEP_TASKS_PER_NODE": "four"})


def test_no_cluster():
    info = cluster_info.from_environment({})
    assert (info.source, info.num_workers, info.is_chief) == ("none", 1, True)
