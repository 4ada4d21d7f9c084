"""`mirrorkit bench` end to end, and its argument errors."""

import itertools
import json
import re
import statistics
import subprocess
import sys

import pytest
from _quoted import Quote, assert_quoted_in, quoted_block


def _bench(*args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "mirrorkit", "bench", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.multiprocess
def test_bench_mlp_on_one_and_two_replicas_writes_json(tmp_path):
    done = _bench(
        "--model", "mlp", "--replicas", "1,2", "--steps", "5", "--repeats", "2", "--rounds", "2",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    results = json.loads((tmp_path / "bench-mlp.json").read_text())
    rows = results["results"]
    assert [(r["replicas"], r["workers"]) for r in rows] == [(1, 1), (2, 1)]
    for row in rows:
        assert row["examples_per_sec"] > 0 and len(row["rates"]) == 4  # 2 repeats x 2 rounds
        assert row["examples_per_sec"] == statistics.median(row["examples_per_sec_per_round"])
        assert row["examples_per_sec_per_replica"] == pytest.approx(
            row["examples_per_sec"] / row["replicas"]
        )
    assert rows[0]["scaling_efficiency"] == 1.0
    one, two = (row["examples_per_sec_per_round"] for row in rows)
    expected = [b / 2 / a for a, b in zip(one, two, strict=True)]
    assert rows[1]["efficiency_per_round"] == pytest.approx(expected)
    assert "(round 2/2)" in done.stderr
    assert "examples/s" in done.stdout and "efficiency" in done.stdout
    assert "[2/2] mlp: 2 replica(s)" in done.stderr  # progress while it runs
    assert (tmp_path / "bench-mlp.png").stat().st_size > 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--replicas", "0"], "--replicas counts must be positive"),
        (["--workers", "two"], "--workers takes comma-separated counts"),
        (["--steps", "0"], "--steps, --repeats and --rounds must be at least 1"),
        (["--rounds", "0"], "--steps, --repeats and --rounds must be at least 1"),
    ],
)
def test_bench_rejects_bad_arguments(args, message, mirrorkit_command, capsys):
    # In this process: `python -m mirrorkit` is sys.exit(cli.main()), run end to end by the
    # benchmark tests above; a fresh one per case would import TensorFlow 4 more times.
    code = mirrorkit_command("bench", *args)
    out, err = capsys.readouterr()
    assert code == 2 and message in err and message not in out


def test_bench_model_names_match_the_bundled_models():
    from mirrorkit.bench import models
    from mirrorkit.commands import bench

    assert sorted(bench.MODEL_NAMES) == sorted(models.MODELS)
    assert 1_100_000 < models.get("cnn").build().count_params() < 1_300_000
    with pytest.raises(ValueError, match="unknown benchmark model 'vgg'"):
        models.get("vgg")


#: A user's own module, outside mirrorkit: a compiled model, its examples, and mistakes.
USER_MODULE = """
import keras
import numpy as np
import tensorflow as tf


def make_model():
    model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


def make_dataset():
    x = np.random.default_rng(0).normal(size=(256, 20)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, x[:, :1]))


def seven_features():
    x = np.zeros((16, 7), "float32")
    return tf.data.Dataset.from_tensor_slices((x, x[:, :1]))


def classifier():  # integer labels: no --data needed, its random labels are integers
    model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(10)])
    model.compile(optimizer="adam", metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def one_hot_labels():  # labels that do not fit classifier's sparse loss
    x = np.zeros((16, 20), "float32")
    return tf.data.Dataset.from_tensor_slices((x, np.eye(10, dtype="float32")[np.arange(16) % 10]))


def not_compiled():
    return keras.Sequential([keras.Input((20,)), keras.layers.Dense(1)])


def not_a_model():
    return "a model"
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_models.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.multiprocess
def test_bench_times_a_model_of_yours_with_the_bundled_models_columns(user_module):
    done = subprocess.run(
        [sys.executable, "-m", "mirrorkit", "bench", "--model", "my_models:make_model",
         "--data", "my_models:make_dataset", "--replicas", "1,2", "--steps", "5",
         "--repeats", "1", "--out", str(user_module / "out")],
        capture_output=True, text=True, timeout=600, cwd=user_module,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    from mirrorkit.bench.results import format_table

    results = json.loads((user_module / "out" / "bench-make_model.json").read_text())
    rows = results["results"]
    table = format_table(rows)  # the one table the bundled models print too
    assert table in done.stdout
    assert table.splitlines()[0].split() == [
        "replicas", "workers", "pinned", "examples/s", "per", "replica", "efficiency"
    ]  # fmt: skip
    assert [(r["replicas"], r["workers"]) for r in rows] == [(1, 1), (2, 1)]
    assert rows[0]["scaling_efficiency"] == 1.0 and rows[1]["scaling_efficiency"] > 0
    assert all(r["verdict"] for r in rows) and "2 replica(s) x 1 worker(s): " in done.stdout
    assert (user_module / "out" / "bench-make_model.png").stat().st_size > 0
    # Which verdict a configuration gets (dispatch-, input-bound, ...) follows the machine's
    # load on so short a step: a verdict line is compared up to the configuration it names.
    quote = quoted_block("throughput.md", "A small Dense model (20 features, 64 units, Adam)")
    lines = [re.sub(r"(worker\(s\): ).*", r"\1...", line) for line in quote.lines]
    assert_quoted_in(Quote(lines, quote.where), done.stdout, figures_vary=True)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "vgg"], "unknown --model 'vgg': choose one of cnn, mlp"),
        (["--model", "no_such_module:make"], "cannot import 'no_such_module'"),
        (["--model", "my_models:make"], "my_models has no function 'make' (its functions: "),
        (["--model", "my_models:not_compiled"], "not_compiled() returned a model that is not"),
        (["--model", "my_models:not_a_model"], "must return a keras.Model; it returned str"),
        (
            ["--model", "my_models:make_model", "--data", "my_models:seven_features"],
            "gives examples of shape (7,), the model's input 0 takes (20,)",
        ),
        (
            ["--model", "my_models:classifier", "--data", "my_models:one_hot_labels"],
            "one training step on --data's examples failed: ValueError: ",
        ),
        (["--model", "mlp", "--data", "my_models:make_dataset"], "--data goes with a model of"),
        (["--model", "my_models:make_model", "--compare-raw"], "--compare-raw compare(s) a "),
    ],
)
def test_a_model_of_yours_that_cannot_run_is_named_before_the_run(
    args, message, user_module, mirrorkit_command, capsys
):
    code = mirrorkit_command("bench", *args)
    out, err = capsys.readouterr()
    assert code == 2 and message in err, err


def test_a_classifier_of_yours_gets_integer_labels_that_fit_its_sparse_loss(user_module):
    import my_models

    from mirrorkit.bench import user_model

    user_model.check(my_models.classifier, None)  # one step on the random examples: no error
    model = my_models.classifier()
    x, y = next(iter(user_model.examples(model, None)))
    assert (tuple(x.shape), tuple(y.shape), y.dtype.name) == ((20,), (), "int32")


def _bench_row(replicas, workers, rate, base_rate, launcher="mirrorkit"):
    devices = replicas * workers
    return {
        "model": "cnn", "replicas": replicas, "workers": workers, "examples_per_sec": rate,
        "examples_per_sec_per_replica": rate / devices, "launcher": launcher,
        "scaling_efficiency": rate / devices / base_rate, "pinned": workers > 1,
    }  # fmt: skip


def test_bench_plot_draws_throughput_by_devices_against_ideal_scaling(tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib.transforms import Bbox

    from mirrorkit.bench import results as bench_results

    rows = [
        _bench_row(1, 1, 1000.0, 1000.0),
        _bench_row(2, 1, 1900.0, 1000.0),  # 95%
        _bench_row(4, 1, 3320.0, 1000.0),  # 83%
        _bench_row(1, 2, 1800.0, 1000.0),  # 90%: 2 devices too, as 2 workers
        _bench_row(1, 1, 980.0, 980.0, "raw"),
        _bench_row(1, 2, 1700.0, 980.0, "raw"),  # 87%, against raw's own 1 worker
    ]
    results = {"model": "cnn", "per_replica_batch_size": 64, "results": rows}
    figure = bench_results.figure(results)
    figure.canvas.draw()
    (axis,) = figure.axes
    assert axis.get_xlabel() == "devices (replicas across all workers)"
    assert axis.get_ylabel() == "examples per second"
    assert "cnn" in axis.get_title()
    lines = {line.get_label(): line for line in axis.get_lines()}
    assert set(axis.get_legend_handles_labels()[1]) == set(lines)
    ideal = lines["ideal linear scaling: 1 device x N"]
    assert list(ideal.get_xdata()) == [1, 2, 4]
    assert list(ideal.get_ydata()) == [1000.0, 2000.0, 4000.0]
    assert list(lines["1 worker, N replicas"].get_xdata()) == [1, 2, 4]
    assert list(lines["N workers, 1 replica each"].get_ydata()) == [1000.0, 1800.0]
    assert list(lines["raw tf.distribute (--compare-raw)"].get_ydata()) == [980.0, 1700.0]
    texts = [t for t in axis.texts if t.get_text().endswith("%")]
    assert sorted(t.get_text() for t in texts) == ["83%", "87%", "90%", "95%"]
    # No efficiency covers a measured point's marker, though three share 2 devices.
    renderer = figure.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in texts]
    for line in axis.get_lines():
        if line.get_marker() in ("None", None, ""):
            continue
        radius = line.get_markersize() / 2 * figure.dpi / 72
        points = line.get_transform().transform(line.get_xydata())
        for (x, y), box in itertools.product(points, boxes):
            assert not box.overlaps(Bbox([[x - radius, y - radius], [x + radius, y + radius]])), (
                f"an efficiency label covers the marker at ({x:.0f}, {y:.0f}) px"
            )
    assert bench_results.plot(results, str(tmp_path / "bench-cnn.png")) == str(
        tmp_path / "bench-cnn.png"
    )
    assert (tmp_path / "bench-cnn.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
