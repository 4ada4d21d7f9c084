"""Ray Train's real ``TensorflowTrainer`` runs examples/ray_train.py's training on 2 workers.

A local Ray cluster (2 CPUs, no dashboard) is started by the test, in a fresh
process inside a private network namespace (only loopback: Ray's traffic stays on
127.0.0.1, which the test checks), and shut
down at the end; Ray starts the 2 workers and gives each its ``TF_CONFIG`` and
``TF_USE_LEGACY_KERAS=1``, exactly as on a real Ray cluster. Nothing in Ray or
tf.distribute is mocked. Each worker writes its final weights; both must equal
the weights one device reaches on the same global batches (computed in a fresh
process of its own), within 1e-5. Without mirrorkit's Keras repairs the same
function fails in Ray's workers with "Attempt to convert a value (PerReplica:
...)" (ray-project/ray#47464).

Skipped only where Ray is not installed (``pip install "mirrorkit[ray]"``).
"""

from __future__ import annotations

import importlib.util
import io
import sys
from pathlib import Path

import numpy as np
import pytest

# Only a missing Ray skips; Ray without its train extra fails on `import ray.train` below.
pytest.importorskip(
    "ray", reason='Ray is not installed: pip install "mirrorkit[ray]" (CI\'s newest leg has it)'
)

from mirrorkit.launcher import netns  # noqa: E402
from mirrorkit.launcher.processes import run_function  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.waits]  # waits: Ray starts its daemons
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ray_train.py"
TOLERANCE = 1e-5
NOTICE = "TF_USE_LEGACY_KERAS=1 is set (Ray Train sets it); mirrorkit uses Keras 3"


def _one_device_weights(example_path):
    """In a fresh process: the example's model trained on one device, same global batches."""
    spec = importlib.util.spec_from_file_location("ray_train_example", example_path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)

    import mirrorkit as mk

    strategy = mk.strategy("one_device")
    model, _ = example.fit(strategy)
    return [w.copy() for w in model.get_weights()]


def _ray_job(example_path, tmp):
    """In a fresh process, in a private network namespace: Ray Train's 2 workers, their weights.

    Inside the namespace there is only a loopback interface, so Ray's node address is
    127.0.0.1 and nothing the job sends can leave this machine (on the host's network Ray
    would put the host's own address in TF_CONFIG). Returns each worker's weights and the
    lines the workers wrote (Ray's own log files, read after training: no wait on Ray's
    forwarding).
    """
    import glob
    import os

    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    os.environ["RAY_DEDUP_LOGS"] = "0"
    os.environ.pop("TF_CONFIG", None)
    example = _load_example_from(example_path)
    weights_dir = Path(tmp) / "weights"
    weights_dir.mkdir()
    context = ray.init(address="local", num_cpus=2, include_dashboard=False)
    try:
        trainer = TensorflowTrainer(
            example.train_func,
            train_loop_config={"epochs": example.EPOCHS, "weights_dir": str(weights_dir)},
            scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
            run_config=RunConfig(name="test_ray", storage_path=str(Path(tmp) / "ray_results")),
        )
        result = trainer.fit()  # raises with the failing worker's traceback
        assert result.error is None, result.error
        session = context.address_info["session_dir"]
        lines = []
        for path in sorted(glob.glob(os.path.join(session, "logs", "worker-*"))):
            with open(path, errors="replace") as f:
                lines += [f"{os.path.basename(path)}: {line.rstrip()}" for line in f]
        node_ip = ray.util.get_node_ip_address()
    finally:
        ray.shutdown()
    return _workers_weights(weights_dir, 2), lines, node_ip


def _load_example_from(path):
    import ray.cloudpickle

    name = "mirrorkit_example_ray_train"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    ray.cloudpickle.register_pickle_by_value(module)  # Ray's workers cannot import examples/
    return module


def _workers_weights(weights_dir, n):
    weights = []
    for rank in range(n):
        with np.load(weights_dir / f"worker-{rank}.npz") as saved:
            weights.append([saved[f"arr_{i}"] for i in range(len(saved.files))])
    return weights


def test_two_ray_workers_train_like_one_device(tmp_path):
    if netns.check() is not None:
        pytest.skip(f"cannot make a private network namespace here: {netns.check()}")
    want = run_function(_one_device_weights, (str(EXAMPLE),), timeout_s=300)[0]
    workers, lines, node_ip = run_function(
        _ray_job,
        (str(EXAMPLE), str(tmp_path)),
        timeout_s=600,
        stream=io.StringIO(),
        private_network=True,
    )[0]
    assert node_ip == "127.0.0.1"  # Ray's traffic stayed on loopback

    for rank, got_weights in enumerate(workers):
        assert len(got_weights) == len(want)
        for i, (got, expected) in enumerate(zip(got_weights, want, strict=True)):
            np.testing.assert_allclose(
                got, expected, rtol=0, atol=TOLERANCE, err_msg=f"Ray worker {rank} weight {i}"
            )
    for a, b in zip(*workers, strict=True):  # both workers hold the same weights, bit for bit
        np.testing.assert_array_equal(a, b)

    # Ray set TF_USE_LEGACY_KERAS=1 in its workers; the chief said once that Keras 3 stays.
    output = "\n".join(lines)
    assert "MultiWorkerMirroredStrategy, 2 replicas on 2 workers" in output, output[-4000:]
    notices = [line for line in lines if NOTICE in line]
    assert notices, f"no TF_USE_LEGACY_KERAS notice (does Ray still set it?):\n{output[-4000:]}"
    assert len({line.split(":")[0] for line in notices}) == 1, notices  # one worker's log said it
