"""mirrorkit.flags: each flag reaches what it names; bad combinations fail at start-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from _quoted import assert_quoted_in, quoted_block
from absl import flags

import mirrorkit as mk
from mirrorkit import flags as mk_flags
from mirrorkit.cluster.tf_config import tf_config


def parse(*argv, **defaults):
    """A fresh FlagValues with mirrorkit's flags, parsed from argv."""
    fv = flags.FlagValues()
    mk_flags.define_flags(fv, **defaults)
    fv(["prog", *argv])
    return fv


def tiny_model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    return model


# --- each flag reaches what it names ------------------------------------------------------


def test_cpu_replicas_all_reduce_bucket_and_timeout_reach_the_strategy():
    fv = parse(
        "--cpu_replicas=2",
        "--all_reduce_alg=ring",
        "--bucket_mb=25",
        "--collective_timeout=30",
    )
    strategy = mk_flags.strategy_from_flags(fv)
    assert isinstance(strategy, tf.distribute.MirroredStrategy)
    assert strategy.num_replicas_in_sync == 2
    options = strategy.extended._communication_options
    assert options.bytes_per_pack == 25 * 1024 * 1024
    assert options.timeout_seconds == 30
    assert options.implementation == tf.distribute.experimental.CommunicationImplementation.RING


def test_all_reduce_alg_reduce_to_one_reaches_cross_device_ops():
    strategy = mk_flags.strategy_from_flags(
        parse("--cpu_replicas=4", "--all_reduce_alg=reduce_to_one")
    )
    assert strategy.num_replicas_in_sync == 4
    assert isinstance(strategy.extended._cross_device_ops, tf.distribute.ReductionToOneDevice)


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--distribution_strategy=one_device"], tf.distribute.OneDeviceStrategy),
        (["--distribution_strategy=MIRRORED", "--cpu_replicas=2"], tf.distribute.MirroredStrategy),
        (["--num_gpus=0"], tf.distribute.OneDeviceStrategy),
    ],
)
def test_distribution_strategy_and_num_gpus_choose_the_kind(argv, expected):
    strategy = mk_flags.strategy_from_flags(parse(*argv))
    assert type(strategy) is expected


def test_distribution_strategy_off_is_tensorflows_default():
    strategy = mk_flags.strategy_from_flags(parse("--distribution_strategy=off"))
    assert strategy is tf.distribute.get_strategy()  # outside any scope: the default strategy
    assert not tf.distribute.has_strategy()


def test_every_kind_the_flag_offers_is_one_mk_strategy_accepts():
    with pytest.raises(ValueError) as err:
        mk.strategy("no-such-kind")
    for kind in mk_flags.KINDS:
        assert kind in str(err.value)


def test_num_packs_replaces_the_packed_op():
    # The op only runs on GPUs; here it is swapped into a strategy that has one (CPU devices).
    strategy = tf.distribute.MirroredStrategy(
        ["/CPU:0", "/CPU:1"], cross_device_ops=tf.distribute.HierarchicalCopyAllReduce()
    )
    mk_flags.set_num_packs(strategy, "hierarchical_copy", 3)
    ops = strategy.extended._cross_device_ops
    assert isinstance(ops, tf.distribute.HierarchicalCopyAllReduce) and ops._num_packs == 3
    with pytest.raises(RuntimeError, match="not the NcclAllReduce expected"):
        mk_flags.set_num_packs(strategy, "nccl", 2)


@pytest.mark.gpu
@pytest.mark.skipif(not tf.config.list_physical_devices("GPU"), reason="needs GPUs")
def test_num_packs_reaches_a_gpu_strategy():
    fv = parse("--distribution_strategy=mirrored", "--all_reduce_alg=nccl", "--num_packs=2")
    ops = mk_flags.strategy_from_flags(fv).extended._cross_device_ops
    assert isinstance(ops, tf.distribute.NcclAllReduce) and ops._num_packs == 2


def _replica_batch_sizes(dataset, strategy):
    x, _ = next(iter(dataset))
    return [int(t.shape[0]) for t in strategy.experimental_local_results(x)]


@pytest.mark.parametrize(
    "argv, global_size, per_replica",
    [
        (["--batch_size=32"], 32, 16),  # global batch
        (["--per_replica_batch_size=8"], 16, 8),
        ([], 12, 6),  # the script's default (per_replica_batch_size=6)
    ],
)
def test_batch_size_flags_reach_the_distributed_dataset(argv, global_size, per_replica):
    fv = parse("--cpu_replicas=2", *argv)
    strategy = mk_flags.strategy_from_flags(fv)
    x, y = np.zeros((64, 3), "float32"), np.zeros((64, 2), "float32")
    data = mk_flags.distribute_from_flags((x, y), strategy, fv, per_replica_batch_size=6, seed=0)
    assert (data.global_batch_size, data.per_replica_batch_size) == (global_size, per_replica)
    assert _replica_batch_sizes(data, strategy) == [per_replica, per_replica]


def test_a_given_batch_flag_beats_the_other_flags_script_default():
    fv = parse("--batch_size=64", per_replica_batch_size=32)
    assert mk_flags.batch_size_kwargs(fv) == {"global_batch_size": 64}
    assert mk_flags.batch_size_kwargs(parse(per_replica_batch_size=32)) == {
        "per_replica_batch_size": 32
    }


def test_gradient_compression_and_mixed_precision_reach_the_model():
    from mirrorkit.training import gradient_hooks

    fv = parse(
        "--cpu_replicas=2", "--gradient_compression=bf16", "--mixed_precision=mixed_bfloat16"
    )
    strategy = mk_flags.strategy_from_flags(fv)
    try:
        model = mk_flags.build_from_flags(tiny_model, strategy, fv)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert model.layers[0].dtype_policy.name == "mixed_bfloat16"
    assert model.layers[0].kernel.dtype == "float32"  # weights stay float32
    (compressing,) = gradient_hooks.hooks(model.optimizer)
    assert compressing.fn.__name__ == "compressed_all_reduce"
    plain = mk_flags.build_from_flags(tiny_model, strategy, parse("--cpu_replicas=2"))
    assert plain.layers[0].dtype_policy.name == "float32"
    assert gradient_hooks.hooks(plain.optimizer) == ()


def test_throughput_json_is_written_by_the_callback(tmp_path):
    path = tmp_path / "throughput.json"
    fv = parse("--cpu_replicas=2", f"--throughput_json={path}", "--batch_size=8")
    strategy = mk_flags.strategy_from_flags(fv)
    model = mk_flags.build_from_flags(tiny_model, strategy, fv)
    data = mk_flags.distribute_from_flags(
        (np.zeros((32, 3), "float32"), np.zeros((32, 2), "float32")), strategy, fv, seed=0
    )
    callbacks = mk_flags.callbacks_from_flags(fv, warmup_steps=1, verbose=0)
    model.fit(data, epochs=1, verbose=0, callbacks=callbacks)
    report = json.loads(path.read_text())
    assert report  # the callback wrote its report where the flag says
    assert callbacks[0].json_path == str(path)


# --- invalid combinations fail at start-up, naming the flags ----------------------------

INVALID = [
    (
        ["--batch_size=64", "--per_replica_batch_size=8"],
        "--batch_size and --per_replica_batch_size",
    ),
    (["--cpu_replicas=2", "--num_gpus=1"], "--cpu_replicas and --num_gpus"),
    (["--num_packs=2"], "--num_packs applies to --all_reduce_alg nccl or hierarchical_copy"),
    (["--num_packs=2", "--all_reduce_alg=ring"], "not --all_reduce_alg ring"),
    (
        ["--num_packs=2", "--all_reduce_alg=nccl", "--distribution_strategy=multi_worker"],
        "--num_packs is for one host",
    ),
    (["--task_index=1"], "--task_index needs --worker_hosts"),
    (["--worker_hosts=a:1,b:2"], "--task_index must say which"),
    (["--worker_hosts=a:1,b:2", "--task_index=2"], "--task_index 2 is out of range"),
    (["--worker_hosts=a:1,b", "--task_index=0"], "--worker_hosts entry 2 ('b')"),
    (
        ["--worker_hosts=a:1,b:2", "--task_index=0", "--distribution_strategy=mirrored"],
        "--distribution_strategy mirrored runs on one machine",
    ),
    (["--batch_size=-1"], "--batch_size=-1: -1 is not a positive integer"),
    (["--per_replica_batch_size=0"], "--per_replica_batch_size=0"),
    (["--cpu_replicas=0"], "--cpu_replicas=0"),
    (["--num_gpus=-1"], "--num_gpus=-1"),
    (["--bucket_mb=0"], "--bucket_mb must be a positive number of megabytes"),
    (["--collective_timeout=-5"], "--collective_timeout must be a positive number of seconds"),
    (["--all_reduce_alg=reduce_to_one", "--bucket_mb=25"], "--bucket_mb applies to the collective"),
    (
        ["--distribution_strategy=mirrored", "--all_reduce_alg=nccl", "--collective_timeout=9"],
        "--collective_timeout applies to the collective",
    ),
    (["--distribution_strategy=multi_worker", "--cpu_replicas=2"], "--cpu_replicas with"),
    (
        ["--distribution_strategy=multi_worker", "--all_reduce_alg=hierarchical_copy"],
        "--all_reduce_alg hierarchical_copy is single-host",
    ),
    (["--distribution_strategy=one_device", "--cpu_replicas=2"], "(one replica); use mirrored"),
    (
        ["--distribution_strategy=off", "--num_gpus=1"],
        "--num_gpus with --distribution_strategy off",
    ),
    (["--distribution_strategy=one_device", "--bucket_mb=4"], "one replica has nothing to"),
    (["--distribution_strategy=bogus"], "--distribution_strategy"),
    (["--gradient_compression=int8"], "--gradient_compression"),
]


@pytest.mark.parametrize("argv, message", INVALID)
def test_invalid_combinations_fail_at_parse_time_naming_the_flags(argv, message):
    with pytest.raises(flags.IllegalFlagValueError) as err:
        parse(*argv)
    assert message in str(err.value)


def test_a_script_default_bucket_gives_way_to_an_all_reduce_without_buckets(capfd):
    fv = parse("--cpu_replicas=2", "--all_reduce_alg=reduce_to_one", bucket_mb=25)
    strategy = mk_flags.strategy_from_flags(fv)
    assert isinstance(strategy.extended._cross_device_ops, tf.distribute.ReductionToOneDevice)
    said = capfd.readouterr().err
    assert "this script's default --bucket_mb 25 is not used" in said
    assert_quoted_in(quoted_block("absl-flags.md", "The last case prints a notice:"), said)
    fv = parse("--cpu_replicas=2", bucket_mb=25)  # the default applies where it can
    options = mk_flags.strategy_from_flags(fv).extended._communication_options
    assert options.bytes_per_pack == 25 * 1024 * 1024


def test_a_script_default_all_reduce_gives_way_to_one_device():
    fv = parse("--distribution_strategy=one_device", all_reduce_alg="ring")
    assert type(mk_flags.strategy_from_flags(fv)) is tf.distribute.OneDeviceStrategy
    with pytest.raises(flags.IllegalFlagValueError, match="one replica has nothing to"):
        parse("--distribution_strategy=one_device", "--all_reduce_alg=ring")


def test_valid_combinations_parse():
    parse("--batch_size=64", "--cpu_replicas=2", "--bucket_mb=25", "--collective_timeout=60")
    parse("--worker_hosts=10.0.0.1:2222,10.0.0.2:2222", "--task_index=1", "--all_reduce_alg=ring")
    parse("--distribution_strategy=mirrored", "--all_reduce_alg=nccl", "--num_packs=4")


def test_define_flags_refuses_unknown_or_contradictory_defaults():
    with pytest.raises(ValueError, match="not mirrorkit flags"):
        mk_flags.define_flags(flags.FlagValues(), batchsize=3)
    with pytest.raises(ValueError, match="both batch_size and per_replica_batch_size"):
        mk_flags.define_flags(flags.FlagValues(), batch_size=64, per_replica_batch_size=8)


# --- TF_CONFIG and Slurm never override a flag silently ----------------------------------

HOSTS = "127.0.0.1:2222,127.0.0.1:2223"


def test_worker_hosts_differing_from_tf_config_is_an_error_naming_both(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", tf_config(["127.0.0.1:2222", "127.0.0.1:9999"], 1))
    with pytest.raises(flags.IllegalFlagValueError) as err:
        parse(f"--worker_hosts={HOSTS}", "--task_index=1")
    assert "--worker_hosts 127.0.0.1:2222,127.0.0.1:2223 differs from TF_CONFIG" in str(err.value)
    assert "127.0.0.1:9999" in str(err.value)


def test_task_index_differing_from_tf_config_is_an_error_naming_both(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", tf_config(HOSTS.split(","), 0))
    with pytest.raises(flags.IllegalFlagValueError, match="--task_index 1 differs from TF_CONFIG"):
        parse(f"--worker_hosts={HOSTS}", "--task_index=1")


def test_worker_hosts_differing_from_slurm_is_an_error(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    step = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "n[1-3]"}
    step.update(SLURM_STEP_TASKS_PER_NODE="1(x3)", SLURMD_NODENAME="n2", SLURM_LOCALID="0")
    for name, value in step.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(flags.IllegalFlagValueError, match="Slurm says task 1 of 3"):
        parse(f"--worker_hosts={HOSTS}", "--task_index=1")


def test_worker_hosts_write_tf_config_and_agreeing_tf_config_is_kept(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "")
    text = mk_flags.apply_cluster_flags(parse(f"--worker_hosts={HOSTS}", "--task_index=1"))
    assert json.loads(os.environ["TF_CONFIG"]) == {
        "cluster": {"worker": HOSTS.split(",")},
        "task": {"type": "worker", "index": 1},
    }
    assert text == os.environ["TF_CONFIG"]
    agreeing = tf_config(HOSTS.split(","), 1)
    monkeypatch.setenv("TF_CONFIG", agreeing)
    assert (
        mk_flags.apply_cluster_flags(parse(f"--worker_hosts={HOSTS}", "--task_index=1")) == agreeing
    )
    # A conflict appearing after parsing (TF_CONFIG set later) is still caught.
    fv = parse(f"--worker_hosts={HOSTS}", "--task_index=1")
    monkeypatch.setenv("TF_CONFIG", tf_config(HOSTS.split(","), 0))
    with pytest.raises(ValueError, match="--task_index 1 differs from TF_CONFIG"):
        mk_flags.apply_cluster_flags(fv)


# --- --flagfile, --help -----------------------------------------------------------------


def test_flagfile_sets_and_validates_flags(tmp_path):
    good = tmp_path / "good.flags"
    good.write_text(
        "--per_replica_batch_size=16\n--bucket_mb=25\n--distribution_strategy=mirrored\n"
    )
    fv = parse(f"--flagfile={good}")
    assert (fv.per_replica_batch_size, fv.bucket_mb, fv.distribution_strategy) == (
        16,
        25.0,
        "mirrored",
    )
    bad = tmp_path / "bad.flags"
    bad.write_text("--per_replica_batch_size=16\n--batch_size=64\n")
    with pytest.raises(
        flags.IllegalFlagValueError, match="--batch_size and --per_replica_batch_size"
    ):
        parse(f"--flagfile={bad}")


SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from absl import app, flags
    from mirrorkit import flags as mk_flags

    mk_flags.define_flags()

    def main(argv):
        names = [*mk_flags.FLAG_NAMES]
        values = {n: flags.FLAGS[n].value for n in names}
        print("FLAGS " + json.dumps({"argv": sys.argv[1:], "values": values,
                                     "worker": os.environ.get("MIRRORKIT_WORKER")}))

    if __name__ == "__main__":
        app.run(main)
    """
)


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


def _run(*argv, timeout=120):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=timeout, env=env
    )


def test_help_lists_every_flag_with_its_help_text(script):
    result = _run(str(script), "--help")
    assert result.returncode == 1, result.stderr  # absl's --help exits 1 after printing
    assert "Traceback" not in result.stderr
    fv = flags.FlagValues()
    mk_flags.define_flags(fv)
    for name in mk_flags.FLAG_NAMES:
        assert f"--{name}:" in result.stdout
        first_words = " ".join(fv[name].help.split()[:3])
        assert first_words in " ".join(result.stdout.split()), name
        assert len(fv[name].help) > 40


def test_a_bad_combination_exits_non_zero_before_main(script):
    result = _run(str(script), "--batch_size=64", "--per_replica_batch_size=8")
    assert result.returncode != 0
    assert "--batch_size and --per_replica_batch_size both set the batch size" in result.stderr
    assert "FLAGS " not in result.stdout


@pytest.mark.multiprocess
def test_flags_pass_through_mirrorkit_launch_untouched(script, tmp_path):
    flagfile = tmp_path / "extra.flags"
    flagfile.write_text("--bucket_mb=25\n")
    argv = [
        "--batch_size=64",
        "--step_logs",
        "local",
        "--all_reduce_alg=ring",
        f"--flagfile={flagfile}",
        "--timeout=3",  # also one of launch's own flags: must reach the script, which refuses it
    ]
    result = _run("-m", "mirrorkit", "launch", "-n", "2", str(script), *argv[:-1])
    assert result.returncode == 0, result.stderr
    seen = [
        json.loads(line.split("FLAGS ", 1)[1])
        for line in result.stdout.splitlines()
        if "FLAGS " in line
    ]
    assert sorted(s["worker"] for s in seen) == ["0", "1"]
    for s in seen:
        assert s["argv"] == argv[:-1]
        assert s["values"]["batch_size"] == 64
        assert s["values"]["step_logs"] == "local"
        assert s["values"]["bucket_mb"] == 25.0
    refused = _run("-m", "mirrorkit", "launch", "-n", "2", str(script), *argv)
    assert refused.returncode != 0
    assert "Unknown command line flag 'timeout'" in refused.stdout + refused.stderr


# --- --worker_hosts/--task_index make a real two-worker job ---------------------------------


def _worker_from_flags(hosts):
    import os

    from absl import flags as absl_flags

    from mirrorkit import flags as mk_flags
    from mirrorkit.compat.multi_worker_reduce import LOCAL_STEP_LOGS
    from mirrorkit.patching import attached

    fv = absl_flags.FlagValues()
    mk_flags.define_flags(fv)
    index = os.environ["WORKER_INDEX"]
    fv(
        [
            "prog",
            f"--worker_hosts={hosts}",
            f"--task_index={index}",
            "--step_logs=local",
            "--all_reduce_alg=ring",
            "--per_replica_batch_size=4",
            "--collective_timeout=60",
        ]
    )
    strategy = mk_flags.strategy_from_flags(fv)
    import keras
    import numpy as np
    import tensorflow as tf

    def make():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    model = mk_flags.build_from_flags(make, strategy, fv)
    data = mk_flags.distribute_from_flags(
        (np.ones((32, 3), "float32"), np.ones((32, 1), "float32")), strategy, fv, seed=0
    )
    model.fit(data, epochs=1, verbose=0)
    options = strategy.extended._communication_options
    return {
        "multi_worker": isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy),
        "replicas": strategy.num_replicas_in_sync,
        "task": strategy.cluster_resolver.task_id,
        "implementation": options.implementation.name,
        "timeout": options.timeout_seconds,
        "global_batch": data.global_batch_size,
        "local_step_logs": attached.attached(strategy, LOCAL_STEP_LOGS),
        "weights": [w.tolist() for w in model.get_weights()],
    }


@pytest.mark.multiprocess
def test_worker_hosts_and_task_index_make_a_two_worker_job(fresh):
    from mirrorkit.launcher.ports import local_addresses

    hosts = ",".join(local_addresses(2))
    results = fresh.many(
        _worker_from_flags, hosts, n=2, env=lambda i: {"WORKER_INDEX": str(i), "TF_CONFIG": ""}
    )
    assert [r["task"] for r in results] == [0, 1]
    for r in results:
        assert (r["multi_worker"], r["replicas"]) == (True, 2)
        assert (r["implementation"], r["timeout"], r["global_batch"]) == ("RING", 60, 8)
        assert r["local_step_logs"] is True
    assert results[0]["weights"] == results[1]["weights"]  # trained in sync


def test_the_flags_and_mk_strategy_share_one_vocabulary():
    """One home for the kinds and the all-reduce names (mirrorkit/strategies/rules.py)."""
    from mirrorkit.flags import checks
    from mirrorkit.strategies import allreduce, arguments, rules

    assert set(checks.KINDS) == set(rules.KINDS) | set(rules.ALIASES)
    assert checks.ALL_REDUCE_ALGS is rules.ALL_REDUCE_CHOICES is allreduce.ALL_REDUCE_CHOICES
    assert arguments.normalize_kind is rules.normalize_kind
    for kind in checks.KINDS:  # every value the flag takes is a kind mk.strategy takes
        assert rules.normalize_kind(kind) in rules.KINDS
