"""The scenario examples: each passes --smoke, lists mirrorkit's flags in --help, refuses bad flags.

Each test runs an example as a user would, in fresh processes; the
multi-worker ones under ``mirrorkit launch -n 2`` with real workers. Every
example imports TensorFlow at start (seconds of CPU per process), so all of
them are in the slow set; only the docstring check runs without a process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _quoted import assert_quoted_in, quoted_block
from absl import flags

from mirrorkit import flags as mk_flags

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SINGLE = ["workstation_vision.py", "resnet_global_batch.py"]
MULTI = ["bert_multiworker.py", "recommender_multiworker.py"]


def run(*argv, launch=False, timeout=420):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    prefix = (
        [sys.executable, "-m", "mirrorkit", "launch", "-n", "2"] if launch else [sys.executable]
    )
    result = subprocess.run(
        [*prefix, *map(str, argv)], capture_output=True, text=True, timeout=timeout, env=env
    )
    return result, result.stdout + result.stderr


def _ok(result, output):
    assert result.returncode == 0, output[-6000:]


@pytest.mark.multiprocess  # a fresh TensorFlow process that trains
def test_workstation_vision_smoke():
    result, output = run(EXAMPLES / "workstation_vision.py", "--smoke")
    _ok(result, output)
    assert "MirroredStrategy, 2 replicas on 1 worker" in output
    assert "3/3" in output  # three training steps
    assert "test accuracy" in output and "2 replicas, global batch 128" in output
    quote = quoted_block("scenarios.md", "It ends with:")
    assert_quoted_in(quote, output, figures_vary=True)  # the page's run: 15 epochs, not 3 steps


@pytest.mark.multiprocess  # one process, but 8 ResNet replicas take a while to trace on 2 cores
def test_resnet_global_batch_smoke():
    result, output = run(EXAMPLES / "resnet_global_batch.py", "--smoke")
    _ok(result, output)
    assert "MirroredStrategy, 8 replicas" in output
    assert "buckets of 25 MB" in output
    assert "8 replicas x 32 = global batch 256" in output
    assert "learning rate 0.1 x 256/256 = 0.1" in output
    assert "test accuracy" in output


@pytest.mark.multiprocess
def test_bert_multiworker_smoke_under_launch():
    result, output = run(EXAMPLES / "bert_multiworker.py", "--smoke", launch=True)
    _ok(result, output)
    assert "MultiWorkerMirroredStrategy, 2 replicas on 2 workers" in output
    assert "all-reduce CollectiveAllReduce (RING)" in output
    assert "64,285 words in 79 topics" in output  # the standard library's own help text
    assert "held-out masked-token accuracy" in output and "unigram baseline" in output
    assert_quoted_in(quoted_block("scenarios.md", "It first prints what it trains on:"), output)


@pytest.mark.multiprocess
def test_recommender_multiworker_smoke_reads_own_files(tmp_path):
    result, output = run(
        EXAMPLES / "recommender_multiworker.py", "--smoke", f"--data_dir={tmp_path}", launch=True
    )
    _ok(result, output)
    assert len(list(tmp_path.glob("*.tfrecord"))) == 8
    assert not list(tmp_path.glob("*.tmp-*"))
    w0 = "[w0] worker 0 of 2 reads 4 of 8 files: interactions-00000, interactions-00002, "
    w1 = "[w1] worker 1 of 2 reads 4 of 8 files: interactions-00001, interactions-00003, "
    assert w0 in output and w1 in output
    assert "MultiWorkerMirroredStrategy, 2 replicas on 2 workers" in output
    assert "recall@10" in output and "popularity baseline" in output
    assert_quoted_in(quoted_block("scenarios.md", "The log shows which files each worker"), output)
    quote = quoted_block("scenarios.md", "It ends with recall@10 on one held-out interaction")
    assert_quoted_in(quote, output, figures_vary=True)


def _help_texts():
    fv = flags.FlagValues()
    mk_flags.define_flags(fv)
    return {name: " ".join(fv[name].help.split()[:4]) for name in mk_flags.FLAG_NAMES}


@pytest.mark.multiprocess  # a fresh process per example, each importing TensorFlow
@pytest.mark.parametrize("example", SINGLE + MULTI)
def test_help_lists_the_mirrorkit_flags_with_help_text(example):
    result, output = run(EXAMPLES / example, "--help")
    assert result.returncode == 1, output[-3000:]  # absl exits 1 after printing --help
    assert "Traceback" not in output
    text = " ".join(result.stdout.split())
    for name, words in _help_texts().items():
        assert f"--{name}:" in text and words in text, name
    assert "--[no]smoke: Run a few steps only" in text


@pytest.mark.multiprocess  # a fresh process per example, each importing TensorFlow
@pytest.mark.parametrize("example", SINGLE + MULTI)
def test_a_wrong_flag_exits_non_zero_with_absls_message(example):
    result, output = run(EXAMPLES / example, "--no_such_flag=1")
    assert result.returncode != 0
    assert "FATAL Flags parsing error: Unknown command line flag 'no_such_flag'" in output


@pytest.mark.multiprocess
def test_a_contradictory_combination_stops_an_example_before_training():
    result, output = run(
        EXAMPLES / "resnet_global_batch.py",
        "--batch_size",
        "256",
        "--per_replica_batch_size",
        "32",
    )
    assert result.returncode != 0
    assert "--batch_size and --per_replica_batch_size both set the batch size" in output
    assert "replicas x" not in output  # main never ran
    assert_quoted_in(quoted_block("absl-flags.md", "The message names the flags:"), output)


def test_every_example_has_a_docstring_with_a_command():
    for example in SINGLE + MULTI:
        text = (EXAMPLES / example).read_text()
        assert text.startswith('"""'), example
        assert f"examples/{example}" in text.split('"""')[1], example
        assert "app.run(main)" in text and "--smoke" in text, example
