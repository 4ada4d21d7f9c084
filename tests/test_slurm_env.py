"""Slurm's variables read by mirrorkit: hostlists, tasks per node, the step's cluster, GPUs, ports.

Pure functions of an environment, fast. The environments are what Slurm 22.05
set in real tasks (``srun -N2 --ntasks-per-node=1`` and an ``sbatch -N2
--ntasks-per-node=2`` batch script, captured on the two-node cluster of
tests/test_slurm.py); tests/test_slurm.py runs the real thing.
"""

from __future__ import annotations

import io
import sys

import pytest

from mirrorkit.cluster import cluster_info, slurm
from mirrorkit.launcher import hosts, processes

#: Task 1 of ``srun -N2 --ntasks-per-node=1`` in job 1 (Slurm 22.05, the variables that matter).
SRUN_TASK_1 = {
    "SLURMD_NODENAME": "mk-node1",
    "SLURM_JOB_ID": "1",
    "SLURM_JOB_NODELIST": "mk-node[0-1]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_LOCALID": "0",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "2",
    "SLURM_PROCID": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "mk-node[0-1]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    "SLURM_TASKS_PER_NODE": "1(x2)",
}
#: The batch script of ``sbatch -N2 --ntasks-per-node=2`` (job 2): no step variables.
BATCH_SCRIPT = {
    "SLURMD_NODENAME": "mk-node0",
    "SLURM_JOB_ID": "2",
    "SLURM_JOB_NODELIST": "mk-node[0-1]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_LOCALID": "0",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "0",
    "SLURM_NTASKS": "4",
    "SLURM_PROCID": "0",
    "SLURM_TASKS_PER_NODE": "2(x2)",
}


@pytest.mark.parametrize(
    "text, expanded",
    [
        ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
        ("mk-node[0-1]", ["mk-node0", "mk-node1"]),
        ("a,b.example.org", ["a", "b.example.org"]),
        ("node[8-10]", ["node8", "node9", "node10"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("gpu[3]-ib", ["gpu3-ib"]),
        ("x[1-2],y[5,7]", ["x1", "x2", "y5", "y7"]),
    ],
)
def test_hostlists_expand_as_slurm_writes_them(text, expanded):
    assert slurm.expand_hostlist(text) == expanded


@pytest.mark.parametrize("text", ["node[1-", "node[a-b]", "node[3-1]", "node]1[", "a,,b"])
def test_a_malformed_hostlist_is_an_error_naming_it(text):
    with pytest.raises(ValueError, match="Slurm hostlist"):
        slurm.expand_hostlist(text)


@pytest.mark.parametrize(
    "text, counts",
    [("2(x3),1", [2, 2, 2, 1]), ("4", [4]), ("1(x2)", [1, 1]), ("3,1(x2),2", [3, 1, 1, 2])],
)
def test_tasks_per_node_expand(text, counts):
    assert slurm.expand_tasks_per_node(text) == counts


def test_malformed_tasks_per_node_is_an_error():
    with pytest.raises(ValueError, match=r"'2x3' is not N or N\(xM\)"):
        slurm.expand_tasks_per_node("2x3")


def test_a_real_srun_task_is_worker_1_of_2_with_both_addresses():
    info = cluster_info.from_environment(SRUN_TASK_1)
    port = slurm.BASE_PORT + slurm.PORT_STRIDE * 1  # job 1
    assert (info.source, info.num_workers, info.worker_index, info.is_chief) == (
        "slurm",
        2,
        1,
        False,
    )
    assert info.addresses == (f"mk-node0:{port}", f"mk-node1:{port}")


def test_an_uneven_step_ranks_node_by_node_with_a_port_per_local_task():
    env = {
        "SLURM_JOB_ID": "96",  # 96 mod 48 = 0: the base port
        "SLURM_STEP_ID": "3",
        "SLURM_STEP_NODELIST": "gpu[1-2],cpu7",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2),1",
        "SLURM_STEP_NUM_TASKS": "5",
        "SLURMD_NODENAME": "gpu2",
        "SLURM_LOCALID": "1",
    }
    info = cluster_info.from_environment(env)
    assert info.addresses == (
        "gpu1:29470",
        "gpu1:29471",
        "gpu2:29470",
        "gpu2:29471",
        "cpu7:29470",
    )
    assert (info.num_workers, info.worker_index) == (5, 3)
    chief = cluster_info.from_environment({**env, "SLURMD_NODENAME": "gpu1", "SLURM_LOCALID": "0"})
    assert (chief.worker_index, chief.is_chief) == (0, True)


def test_the_node_comes_from_slurm_nodeid_without_slurmd_nodename():
    env = {k: v for k, v in SRUN_TASK_1.items() if k != "SLURMD_NODENAME"}
    assert cluster_info.from_environment(env).worker_index == 1


def test_mirrorkit_port_sets_the_first_port_on_every_node():
    info = cluster_info.from_environment({**SRUN_TASK_1, "MIRRORKIT_PORT": "41000"})
    assert info.addresses == ("mk-node0:41000", "mk-node1:41000")
    with pytest.raises(ValueError, match="MIRRORKIT_PORT=80 must be a TCP port"):
        cluster_info.from_environment({**SRUN_TASK_1, "MIRRORKIT_PORT": "80"})


def test_default_ports_stay_below_linux_ephemeral_ports():
    last = slurm.BASE_PORT + slurm.PORT_STRIDE * (slurm.PORT_BLOCKS - 1) + slurm.PORT_STRIDE - 1
    assert last < 32768
    assert slurm.first_port({"SLURM_JOB_ID": "47"}) == slurm.BASE_PORT + 47 * slurm.PORT_STRIDE
    assert slurm.first_port({"SLURM_JOB_ID": "48"}) == slurm.BASE_PORT


@pytest.mark.parametrize(
    "change, named",
    [
        ({"SLURM_STEP_TASKS_PER_NODE": "1(x3)"}, "gives 3 node(s) but SLURM_STEP_NODELIST"),
        ({"SLURM_STEP_NUM_TASKS": "3"}, "SLURM_STEP_NUM_TASKS=3 but"),
        ({"SLURM_LOCALID": "1"}, "SLURM_LOCALID=1, but the step runs 1 task"),
        ({"SLURM_STEP_NODELIST": ""}, "SLURM_STEP_NODELIST is not set"),
        ({"SLURM_LOCALID": "x"}, "SLURM_LOCALID must be an integer"),
    ],
)
def test_inconsistent_step_variables_are_errors_naming_them(change, named):
    with pytest.raises(ValueError, match="SLURM") as err:
        cluster_info.from_environment({**SRUN_TASK_1, **change})
    assert named in str(err.value)


def test_a_batch_script_is_no_cluster_and_is_told_to_use_srun():
    assert cluster_info.from_environment(BATCH_SCRIPT).source == "none"
    note = slurm.outside_step_note(BATCH_SCRIPT)
    assert note.startswith("Slurm job 2 has 4 task(s) on 2 node(s), but this process is not")
    assert "it trains alone here" in note and "`srun python SCRIPT`" in note
    one = {"SLURM_JOB_ID": "3", "SLURM_NTASKS": "1", "SLURM_JOB_NUM_NODES": "1"}
    assert slurm.outside_step_note(one) is None
    assert slurm.outside_step_note(SRUN_TASK_1) is None
    assert slurm.outside_step_note({}) is None


def _step(tasks_here: int, local: int) -> slurm.Step:
    return slurm.Step(("a", "b"), (tasks_here, tasks_here), 0, local, slurm.BASE_PORT)


@pytest.mark.parametrize(
    "tasks_here, local, env, visible, share",
    [
        (1, 0, {}, 4, range(4)),  # one task per node: all its GPUs
        (4, 2, {}, 4, range(2, 3)),  # --gpus-per-node=4, 4 tasks: GPU 2 for local task 2
        (2, 1, {}, 8, range(4, 8)),
        (4, 3, {"SLURM_GPUS_PER_TASK": "1"}, 1, range(1)),  # Slurm bound it: its own GPU
        (2, 1, {"SLURM_GPU_BIND": "map_gpu:0,1"}, 1, range(1)),
        (4, 1, {}, 0, range(0)),  # a CPU node
        (3, 2, {}, 4, range(2, 3)),  # uneven: one GPU each, GPU 3 unused
    ],
)
def test_each_task_trains_on_the_gpus_slurm_gave_it(tasks_here, local, env, visible, share):
    assert slurm.gpu_share(_step(tasks_here, local), env, visible) == share


def test_tasks_sharing_too_few_gpus_is_an_error_saying_what_to_ask_for():
    with pytest.raises(ValueError, match="srun --gpus-per-task=1"):
        slurm.gpu_share(_step(4, 0), {"CUDA_VISIBLE_DEVICES": "0,1"}, 2)


def test_one_launcher_per_node_numbers_its_workers_job_wide():
    job, warning = hosts.from_slurm(SRUN_TASK_1, 2)
    port = slurm.first_port(SRUN_TASK_1)
    assert job.addresses == tuple(f"mk-node{n}:{port + j}" for n in range(2) for j in range(2))
    assert (job.first_rank, job.local_workers, job.multi_host, job.slurm) == (2, 2, True, True)
    assert warning is None
    job, _ = hosts.from_slurm(SRUN_TASK_1, 1, port=5000)
    assert job.addresses == ("mk-node0:5000", "mk-node1:5000")


def test_several_launchers_on_a_node_are_warned_about():
    env = {**SRUN_TASK_1, "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_NUM_TASKS": "4"}
    env["SLURM_LOCALID"] = "1"
    job, warning = hosts.from_slurm(env, 2)
    assert job.first_rank == 6 and len(job.addresses) == 8
    assert "the Slurm step runs 2 mirrorkit launchers on mk-node1" in warning
    assert "srun --ntasks-per-node=1 mirrorkit launch -n 4" in warning


def test_a_launch_in_a_batch_script_is_local_and_warned_about():
    job, warning = hosts.from_slurm(BATCH_SCRIPT, 2)
    assert job is None
    assert "only this launcher's 2 worker(s) train" in warning


def test_output_prefixes_count_from_the_first_local_rank():
    out = io.StringIO()
    command = [sys.executable, "-c", "print('hello')"]
    processes.run_commands([command, command], stream=out, first=4)
    assert sorted(out.getvalue().splitlines()) == ["[w4] hello", "[w5] hello"]
