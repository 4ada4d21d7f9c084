"""`mirrorkit bench --compare-raw` on worker sweeps: the raw tutorial-style job beside mirrorkit."""

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.multiprocess
def test_compare_raw_reports_both_efficiencies_and_raw_workers_unpinned(tmp_path):
    command = [
        sys.executable, "-m", "mirrorkit", "bench", "--model", "mlp", "--replicas", "1",
        "--workers", "1,2", "--steps", "3", "--repeats", "1", "--compare-raw",
        "--out", str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "bench-mlp.json").read_text())
    summary = results["compare_raw_workers"]
    assert summary["workers"] == 2
    assert summary["mirrorkit_efficiency"] > 0 and summary["raw_efficiency"] > 0
    assert "mirrorkit.compat.enable()" in summary["raw_how"]
    assert "weak-scaling efficiency: mirrorkit launch" in done.stdout
    rows = {(r["launcher"], r["workers"]): r for r in results["results"]}
    assert {("raw", 1), ("raw", 2), ("mirrorkit", 1), ("mirrorkit", 2)} <= set(rows)
    raw = rows[("raw", 2)]
    # The raw workers kept every CPU of this process and TensorFlow's default threads,
    # and got none of the launcher's settings; mirrorkit's workers were pinned.
    assert raw["affinity"] == sorted(os.sched_getaffinity(0))
    assert raw["intra_op_threads"] == 0 and raw["env"] == {}
    assert raw["pinned"] is False
    assert rows[("mirrorkit", 2)]["pinned"] is True
    assert raw["scaling_efficiency"] == summary["raw_efficiency"]
