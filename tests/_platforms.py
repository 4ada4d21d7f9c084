"""The environments Kubeflow's TFJob, Vertex AI and SageMaker give their workers, replayed here.

Each ``*_env`` function writes, for every task of a job, the variables the
platform writes, in the platform's format, following its own code or docs:

- Kubeflow training-operator (``pkg/controller.v1/tensorflow/tensorflow.go``,
  ``genTFConfigJSONStr`` and ``genClusterSpec``; v1 API, last in
  kubeflow/training-operator at ee11629): ``cluster`` from every replica spec
  (the evaluator included), job names lowercased, addresses
  ``{name}-{type}-{i}.{namespace}.svc:{port}``, the port of the ``tensorflow``
  container's port named ``tfjob-port`` (default 2222), ``environment: cloud``.
- Vertex AI (docs: "Distributed training", ``CLUSTER_SPEC`` and ``TF_CONFIG``;
  AI Platform's "TF_CONFIG and distributed training"): worker pool 0 is
  ``chief``, pool 1 ``worker``, pool 3 the evaluator; ``TF_CONFIG``'s
  ``cluster`` never holds the evaluator; ``CLUSTER_SPEC`` names the pools
  ``workerpool0..3``; hosts ``cmle-training-workerpool{n}-{id}-{i}:2222``.
- SageMaker (aws/sagemaker-tensorflow-training-toolkit, ``training.py``,
  ``_build_tf_config_for_mwms``): ``SM_HOSTS``/``SM_CURRENT_HOST`` always;
  with the ``multi_worker_mirrored_strategy`` switch a TF_CONFIG of ``worker``
  tasks on port 8890, ``environment: cloud``.

Host names resolve the way the platform's DNS would, to loopback: each worker
process enters a private mount namespace (`hosts_file_namespace`) where the
job's own hosts file is bound over ``/etc/hosts``; TensorFlow's gRPC reads it
like any resolver. The machine's ``/etc/hosts`` is never touched.

Ports: TensorFlow's worker server binds ``0.0.0.0:port`` whatever address
TF_CONFIG names, so two workers on one machine (one network namespace) cannot
share the platform's fixed port (2222, 8890); a process job passes ``port=``
free ports, one per task, and everything else stays the platform's bytes.
Only the standard library is imported at the top: a worker calls
`hosts_file_namespace` before anything starts a thread.
"""

from __future__ import annotations

import ctypes
import json
import os

KUBEFLOW_PORT = 2222  # kubeflowv1.TFJobDefaultPort
VERTEX_PORT = 2222
SAGEMAKER_MWMS_PORT = 8890
VERTEX_POOLS = {"chief": 0, "worker": 1, "ps": 2, "evaluator": 3}


def kubeflow_env(manifest, ports=None, cluster_domain=""):
    """Every replica's TF_CONFIG as the training-operator writes it from a TFJob manifest.

    Args:
        manifest: the TFJob, as loaded from YAML.
        ports: ``ports[(replica_type_lowercase, index)]`` replaces the replica's
            port (a process job on one machine); None keeps the manifest's.
        cluster_domain: the operator's ``CUSTOM_CLUSTER_DOMAIN``.

    Returns:
        ``[(replica type as in the manifest, index, {"TF_CONFIG": ...}), ...]``
        in manifest order.
    """
    name = manifest["metadata"]["name"]
    namespace = manifest["metadata"].get("namespace", "default")
    specs = manifest["spec"]["tfReplicaSpecs"]
    cluster = {}
    for rtype, spec in specs.items():
        rt = rtype.lower()
        port = _tfjob_port(spec)
        addresses = []
        for i in range(spec.get("replicas", 1)):
            svc = f"{name}-{rt}-{i}".replace("/", "-") + f".{namespace}.svc"
            if cluster_domain:
                svc += "." + cluster_domain
            addresses.append(f"{svc}:{(ports or {}).get((rt, i), port)}")
        cluster[rt] = addresses
    cluster = dict(sorted(cluster.items()))  # Go marshals a map with its keys sorted
    tasks = []
    for rtype, spec in specs.items():
        for i in range(spec.get("replicas", 1)):
            # Go's json.Marshal of TFConfig: fields in struct order, no spaces.
            config = {
                "cluster": cluster,
                "task": {"type": rtype.lower(), "index": i},
                "environment": "cloud",
            }
            tasks.append((rtype, i, {"TF_CONFIG": json.dumps(config, separators=(",", ":"))}))
    return tasks


def _tfjob_port(spec):
    """``GetPortFromTFJob``: the ``tensorflow`` container's ``tfjob-port``, else 2222."""
    for container in spec["template"]["spec"]["containers"]:
        if container.get("name") == "tensorflow":
            for port in container.get("ports", []):
                if port.get("name") == "tfjob-port":
                    return port["containerPort"]
    return KUBEFLOW_PORT


def vertex_env(tasks, job_id="3f2a9c1e7b", port=None):
    """Each task's TF_CONFIG and CLUSTER_SPEC as Vertex AI writes them.

    Args:
        tasks: task types in pool order, e.g. ``["chief", "worker", "evaluator"]``.
        job_id: the hex id Vertex puts in every host name.
        port: ``port[i]`` replaces task i's 2222 (a process job on one machine).

    Returns:
        ``env(i)`` for `run_workers`, and the host name of each task.
    """
    pools, hosts, me = {}, [], []
    for i, task in enumerate(tasks):
        pool = VERTEX_POOLS[task]
        index = len(pools.setdefault(pool, []))
        host = f"cmle-training-workerpool{pool}-{job_id}-{index}"
        pools[pool].append(f"{host}:{port[i] if port else VERTEX_PORT}")
        hosts.append(host)
        me.append((task, pool, index))
    job = {
        "worker_pool_specs": [
            {
                "machine_spec": {"machine_type": "n1-standard-4"},
                "replica_count": str(len(pools.get(p, []))),
                "container_spec": {"image_uri": "us-docker.pkg.dev/my-project/trainer:latest"},
            }
            for p in range(4)
        ]
    }
    # The evaluator (pool 3) is never in TF_CONFIG's 'cluster'.
    tf_cluster = {t: pools[p] for t, p in VERTEX_POOLS.items() if t != "evaluator" and p in pools}

    def env(i):
        task, pool, index = me[i]
        tf_config = {
            "cluster": tf_cluster,
            "environment": "cloud",
            "task": {"type": task, "index": index, "trial": ""},
            "job": job,
        }
        cluster_spec = {
            "cluster": {f"workerpool{p}": a for p, a in sorted(pools.items())},
            "environment": "cloud",
            "task": {"type": f"workerpool{pool}", "index": index, "trial": ""},
            "job": json.dumps(job, separators=(",", ":")),
        }
        return {"TF_CONFIG": json.dumps(tf_config), "CLUSTER_SPEC": json.dumps(cluster_spec)}

    return env, hosts


def sagemaker_env(num_hosts, mwms=True, port=None):
    """Each host's variables as SageMaker's TensorFlow container sets them.

    Args:
        num_hosts: training instances (``algo-1`` ... ``algo-N``).
        mwms: whether the estimator set
            ``distribution={"multi_worker_mirrored_strategy": {"enabled": True}}``
            (the toolkit then writes TF_CONFIG).
        port: ``port[i]`` replaces host i's 8890 (a process job on one machine).

    Returns:
        ``env(i)`` for `run_workers`, and the host names.
    """
    hosts = [f"algo-{i + 1}" for i in range(num_hosts)]

    def env(i):
        variables = {
            "SM_HOSTS": json.dumps(hosts),
            "SM_CURRENT_HOST": hosts[i],
            "SM_NUM_CPUS": "2",
            "SM_NUM_GPUS": "0",
        }
        if mwms:  # _build_tf_config_for_mwms(hosts, current_host)
            workers = [
                f"{h}:{port[j] if port else SAGEMAKER_MWMS_PORT}" for j, h in enumerate(hosts)
            ]
            tf_config = {
                "cluster": {"worker": workers},
                "environment": "cloud",
                "task": {"index": hosts.index(hosts[i]), "type": "worker"},
            }
            variables["TF_CONFIG"] = json.dumps(tf_config)
        return variables

    return env, hosts


def hosts_file(path, names):
    """Writes a hosts file mapping each name to its own loopback address, 127.0.0.2 on."""
    lines = ["127.0.0.1 localhost"] + [f"127.0.0.{i + 2} {n}" for i, n in enumerate(names)]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return str(path)


_CLONE_NEWNS, _CLONE_NEWUSER = 0x00020000, 0x10000000
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18


def hosts_file_namespace(path):
    """Moves this (single-threaded) process into a private mount namespace; `path` is /etc/hosts.

    Mounts are made private first, so the bind mount never reaches the
    machine's own mount namespace; it ends with the process.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.geteuid(), os.getegid()
    flags = _CLONE_NEWNS if uid == 0 else _CLONE_NEWNS | _CLONE_NEWUSER
    if libc.unshare(flags) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS) for a private /etc/hosts")
    if uid != 0:
        for name, text in (
            ("setgroups", "deny"),
            ("uid_map", f"{uid} {uid} 1"),
            ("gid_map", f"{gid} {gid} 1"),
        ):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    for source, target, mount_flags in (
        (None, b"/", _MS_REC | _MS_PRIVATE),
        (os.fsencode(path), b"/etc/hosts", _MS_BIND),
    ):
        if libc.mount(source or b"none", target, None, mount_flags, None) != 0:
            raise OSError(ctypes.get_errno(), f"mount {target!r}")


def in_platform(hosts_path, fn, *args):
    """A worker's entry: the job's hosts file as /etc/hosts, then ``fn(*args)``."""
    hosts_file_namespace(hosts_path)
    return fn(*args)


def platform_task():
    """What one task of a platform's job does: a training task trains, the evaluator evaluates.

    Returns the facts the tests check: how the cluster's host names resolved,
    the task, its strategy and topology, and the trained weights (training
    tasks) or the evaluation's loss (the evaluator, on a strategy of its own).
    """
    import socket

    import numpy as np
    from _training import LEARNING_RATES, make_data, make_model, train_small_model

    import mirrorkit as mk
    from mirrorkit.cluster import cluster_info

    config = json.loads(os.environ["TF_CONFIG"])
    names = {a.rpartition(":")[0] for job in config["cluster"].values() for a in job}
    here = cluster_info.from_environment()
    strategy = mk.strategy()
    facts = {
        "resolved": {name: socket.gethostbyname(name) for name in sorted(names)},
        "task": (here.task_type, here.task_index),
        "is_chief": mk.is_chief(),
        "strategy": type(strategy).__name__,
        "topology": mk.describe().to_dict(),
    }
    if not here.is_training_worker:
        x, y = make_data()
        model = mk.build(lambda: make_model("sgd", LEARNING_RATES["sgd"]), strategy)
        facts["eval_loss"] = float(np.asarray(model.evaluate(x, y, verbose=0)[0]))
        return facts
    facts["sgd"] = train_small_model(strategy, "sgd", LEARNING_RATES["sgd"])
    return facts


def run_script_main(path, argv):
    """Loads the script at `path` as a module and returns its ``main(argv)``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_platform_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(argv)


def train_then_evaluate(path, model_dir):
    """The one-device reference of a script with ``main``, ``evaluate`` (no TF_CONFIG)."""
    import importlib.util

    import mirrorkit as mk

    spec = importlib.util.spec_from_file_location("_platform_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    weights = module.main(["--model-dir", model_dir, "--epochs", "2"])
    return weights, module.evaluate(mk.strategy(), model_dir, wait_s=0)
