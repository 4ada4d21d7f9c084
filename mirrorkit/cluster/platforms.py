"""What the managed platforms' own variables say about a job, beside TF_CONFIG.

Kubeflow's TFJob, Vertex AI and SageMaker each start the workers and describe
the cluster in a TF_CONFIG, which `mirrorkit.cluster.cluster_info` reads (the one reader).
This module reads what they write besides it, where that changes what a user
should hear:

- SageMaker sets ``SM_HOSTS`` (a JSON list, ``["algo-1", "algo-2"]``) and
  ``SM_CURRENT_HOST`` on every training instance. Only the estimator's
  ``distribution={"multi_worker_mirrored_strategy": {"enabled": True}}`` makes
  its TensorFlow container also write a TF_CONFIG (``worker`` tasks on port
  8890). Without it, several hosts and no TF_CONFIG means each host trains a
  model of its own on all of its data; `mk.strategy()` says so once, on the
  first host (the chief once the switch is on).
- Vertex AI's ``CLUSTER_SPEC`` (worker pools ``workerpool0..3``) repeats what
  its TF_CONFIG says; mirrorkit reads TF_CONFIG only.

Reads the environment only; no TensorFlow import.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from mirrorkit.cluster import chief
from mirrorkit.environment_variables import SM_CURRENT_HOST, SM_HOSTS, TF_CONFIG

#: The estimator argument that makes SageMaker write a TF_CONFIG for all-reduce training.
SAGEMAKER_SWITCH = 'distribution={"multi_worker_mirrored_strategy": {"enabled": True}}'


def sagemaker_hosts(env: Mapping[str, str] | None = None) -> list[str]:
    """The training instances SageMaker names in ``SM_HOSTS``; [] outside SageMaker.

    Args:
        env: the environment to read; `os.environ` when None.

    Returns:
        The host names, in SageMaker's order (``algo-1`` first).

    Example:
    ```python
    from mirrorkit.cluster import platforms

    assert platforms.sagemaker_hosts({"SM_HOSTS": '["algo-1", "algo-2"]'}) == ["algo-1", "algo-2"]
    assert platforms.sagemaker_hosts({}) == []
    ```
    """
    env = os.environ if env is None else env
    try:
        hosts = json.loads(env.get(SM_HOSTS, "[]"))
    except json.JSONDecodeError:
        return []
    return [h for h in hosts if isinstance(h, str)] if isinstance(hosts, list) else []


def sagemaker_notice(env: Mapping[str, str] | None = None) -> str | None:
    """The warning for several SageMaker hosts without a TF_CONFIG; None when it does not apply.

    It applies on the first host of ``SM_HOSTS`` only (the chief once the
    switch is on), so a job says it once.

    Args:
        env: the environment to read; `os.environ` when None.

    Returns:
        The warning, naming the hosts and the estimator switch, or None.

    Example:
    ```python
    from mirrorkit.cluster import platforms

    env = {"SM_HOSTS": '["algo-1", "algo-2"]', "SM_CURRENT_HOST": "algo-1"}
    assert "multi_worker_mirrored_strategy" in platforms.sagemaker_notice(env)
    assert platforms.sagemaker_notice({**env, "SM_CURRENT_HOST": "algo-2"}) is None
    ```
    """
    env = os.environ if env is None else env
    hosts = sagemaker_hosts(env)
    if len(hosts) < 2 or env.get(TF_CONFIG, "").strip() or env.get(SM_CURRENT_HOST) != hosts[0]:
        return None
    return (
        f"WARNING: SageMaker started {len(hosts)} hosts (SM_HOSTS={', '.join(hosts)}) but wrote "
        "no TF_CONFIG, so each host trains a model of its own on all of its data: "
        f"{len(hosts)} separate trainings, not one job. To train them as one job, give the "
        f"estimator {SAGEMAKER_SWITCH}; SageMaker then writes each host's TF_CONFIG and "
        "mk.strategy() makes one MultiWorkerMirroredStrategy over the hosts."
    )


def say_notices() -> None:
    """Says each platform notice that applies here, once per process, on the chief.

    Example:
    ```python
    from mirrorkit.cluster import platforms

    platforms.say_notices()  # mk.strategy() calls it
    ```
    """
    line = sagemaker_notice()
    if line is not None:
        chief.say_once("sagemaker-without-tf-config", line)
