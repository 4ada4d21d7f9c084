"""GPU replicas: 1 vs N equivalence, an NCCL all-reduce, and the GPU check script's CPU smoke path.

The GPU tests skip without a GPU (this project's CI has none); run them with
``benchmarks/gpu_check.sh`` on a machine that has GPUs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

GPUS = len(tf.config.list_physical_devices("GPU"))
needs_gpu = pytest.mark.skipif(GPUS == 0, reason="needs a GPU (TensorFlow sees none)")
needs_two_gpus = pytest.mark.skipif(
    GPUS < 2, reason=f"NCCL needs 2 physical GPUs (TensorFlow sees {GPUS})"
)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _train_on_gpu_replicas(replicas: int):
    """In a fresh process: SGD and Adam on `replicas` GPU replicas (logical GPUs if one)."""
    import tensorflow as tf

    import mirrorkit as mk
    from tests._training import LEARNING_RATES, train_small_model

    tf.config.experimental.enable_tensor_float_32_execution(False)  # float32 sums, not TF32
    tf.config.experimental.enable_op_determinism()
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) < replicas:  # split the one GPU into logical ones
        tf.config.set_logical_device_configuration(
            gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=2048)] * replicas
        )
    devices = [f"/GPU:{i}" for i in range(replicas)]
    strategy = mk.strategy(devices=devices)
    assert strategy.num_replicas_in_sync == replicas
    assert all("GPU" in d for d in strategy.extended.worker_devices)
    return {name: train_small_model(strategy, name, lr) for name, lr in LEARNING_RATES.items()}


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("replicas", [2, 4])
def test_gpu_replicas_train_like_one_gpu(fresh, replicas):
    one = fresh(_train_on_gpu_replicas, 1)
    many = fresh(_train_on_gpu_replicas, replicas)
    for name in one:
        for a, b in zip(one[name][0], many[name][0], strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5, err_msg=name)


def _nccl_all_reduce():
    import tensorflow as tf

    import mirrorkit as mk
    from tests._training import train_small_model

    strategy = mk.strategy(num_gpus=2, all_reduce="nccl")
    ops = mk.describe(strategy).all_reduce  # e.g. "NcclAllReduce"
    values = strategy.run(
        lambda: tf.fill(
            [1000],
            tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group + 1, tf.float32),
        )
    )
    total = strategy.reduce(tf.distribute.ReduceOp.SUM, values, axis=None)
    weights, history = train_small_model(strategy, "sgd", 0.1, epochs=1)
    return ops, total.numpy().tolist()[:3], bool(np.isfinite(history["loss"]).all())


@needs_two_gpus
@pytest.mark.gpu
def test_nccl_all_reduce_strategy_is_made_and_used(fresh):
    ops, total, finite = fresh(_nccl_all_reduce)
    assert ops == "NcclAllReduce"
    assert total == [3.0, 3.0, 3.0]  # replica 1's ones + replica 2's twos
    assert finite


@pytest.mark.multiprocess
def test_gpu_check_script_smoke_runs_every_part_on_the_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    command = ["bash", "benchmarks/gpu_check.sh", "--smoke", str(out)]
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["ok"] and result["smoke"]
    assert "TensorFlow" in result["info"]["stdout"] or "tensorflow" in result["info"]["stdout"]
    assert result["tests"]["returncode"] in (0, 5), result["tests"]  # 5: all skipped/deselected
    assert "skipped" in result["tests"]["summary"]
    assert "bringing up nodes" not in result["tests"]["stdout"]  # one process: no xdist workers
    assert result["allreduce"]["bench"]["ok"] and result["allreduce"]["in_process"]["rows"]
    resnet = result["resnet"]
    assert resnet["replicas"] == 2 and resnet["ratio_mirrorkit_over_plain"] > 0
    mixed = result["mixed_precision"]
    assert mixed["mixed"]["policy"] == "mixed_bfloat16" and mixed["ratio_mixed_over_float32"] > 0
