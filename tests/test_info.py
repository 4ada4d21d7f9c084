"""`mirrorkit info` says whether the installed TensorFlow/Keras pair is inside the tested range."""

import json
import os

import pytest
from _quoted import assert_quoted_in, quoted_block

from mirrorkit import versions
from mirrorkit.commands import info


def test_info_text_and_json_say_inside_the_tested_range(mirrorkit_command, capsys):
    # `mirrorkit info --json` in this process; tests/test_fresh_process.py runs it as a command.
    code = mirrorkit_command("info", "--json")
    out, err = capsys.readouterr()
    assert code == 0, err
    facts = json.loads(out)
    tested = facts["tested_range"]
    assert tested["inside"] is True or tested["next"] is True  # the next leg: the nightlies
    assert tested["range"] == versions.tested_range()
    assert tested["describe"] == versions.installed().describe()
    line = [x for x in info.format_text(facts).splitlines() if x.startswith("tested range")]
    assert line and ("inside the tested range" in line[0] or "'next' leg" in line[0])


def test_info_text_says_outside_the_tested_range(monkeypatch):
    monkeypatch.setattr(versions, "installed", lambda: versions.Installed("2.16.1", "3.8.0"))
    facts = info.collect()
    assert facts["tested_range"]["inside"] is False
    (line,) = [x for x in info.format_text(facts).splitlines() if x.startswith("tested range")]
    assert "TensorFlow 2.16.1, Keras 3.8.0: OUTSIDE the tested range" in line
    assert versions.tested_range() in line


def test_info_says_what_the_versions_page_quotes_of_a_released_and_the_next_pair(monkeypatch):
    def tested_range_line(tensorflow, keras):
        monkeypatch.setattr(versions, "installed", lambda: versions.Installed(tensorflow, keras))
        return info.format_text(info.collect())

    released = quoted_block("versions.md", "says whether the installed pair is inside")
    assert_quoted_in(released, tested_range_line("2.21.0", "3.15.1"))
    released = quoted_block("compat.md", "says whether the installed TensorFlow and Keras are")
    assert_quoted_in(released, tested_range_line("2.21.0", "3.15.1"))
    following = quoted_block("versions.md", "`mirrorkit info` says so:")
    assert_quoted_in(following, tested_range_line("2.22.0-dev20260905", "3.16.0.dev2026102704"))


# What `mirrorkit info` says of a TF_CONFIG (it only reads it and plans: no strategy is made).


def test_info_explains_a_multi_worker_choice(mirrorkit_command, capsys, monkeypatch):
    tf_config = {
        "cluster": {"worker": ["127.0.0.1:5000", "127.0.0.1:5001"]},
        "task": {"type": "worker", "index": 1},
    }
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    code = mirrorkit_command("info")
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "MultiWorkerMirroredStrategy, because TF_CONFIG names 2 training tasks" in out
    assert "this is worker 1" in out


def test_info_gives_a_worker_task_its_rank_after_the_chief(mirrorkit_command, capsys, monkeypatch):
    tf_config = {
        "cluster": {"chief": ["a:2222"], "worker": ["b:2222", "c:2222"]},
        "task": {"type": "worker", "index": 0},
    }
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    code = mirrorkit_command("info")
    out, err = capsys.readouterr()
    assert code == 0, err
    assert_quoted_in(quoted_block("multi-worker.md", "`mirrorkit info` shows it on"), out)


def test_info_reports_a_malformed_tf_config(mirrorkit_command, capsys, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["nohost"]}}')
    code = mirrorkit_command("info")
    out, _ = capsys.readouterr()
    assert code == 1
    assert "cluster.worker[0]" in out


def test_info_without_a_gpu_prints_what_the_keras_code_page_quotes(
    mirrorkit_command, capsys, monkeypatch
):
    for name in [n for n in os.environ if n.startswith(("SLURM_", "TF_CONFIG"))]:
        monkeypatch.delenv(name)
    code = mirrorkit_command("info")
    out, err = capsys.readouterr()
    assert code == 0, err
    if "GPU:" in out:
        pytest.skip("docs/keras-code.md quotes `mirrorkit info` on a machine without a GPU")
    assert_quoted_in(quoted_block("keras-code.md", "On a machine without a GPU:"), out)
