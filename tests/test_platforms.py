"""Kubeflow's TFJob, Vertex AI and SageMaker: their layouts replayed with real worker processes.

Each job gets the variables its platform writes, in the platform's format
(`_platforms` says where each format comes from), and its host names resolve
to loopback addresses through a hosts file bound over ``/etc/hosts`` in each
worker's private mount namespace. Two training workers train through
TensorFlow's collective runtime and must end with the weights one device gets
(its own process); the evaluator runs beside them on a strategy of its own.
The TFJob manifest in ``examples/kubeflow`` is checked against the training
operator's CRD schema (``tests/data/kubeflow_tfjob_v1_schema.json``: the v1
``openAPIV3Schema`` of kubeflow/training-operator's ``kubeflow.org_tfjobs.yaml``
at ee11629, descriptions removed) and its own script is what the job runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from _multiworker import run_workers
from _platforms import (
    hosts_file,
    in_platform,
    kubeflow_env,
    platform_task,
    run_script_main,
    sagemaker_env,
    train_then_evaluate,
    vertex_env,
)
from _quoted import assert_quoted_in, quoted_block

from mirrorkit.cluster import cluster_info
from mirrorkit.launcher.ports import free_ports

TOLERANCE = 1e-5
ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "examples" / "kubeflow" / "tfjob.yaml"
SCRIPT = ROOT / "examples" / "kubeflow" / "train.py"
SCHEMA = Path(__file__).resolve().parent / "data" / "kubeflow_tfjob_v1_schema.json"
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2"}


def _manifest():
    return yaml.safe_load(MANIFEST.read_text())


def _crd_errors(manifest):
    """The CRD schema's errors, then the operator's admission webhook rules (validateTFJob)."""
    import jsonschema

    schema = json.loads(SCHEMA.read_text())["openAPIV3Schema"]
    validator = jsonschema.Draft7Validator(schema)
    errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(manifest)]
    specs = manifest.get("spec", {}).get("tfReplicaSpecs", {})
    for rtype, spec in specs.items():
        if rtype not in ("Chief", "Master", "Worker", "PS", "Evaluator"):
            errors.append(f"tfReplicaSpecs.{rtype}: not a TFJob replica type")
        containers = spec.get("template", {}).get("spec", {}).get("containers", [])
        if not any(c.get("name") == "tensorflow" for c in containers):
            errors.append(f"tfReplicaSpecs.{rtype}: no container named tensorflow")
        errors += [
            f"tfReplicaSpecs.{rtype}: a container has no image"
            for c in containers
            if not c.get("image")
        ]
    if sum(rtype in ("Chief", "Master") for rtype in specs) > 1:
        errors.append("tfReplicaSpecs: more than one Chief or Master")
    return errors


def test_the_tfjob_manifest_is_valid_for_the_training_operator():
    manifest = _manifest()
    assert (manifest["apiVersion"], manifest["kind"]) == ("kubeflow.org/v1", "TFJob")
    assert _crd_errors(manifest) == []
    assert sorted(manifest["spec"]["tfReplicaSpecs"]) == ["Chief", "Evaluator", "Worker"]
    # The check bites: what the CRD or the operator's webhook refuses is found.
    broken = _manifest()
    broken["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] = "two"
    broken["spec"]["tfReplicaSpecs"]["Evaluator"]["restartPolicy"] = 3
    broken["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"][0]["name"] = "tf"
    errors = _crd_errors(broken)
    assert any("Worker.replicas" in e for e in errors), errors
    assert any("Evaluator.restartPolicy" in e for e in errors), errors
    assert any("Chief: no container named tensorflow" in e for e in errors), errors


def test_the_tf_config_rebuilt_from_the_manifest_is_the_operators():
    tasks = kubeflow_env(_manifest())
    assert [(rtype, i) for rtype, i, _ in tasks] == [("Chief", 0), ("Worker", 0), ("Evaluator", 0)]
    assert tasks[0][2]["TF_CONFIG"] == (
        '{"cluster":{"chief":["mirrorkit-train-chief-0.default.svc:2222"],'
        '"evaluator":["mirrorkit-train-evaluator-0.default.svc:2222"],'
        '"worker":["mirrorkit-train-worker-0.default.svc:2222"]},'
        '"task":{"type":"chief","index":0},"environment":"cloud"}'
    )
    evaluator = cluster_info.parse_tf_config(tasks[2][2]["TF_CONFIG"])
    assert (evaluator.worker_index, evaluator.num_workers, evaluator.is_chief) == (None, 2, False)


def test_vertex_evaluator_outside_the_cluster_is_a_task_of_its_own():
    env, _ = vertex_env(["chief", "worker", "evaluator"])
    evaluator = cluster_info.from_environment(env(2))
    assert (evaluator.task_type, evaluator.task_index, evaluator.worker_index) == (
        "evaluator",
        0,
        None,
    )
    assert not evaluator.is_chief and not evaluator.is_multi_worker
    assert evaluator.num_workers == 2  # the job's training tasks, chief first
    chief = cluster_info.from_environment(env(0))
    assert (chief.worker_index, chief.is_chief, chief.num_workers) == (0, True, 2)


@pytest.mark.parametrize(
    "config",
    [
        # SageMaker's parameter_server switch (_build_tf_config_for_ps), on a worker.
        {
            "cluster": {
                "master": ["algo-1:2222"],
                "ps": ["algo-1:2223", "algo-2:2223"],
                "worker": ["algo-2:2222"],
            },
            "environment": "cloud",
            "task": {"index": 0, "type": "worker"},
        },
        # A TFJob with PS replicas, on a parameter server.
        {
            "cluster": {
                "ps": ["j-ps-0.default.svc:2222"],
                "worker": ["j-worker-0.default.svc:2222"],
            },
            "task": {"type": "ps", "index": 0},
            "environment": "cloud",
        },
    ],
)
def test_a_parameter_server_layout_is_refused_naming_what_to_do(config, monkeypatch):
    import mirrorkit as mk

    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    with pytest.raises(ValueError) as err:
        mk.strategy()
    message = str(err.value)
    assert "'ps' job" in message and "ParameterServerStrategy" in message
    assert "multi_worker_mirrored_strategy" in message  # SageMaker's switch to use instead


def _replayed(tmp_path, hosts, task, *args, n, env):
    path = hosts_file(tmp_path / "hosts", hosts)
    return run_workers(in_platform, path, task, *args, n=n, env=env, extra_env=QUIET)


def _same_weights(got, want, what):
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(g, w, rtol=0, atol=TOLERANCE, err_msg=f"{what} {i}")


def _check_training_tasks(results, want, hosts, kinds):
    """Both training tasks: names resolved, ranks chief first, one-device weights."""
    for rank, facts in enumerate(results[:2]):
        assert set(facts["resolved"]) >= set(hosts[:2])
        assert all(
            ip.startswith("127.0.0.") and ip != "127.0.0.1" for ip in facts["resolved"].values()
        )
        assert facts["task"] == kinds[rank]
        assert facts["strategy"] == "CollectiveAllReduceStrategy"
        topology = facts["topology"]
        assert (topology["num_workers"], topology["worker_index"]) == (2, rank)
        assert facts["is_chief"] == (rank == 0) == topology["is_chief"]
        _same_weights(facts["sgd"][0], want, f"{kinds[rank]} weight")


@pytest.mark.multiprocess
def test_vertex_ai_layout_trains_like_one_device(tmp_path, one_device_runs):
    tasks = ["chief", "worker", "evaluator"]
    env, hosts = vertex_env(tasks, port=free_ports(3))
    results = _replayed(tmp_path, hosts, platform_task, n=3, env=env)
    _check_training_tasks(results, one_device_runs["sgd"][0], hosts, [("chief", 0), ("worker", 0)])
    evaluator = results[2]
    assert evaluator["task"] == ("evaluator", 0) and not evaluator["is_chief"]
    assert evaluator["strategy"] == "OneDeviceStrategy"  # joined no collective
    assert evaluator["topology"]["worker_index"] is None
    assert np.isfinite(evaluator["eval_loss"])


@pytest.mark.multiprocess
def test_sagemaker_multi_worker_mirrored_layout_trains_like_one_device(tmp_path, one_device_runs):
    env, hosts = sagemaker_env(2, mwms=True, port=free_ports(2))
    results = _replayed(tmp_path, hosts, platform_task, n=2, env=env)
    _check_training_tasks(results, one_device_runs["sgd"][0], hosts, [("worker", 0), ("worker", 1)])


@pytest.mark.multiprocess
def test_the_tfjob_example_trains_like_one_device_and_its_evaluator_evaluates(
    tmp_path, fresh, capfd
):
    want_weights, want_eval = fresh(train_then_evaluate, str(SCRIPT), str(tmp_path / "alone"))
    capfd.readouterr()  # the one-device run's evaluation: not the job's evaluator
    manifest = _manifest()
    ports = dict(zip([("chief", 0), ("worker", 0), ("evaluator", 0)], free_ports(3), strict=True))
    tasks = kubeflow_env(manifest, ports=ports)
    job = json.loads(tasks[0][2]["TF_CONFIG"])["cluster"]
    hosts = [job[t][0].rpartition(":")[0] for t in ("chief", "worker", "evaluator")]
    argv = ["--model-dir", str(tmp_path / "job"), "--epochs", "2", "--wait-s", "300"]
    chief, worker, evaluator = _replayed(
        tmp_path, hosts, run_script_main, str(SCRIPT), argv, n=3, env=lambda i: tasks[i][2]
    )
    _same_weights(chief, want_weights, "chief weight")
    _same_weights(worker, want_weights, "worker weight")
    for key in ("loss", "accuracy"):  # the evaluator read the chief's model
        np.testing.assert_allclose(evaluator[key], want_eval[key], rtol=0, atol=TOLERANCE)
    # what each task printed, as its pod's log has it: without the local job's [wN] before it
    printed = capfd.readouterr()
    logs = re.sub(r"^\[w\d+\] ", "", printed.out + printed.err, flags=re.M)
    for quote in (  # the page's run: 3 epochs, not 2
        quoted_block("clusters/kubeflow.md", "The chief's log shows the strategy"),
        quoted_block("clusters/kubeflow.md", "evaluates the model on held-out data"),
    ):
        assert_quoted_in(quote, logs, figures_vary=True)


def _sagemaker_host_without_tf_config():
    import contextlib
    import io

    import mirrorkit as mk

    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        first = mk.strategy()
        mk.strategy("one_device")
    return {"said": said.getvalue(), "num_workers": mk.describe(first).num_workers}


@pytest.mark.multiprocess
def test_sagemaker_hosts_without_tf_config_are_warned_once_on_the_first_host(fresh):
    env, _ = sagemaker_env(2, mwms=False)
    # Fresh processes, not a local job: a job's launcher would give them a TF_CONFIG.
    first, second = fresh.many(
        _sagemaker_host_without_tf_config, n=2, env=lambda i: {**QUIET, **env(i)}
    )
    switch = 'distribution={"multi_worker_mirrored_strategy": {"enabled": True}}'
    assert first["said"].count(switch) == 1, first["said"]
    assert (
        "SageMaker started 2 hosts (SM_HOSTS=algo-1, algo-2) but wrote no TF_CONFIG"
        in first["said"]
    )
    assert switch not in second["said"]
    assert first["num_workers"] == second["num_workers"] == 1  # each host alone, as warned
