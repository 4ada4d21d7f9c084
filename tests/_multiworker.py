"""Run a function as N real workers of one job (TF_CONFIG on loopback) and collect all results.

It goes through the one local-job function every launcher uses
(`mirrorkit.launcher.local_job.run_job`), unpinned and in this machine's
network, as the suite always ran its workers.
"""

from __future__ import annotations

from mirrorkit.launcher import local_job


def run_workers(fn, *args, n=2, timeout_s=300, extra_env=None, env=None):
    """Returns every worker's ``fn(*args)``, in worker order.

    Args:
        extra_env: variables for every worker.
        env: ``env(i)`` gives worker i its own variables, e.g. a TF_CONFIG the
            test wrote; they win over the launcher's.
    """

    def worker_env(i):
        return {**(extra_env or {}), **(env(i) if env else {})}

    return local_job.run_job(
        fn,
        n,
        args,
        pin=False,
        private_network=False,
        env=worker_env,
        timeout_s=timeout_s,
        wording=None,
    )


def own_tf_configs(tasks):
    """Each process's TF_CONFIG for a job the test lays out itself, e.g. ``["chief", "worker"]``.

    Returns ``env(i)`` for `run_workers`: process i is ``tasks[i]``, numbered within
    its job type in order, on a free loopback port.
    """
    from mirrorkit.cluster import tf_config
    from mirrorkit.launcher.ports import local_addresses

    cluster, me = {}, []
    for task_type, address in zip(tasks, local_addresses(len(tasks)), strict=True):
        cluster.setdefault(task_type, []).append(address)
        me.append((task_type, len(cluster[task_type]) - 1))
    return lambda i: {"TF_CONFIG": tf_config.for_task(cluster, *me[i])}


#: The scenarios that share the session's one 2-worker job (`two_worker_job` in
#: tests/conftest.py): name -> (test module, function). Each function takes the worker's
#: strategy (one ``mk.strategy()`` per worker, made once) and keyword arguments, and returns
#: plain values; the tests of its module only read what it returned. A scenario that must
#: fail, leaves a repair off or needs a strategy of its own gets a job of its own instead.
SHARED_SCENARIOS = {
    "healthy": ("test_multiworker", "healthy_scenarios"),
    "distribute": ("test_distribute_multiworker", "distribute_scenarios"),
    "accumulation": ("test_accumulation", "accumulate_on_workers"),
    "loss_forms": ("test_loss_forms", "loss_forms_on_workers"),
    "recipes": ("test_optimizer_step", "recipes_on_workers"),
}


def _shared_scenarios(kwargs):
    """In each worker: the scenarios named in `kwargs`, in turn, on one strategy."""
    import importlib

    import mirrorkit as mk

    strategy = mk.strategy()
    results = {}
    for name, (module, function) in SHARED_SCENARIOS.items():
        if name in kwargs:
            scenario = getattr(importlib.import_module(module), function)
            results[name] = scenario(strategy, **kwargs[name])
    return results


def shared_job(kwargs, timeout_s=600):
    """Every worker's results of some `SHARED_SCENARIOS`: a list (worker order) of {name: result}.

    Args:
        kwargs: name -> keyword arguments of each scenario to run (e.g. a data directory).
        timeout_s: for the whole job; it does the work of up to three jobs.
    """
    return run_workers(_shared_scenarios, kwargs, n=2, timeout_s=timeout_s)
