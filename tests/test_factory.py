"""mk.strategy(), mk.describe() and mk.build() in the pytest process (4 logical CPUs)."""

import functools

import keras
import pytest
import tensorflow as tf
from _models import tiny_model

import mirrorkit as mk
from mirrorkit.strategies import arguments, current

HAS_GPU = bool(tf.config.list_physical_devices("GPU"))


def test_cpu_replicas_make_a_mirrored_strategy():
    strategy = mk.strategy(cpu_replicas=2)
    assert isinstance(strategy, tf.distribute.MirroredStrategy)
    assert strategy.num_replicas_in_sync == 2
    topology = mk.describe(strategy)
    assert topology.local_devices == ("CPU:0", "CPU:1")
    assert (topology.num_workers, topology.worker_index, topology.is_chief) == (1, 0, True)


def test_same_request_returns_the_same_strategy(capsys):
    # A module that ran earlier in this process may have made this strategy already (test_flags
    # does): then this request would be the second, returned without a word.
    current._made.clear()
    first = mk.strategy("mirrored", cpu_replicas=4, all_reduce="reduce_to_one")
    said = capsys.readouterr().err
    assert (
        "mirrorkit: MirroredStrategy, 4 replicas on 1 worker (CPU:0-3), "
        "all-reduce ReductionToOneDevice" in said
    )
    again = mk.strategy("MIRRORED", cpu_replicas=4, all_reduce="REDUCE_TO_ONE")
    assert again is first
    assert capsys.readouterr().err == ""


def test_more_cpu_replicas_than_fixed_is_a_clear_error():
    with pytest.raises(RuntimeError, match="restart the kernel") as err:
        mk.strategy(cpu_replicas=8)
    assert "4 logical CPU" in str(err.value)


def test_aliases_and_default():
    assert arguments.normalize_kind("multi_worker_mirrored") == "multi_worker"
    assert arguments.normalize_kind("Off") == "default"
    default = mk.strategy("off")
    assert default is tf.distribute.get_strategy()
    assert mk.describe(default).kind == "DefaultStrategy"


def test_one_device_and_auto_with_one_replica():
    assert isinstance(mk.strategy("one_device"), tf.distribute.OneDeviceStrategy)
    auto = mk.strategy(cpu_replicas=1)
    assert isinstance(auto, tf.distribute.OneDeviceStrategy)


def test_auto_with_one_device_warns_about_unused_all_reduce(monkeypatch):
    from mirrorkit import notices

    current._made.clear()
    monkeypatch.setattr(notices, "_said", set())  # said once per process: another test may have
    with pytest.warns(UserWarning, match="nothing to all-reduce"):
        mk.strategy(cpu_replicas=1, bucket_mb=8)


def test_bucket_and_timeout_reach_the_collective_all_reduce():
    strategy = mk.strategy("mirrored", cpu_replicas=2, bucket_mb=4, timeout_s=30)
    options = strategy.extended._communication_options
    assert options.bytes_per_pack == 4 * 2**20
    assert options.timeout_seconds == 30
    assert "buckets of 4 MB, timeout 30 s" in mk.describe(strategy).all_reduce


def test_explicit_devices():
    strategy = mk.strategy(devices=["CPU:1", "/cpu:3"])
    assert mk.describe(strategy).local_devices == ("CPU:1", "CPU:3")


def test_describe_renders_text_and_html():
    topology = mk.describe(mk.strategy(cpu_replicas=2))
    text = str(topology)
    assert "replicas in sync  2" in text and "MirroredStrategy" in text
    html = topology._repr_html_()
    assert html.startswith("<table") and "<td style='text-align:left'>2</td>" in html
    assert topology.to_dict()["local_devices"] == ["CPU:0", "CPU:1"]


def test_describe_uses_the_strategy_in_scope():
    strategy = mk.strategy(cpu_replicas=4)
    mk.strategy(cpu_replicas=2)
    with strategy.scope():
        assert mk.describe().num_replicas == 4
    assert mk.describe().num_replicas == 2


_model = functools.partial(tiny_model, 3, 2)


def test_build_creates_mirrored_variables():
    strategy = mk.strategy(cpu_replicas=2)
    model = mk.build(_model, strategy)
    assert isinstance(model, keras.Model)
    kernel = model.layers[0].kernel.value
    assert isinstance(kernel, tf.distribute.DistributedValues)
    assert len(strategy.experimental_local_results(kernel)) == 2


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: mk.build(_model()), "Pass the function itself"),
        (lambda: mk.build(lambda: 3), "must return a keras.Model; it returned int"),
    ],
)
def test_build_errors(call, match):
    with pytest.raises(TypeError, match=match):
        call()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"kind": "mirorred"}, "valid kinds are auto, mirrored, multi_worker"),
        ({"all_reduce": "allgather"}, "valid values are auto, nccl, ring"),
        ({"devices": ["CPU:0"], "cpu_replicas": 2}, "devices and cpu_replicas"),
        ({"num_gpus": 1, "cpu_replicas": 2}, "num_gpus and cpu_replicas"),
        ({"kind": "one_device", "cpu_replicas": 2}, "one replica"),
        ({"kind": "one_device", "devices": ["CPU:0", "CPU:1"]}, "exactly one device"),
        ({"kind": "default", "cpu_replicas": 2}, "takes no cpu_replicas"),
        ({"kind": "multi_worker", "cpu_replicas": 2}, "takes no cpu_replicas"),
        ({"kind": "one_device", "all_reduce": "ring"}, "nothing to all-reduce"),
        ({"cpu_replicas": 0}, "cpu_replicas must be >= 1"),
        ({"cpu_replicas": 2.0}, "cpu_replicas must be an integer"),
        ({"cpu_replicas": 2, "bucket_mb": -1}, "bucket_mb must be a positive"),
        ({"devices": "CPU:0"}, "non-empty list"),
        ({"devices": ["CPU:9"]}, "CPU:9 do not exist in this process; it has CPU:0"),
        (
            {"kind": "mirrored", "cpu_replicas": 2, "all_reduce": "reduce_to_one", "bucket_mb": 4},
            "Drop bucket_mb",
        ),
        ({"kind": "mirrored", "cpu_replicas": 2, "all_reduce": "hierarchical_copy"}, "needs GPUs"),
    ],
)
def test_bad_arguments_are_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mk.strategy(**kwargs)


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU error")
def test_nccl_without_gpus_is_an_error():
    with pytest.raises(ValueError, match="all_reduce='nccl' needs GPUs"):
        mk.strategy("mirrored", cpu_replicas=2, all_reduce="nccl")


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU error")
def test_more_gpus_than_exist_names_what_exists():
    with pytest.raises(ValueError, match=r"num_gpus=2 was asked for, but this process sees 0 GPU"):
        mk.strategy(num_gpus=2)


def test_other_keras_backend_is_a_clear_error(monkeypatch):
    # Installing JAX to switch backends for real is out of reach here; the
    # check reads keras.backend.backend(), which is what this replaces.
    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    with pytest.raises(RuntimeError, match="Keras runs on the 'jax' backend here"):
        mk.strategy(cpu_replicas=2)


def test_strategies_with_different_replica_counts_work_in_one_process():
    # Without distinct collective keys the 2-replica all-reduce joins the 4-replica group.
    import tensorflow as tf

    for replicas in (4, 2, 4, 3):
        strategy = mk.strategy(cpu_replicas=replicas)

        @tf.function
        def count_replicas(strategy=strategy):
            def one():
                return tf.distribute.get_replica_context().all_reduce("SUM", tf.constant(1.0))

            return strategy.experimental_local_results(strategy.run(one))[0]

        assert float(count_replicas()) == replicas


def test_buckets_start_with_the_last_layer_so_all_reduce_overlaps_backprop():
    """bucket_mb's promise: the first collective carries the gradients computed first.

    Backpropagation produces the last layer's gradients first; the first
    bucket must hold them, or every bucket waits for the whole backward pass.
    """
    from _training import GLOBAL_BATCH, make_data, make_model

    strategy = mk.strategy(cpu_replicas=2, bucket_mb=100 / 2**20)  # 100-byte buckets
    model = mk.build(lambda: make_model("sgd", 0.1), strategy)
    x, y = make_data()
    data = mk.distribute((x, y), strategy, global_batch_size=GLOBAL_BATCH, shuffle=False)
    model.fit(data, epochs=1, steps_per_epoch=1, verbose=0)  # creates the optimizer's variables
    step = tf.function(lambda batch: strategy.run(model.train_step, args=(batch,)))
    graph = step.get_concrete_function(next(iter(data))).graph
    sizes = [
        op.inputs[0].shape.num_elements()
        for op in graph.get_operations()  # in the order they were made, which they run in
        if op.type == "CollectiveReduceV2" and op.device.endswith("CPU:0")
    ]
    # Variables, first layer first: conv 72+4, dense 512+8, dense 24+3 elements.
    # Packed from the end into buckets just over 100 bytes: 24+3, 512+8, 72+4.
    assert sizes == [27, 520, 76]


def test_cpu_replicas_under_a_multi_worker_tf_config_is_said_to_be_ignored(monkeypatch, capfd):
    import json

    from mirrorkit.strategies import topology

    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {
                "cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
                "task": {"type": "worker", "index": 0},
            }
        ),
    )
    assert topology.plan_auto(cpu_replicas=2).kind == "multi_worker"
    said = capfd.readouterr().err
    assert "cpu_replicas=2 is ignored: TF_CONFIG makes this process one of 2 workers" in said
    assert topology.plan_auto(cpu_replicas=None).kind == "multi_worker"
    assert "ignored" not in capfd.readouterr().err
