"""The public names: a regroup of mirrorkit/ moves modules, never what users import.

The lists are the contract itself (what README, docs and user code import), so
they are written out: a name added or removed here is a deliberate API change
with its CHANGELOG line.
"""

import importlib
import subprocess
import sys

import mirrorkit as mk

PUBLIC = [
    "EquivalenceReport",
    "PreemptionCheckpoint",
    "ThroughputCallback",
    "ThroughputReport",
    "Topology",
    "WarmUp",
    "all_gather",
    "all_gather_offset",
    "benchmark",
    "build",
    "callbacks",
    "check_equivalence",
    "compat",
    "describe",
    "distribute",
    "flags",
    "is_chief",
    "launch",
    "plan_memory",
    "print",
    "resumable",
    "scale_learning_rate",
    "strategy",
    "synchronize_batch_norm",
    "unscale_loss",
]
FLAGS = [
    "ALL_REDUCE_ALGS",
    "FLAG_NAMES",
    "KINDS",
    "MIXED_PRECISION",
    "apply_cluster_flags",
    "batch_size_kwargs",
    "build_from_flags",
    "callbacks_from_flags",
    "cluster_conflict",
    "combination_problem",
    "define_flags",
    "distribute_from_flags",
    "set_num_packs",
    "strategy_from_flags",
]
CALLBACKS = [
    "HangWatchdog",
    "NaNGuard",
    "NonFiniteError",
    "ReplicaSyncCheck",
    "ReplicasDivergedError",
]
COMPAT = ["active", "disable", "enable", "prepare_model"]


def test_mk_exports_exactly_the_public_names():
    assert sorted(mk.__all__) == sorted(PUBLIC + ["__version__"])


def test_every_public_name_loads():
    for name in PUBLIC:
        assert getattr(mk, name) is not None, name


def test_flags_callbacks_and_compat_keep_their_names():
    flags = importlib.import_module("mirrorkit.flags")
    public_flags = sorted(
        n for n in dir(flags) if not n.startswith("_") and not _is_submodule(flags, n)
    )
    assert public_flags == FLAGS
    assert sorted(mk.callbacks.__all__) == CALLBACKS
    for name in COMPAT:
        assert callable(getattr(mk.compat, name)), name


def test_the_command_entry_points_load():
    # `mirrorkit` (pyproject's [project.scripts]) and `python -m mirrorkit` both reach the CLI.
    done = subprocess.run(
        [sys.executable, "-m", "mirrorkit", "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    for command in ("info", "launch", "bench", "demo", "plan"):
        assert command in done.stdout


def test_the_console_script_target_exists():
    import re
    from pathlib import Path

    # pyproject's [project.scripts] line, read without tomllib (Python 3.11+; we support 3.10)
    pyproject = (Path(__file__).parent.parent / "pyproject.toml").read_text()
    target = re.search(r'^mirrorkit = "([\w.]+:\w+)"$', pyproject, re.MULTILINE).group(1)
    module, _, function = target.partition(":")
    assert callable(getattr(importlib.import_module(module), function))


def _is_submodule(package, name):
    value = getattr(package, name)
    return getattr(value, "__name__", "").startswith(package.__name__ + ".")
