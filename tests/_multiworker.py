"""Run a function as N real workers of one job (TF_CONFIG on loopback) and collect all results."""

from __future__ import annotations

from mirrorkit.launcher import cluster_spec, processes


def run_workers(fn, *args, n=2, timeout_s=300, extra_env=None):
    addresses = cluster_spec.local_addresses(n)

    def env(i):
        return {"TF_CONFIG": cluster_spec.tf_config(addresses, i), **(extra_env or {})}

    return processes.run_function(fn, args, num_processes=n, env=env, timeout_s=timeout_s)
