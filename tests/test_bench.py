"""`mirrorkit bench` end to end, and its argument errors."""

import json
import statistics
import subprocess
import sys

import pytest


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
