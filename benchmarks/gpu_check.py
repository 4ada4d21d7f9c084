"""The GPU check behind ``benchmarks/gpu_check.sh``: one JSON of what mirrorkit does on GPUs.

Each part runs in a fresh Python process (TensorFlow fixes its devices and
Keras its dtype policy at first use) and prints its result as the last line:

- ``info``: ``mirrorkit info``'s output;
- ``tests``: ``pytest tests/test_gpu.py`` (1 vs N GPU replicas within tolerance,
  an NCCL all-reduce strategy made and used), its summary line and exit code;
- ``allreduce``: ``mirrorkit bench --allreduce`` (all-reduce between 2 local
  workers, on CPUs: the launcher gives each local worker every GPU, and NCCL
  refuses two workers on one GPU), and the all-reduce latency between this process's GPU replicas
  through ``mk.strategy(all_reduce="nccl")``;
- ``resnet``: keras.applications.ResNet50(weights=None) on synthetic images,
  mirrorkit (mk.strategy, mk.build, mk.distribute) against the same plain Keras
  + tf.distribute.MirroredStrategy code, alternating epochs in one process:
  the step-time ratio;
- ``mixed``: the same ResNet-50 through mirrorkit in float32 and in
  mixed_float16 (fresh processes): the step-time ratio.

``--smoke`` runs every part on the CPU with tiny sizes (32x32 images, 2 steps,
all-reduce with ``reduce_to_one`` on logical CPUs, mixed_bfloat16) so that the
script's whole path is tested on machines without a GPU.

Example:
```python
import subprocess, sys
subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--smoke", "--out", "/tmp/gpu.json"])
```
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTS = ("info", "tests", "allreduce", "resnet", "mixed")


def _sizes(smoke: bool) -> dict:
    if smoke:
        # A small CNN stands in for ResNet-50: the smoke run checks the script's code path,
        # and tracing ResNet-50 on CPU replicas would take minutes.
        return {"image": 32, "batch": 2, "steps": 2, "repeats": 1, "classes": 10, "tiny": True}
    return {"image": 224, "batch": 64, "steps": 20, "repeats": 3, "classes": 1000}


def _gpus() -> int:
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU"))


def _replica_strategy(smoke: bool, plain: bool, all_reduce: str = "auto"):
    """All GPUs (or 2 logical CPUs in smoke mode), plain tf.distribute or through mirrorkit."""
    import tensorflow as tf

    import mirrorkit as mk

    gpus = _gpus()
    if plain:
        if gpus:
            return tf.distribute.MirroredStrategy()
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2
        )
        return tf.distribute.MirroredStrategy(["/CPU:0", "/CPU:1"])
    if gpus:
        return mk.strategy(num_gpus=gpus, all_reduce=all_reduce)
    if not smoke:
        raise SystemExit("gpu_check: no GPU visible to TensorFlow; use --smoke to test on the CPU")
    return mk.strategy(
        cpu_replicas=2, all_reduce="reduce_to_one" if all_reduce == "nccl" else all_reduce
    )


def _resnet(sizes: dict):
    import keras

    shape = (sizes["image"], sizes["image"], 3)
    if sizes.get("tiny"):
        model = keras.Sequential(
            [
                keras.Input(shape),
                keras.layers.Conv2D(8, 3, activation="relu"),
                keras.layers.GlobalAveragePooling2D(),
                keras.layers.Dense(sizes["classes"]),
            ]
        )
    else:
        model = keras.applications.ResNet50(
            weights=None, input_shape=shape, classes=sizes["classes"]
        )
    model.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(),
    )
    return model


def _images(sizes: dict):
    import tensorflow as tf

    x = tf.random.stateless_normal((sizes["image"], sizes["image"], 3), (0, 1))
    return tf.data.Dataset.from_tensors((x, tf.constant(1, tf.int32))).repeat()


def _step_times(model, data, sizes: dict, epochs: int) -> list[float]:
    from mirrorkit.bench.measure import EpochClock

    clock = EpochClock()
    model.fit(data, epochs=epochs, steps_per_epoch=sizes["steps"], verbose=0, callbacks=[clock])
    return [t / sizes["steps"] for t in clock.epoch_times]


def _mirrorkit_resnet(strategy, sizes: dict):
    import mirrorkit as mk

    model = mk.build(lambda: _resnet(sizes), strategy)
    data = mk.distribute(
        lambda ctx=None: _images(sizes), strategy, per_replica_batch_size=sizes["batch"]
    )
    return model, data


def part_resnet(smoke: bool) -> dict:
    """ResNet-50, plain Keras + MirroredStrategy (A) vs mirrorkit (B), alternating epochs."""
    sizes = _sizes(smoke)
    plain = _replica_strategy(smoke, plain=True)
    replicas = plain.num_replicas_in_sync
    with plain.scope():
        model_a = _resnet(sizes)
    data_a = plain.experimental_distribute_dataset(
        _images(sizes).batch(sizes["batch"] * replicas, drop_remainder=True).prefetch(2)
    )
    strategy = _replica_strategy(smoke, plain=False)
    model_b, data_b = _mirrorkit_resnet(strategy, sizes)
    times: dict[str, list[float]] = {"plain": [], "mirrorkit": []}
    for round_ in range(sizes["repeats"] + 1):
        for key, model, data in (("plain", model_a, data_a), ("mirrorkit", model_b, data_b)):
            step = _step_times(model, data, sizes, 1)[0]
            if round_ > 0:  # round 0 traces both
                times[key].append(step)
    plain_s, mk_s = statistics.median(times["plain"]), statistics.median(times["mirrorkit"])
    return {
        "model": "small CNN (smoke)" if sizes.get("tiny") else "ResNet50",
        "replicas": replicas,
        "per_replica_batch": sizes["batch"],
        "image_size": sizes["image"],
        "step_time_plain_s": plain_s,
        "step_time_mirrorkit_s": mk_s,
        "ratio_mirrorkit_over_plain": mk_s / plain_s,
        "times": times,
    }


def part_mixed(smoke: bool, policy: str) -> dict:
    """Step time of the mirrorkit ResNet-50 under one Keras dtype policy (a fresh process each)."""
    import keras

    keras.mixed_precision.set_global_policy(policy)
    sizes = _sizes(smoke)
    strategy = _replica_strategy(smoke, plain=False)
    model, data = _mirrorkit_resnet(strategy, sizes)
    steps = _step_times(model, data, sizes, sizes["repeats"] + 1)[1:]
    return {"policy": policy, "step_time_s": statistics.median(steps), "times": steps}


def part_nccl(smoke: bool) -> dict:
    """All-reduce latency between this process's replicas through mk.strategy(all_reduce="nccl")."""
    import tensorflow as tf

    import mirrorkit as mk

    strategy = _replica_strategy(smoke, plain=False, all_reduce="nccl")
    rows = []
    for size in (2**12, 2**20, 2**26) if not smoke else (2**12,):
        values = strategy.run(lambda n=size // 4: tf.ones([n]))

        def reduce_once(values=values):
            return strategy.reduce(tf.distribute.ReduceOp.SUM, values, axis=None)

        total = reduce_once()
        times = []
        for _ in range(5):
            start = time.perf_counter()
            float(tf.reduce_sum(reduce_once()[:1]))
            times.append(time.perf_counter() - start)
        rows.append(
            {"bytes": size, "latency_s": statistics.median(times), "first": float(total[0])}
        )
    return {
        "replicas": strategy.num_replicas_in_sync,
        "cross_device_ops": mk.describe(strategy).all_reduce,
        "rows": rows,
    }


def _child(part: str, smoke: bool, *extra: str) -> dict:
    """Runs ``--part`` in a fresh process; its JSON result, or the failure and output tail."""
    command = [sys.executable, os.path.abspath(__file__), "--part", part, *extra]
    command += ["--smoke"] if smoke else []
    return _capture_json(command)


def _capture_json(command: list[str], timeout_s: float = 900) -> dict:
    start = time.time()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    lines = done.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        result = {
            "ok": False,
            "returncode": done.returncode,
            "tail": (done.stdout + done.stderr)[-3000:],
        }
    result.setdefault("ok", done.returncode == 0)
    result["seconds"] = time.time() - start
    return result


def _run_text(command: list[str], timeout_s: float = 900, env: dict | None = None) -> dict:
    start = time.time()
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT,
        env=None if env is None else {**os.environ, **env},
    )  # fmt: skip
    return {
        "command": " ".join(command[1:] if command[0] == sys.executable else command),
        "returncode": done.returncode,
        "ok": done.returncode == 0,
        "stdout": done.stdout[-6000:],
        "stderr_tail": done.stderr[-2000:] if done.returncode else "",
        "seconds": time.time() - start,
    }


def check(smoke: bool, parts=PARTS) -> dict:
    """Runs every part (each in fresh processes) and returns the whole result."""
    py = sys.executable
    result: dict = {
        "smoke": smoke,
        "machine": {"platform": platform.platform()},
        "started": time.time(),
    }
    if "info" in parts:
        result["info"] = _run_text([py, "-m", "mirrorkit", "info"])
    if "tests" in parts:
        # One process (-n 0 overrides the suite's -n 2): the GPU tests each take every GPU,
        # so two pytest-xdist workers would share them, and the CPU smoke run would start two
        # more TensorFlow interpreters for tests that skip.
        tests = _run_text(
            [py, "-m", "pytest", "-q", "-rs", "-n", "0", "tests/test_gpu.py", "-k", "not script"]
        )
        lines = tests["stdout"].strip().splitlines()
        tests["summary"] = lines[-1] if lines else ""
        result["tests"] = tests
    if "allreduce" in parts:
        bench = [
            py,
            "-m",
            "mirrorkit",
            "bench",
            "--model",
            "mlp",
            "--replicas",
            "1",
            "--workers",
            # Smoke: the throughput sweep's 1-worker path only (the 2-worker one is what
            # tests/test_bench_raw.py runs); --allreduce still starts its 2 workers.
            "1" if smoke else "2",
        ]
        bench += [
            "--steps",
            "2",
            "--repeats",
            "1",
            "--allreduce",
            "--out",
            os.path.join(ROOT, "mirrorkit-bench"),
        ]
        # mirrorkit's launcher gives every local worker all GPUs, and NCCL refuses two
        # workers on one GPU: the workers' all-reduce runs on CPUs, NCCL between the
        # GPU replicas of one process.
        result["allreduce"] = {
            "bench": _run_text(bench, env={"CUDA_VISIBLE_DEVICES": ""}),
            "bench_note": "between 2 local workers on CPUs (CUDA_VISIBLE_DEVICES='')",
            "in_process": _child("nccl", smoke),
        }
    if "resnet" in parts:
        result["resnet"] = _child("resnet", smoke)
    if "mixed" in parts:
        low = "mixed_bfloat16" if smoke else "mixed_float16"
        f32, mixed = _child("mixed", smoke, "float32"), _child("mixed", smoke, low)
        ratio = None
        if f32.get("ok") and mixed.get("ok"):
            ratio = mixed["step_time_s"] / f32["step_time_s"]
        result["mixed_precision"] = {
            "float32": f32,
            "mixed": mixed,
            "ratio_mixed_over_float32": ratio,
        }
    result["seconds"] = time.time() - result.pop("started")
    result["ok"] = _all_ok(result)
    return result


def _all_ok(value) -> bool:
    """False when any part (at any depth) says ``ok: false``."""
    if not isinstance(value, dict):
        return True
    return value.get("ok", True) is not False and all(_all_ok(v) for v in value.values())


def main(argv: list[str] | None = None) -> int:
    """The command line: a whole check (``--out``) or one ``--part`` in this process."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes on the CPU (no GPU needed)"
    )
    parser.add_argument("--out", default="gpu_check.json", help="where the JSON goes")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"subset of {','.join(PARTS)}")
    parser.add_argument("--part", default=None, help=argparse.SUPPRESS)
    parser.add_argument("policy", nargs="?", default="float32", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.part:
        value = {
            "resnet": lambda: part_resnet(args.smoke),
            "mixed": lambda: part_mixed(args.smoke, args.policy),
            "nccl": lambda: part_nccl(args.smoke),
        }[args.part]()
        print(json.dumps({"ok": True, **value}))
        return 0
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"--parts: unknown {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    result = check(args.smoke, parts)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(
        f"gpu_check: {'ok' if result['ok'] else 'FAILED'} in {result['seconds']:.0f} s; {args.out}"
    )
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
