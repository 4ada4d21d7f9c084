"""What only a new interpreter can show: import cost, device fixing, backends."""

import json
import os
import subprocess
import sys

import pytest
from _quoted import assert_quoted_in, quoted_block

from mirrorkit.launcher.processes import WorkerError

pytestmark = pytest.mark.multiprocess


def _import_then_replicas():
    import sys

    import mirrorkit as mk

    imported_tf = "tensorflow" in sys.modules
    return imported_tf, mk.strategy(cpu_replicas=3).num_replicas_in_sync


def test_import_is_cheap_and_leaves_devices_free(fresh):
    imported_tf, replicas = fresh(_import_then_replicas)
    assert imported_tf is False
    assert replicas == 3


def _replicas_after_tensorflow_started():
    import tensorflow as tf

    import mirrorkit as mk

    tf.constant(1.0) + 1  # initialises the devices: one logical CPU
    return mk.strategy(cpu_replicas=2)


def test_cpu_replicas_after_initialisation_says_what_to_do(fresh):
    with pytest.raises(WorkerError) as err:
        fresh(_replicas_after_tensorflow_started)
    assert "RuntimeError: cpu_replicas=2 was asked for" in err.value.worker_traceback
    quote = quoted_block("notebook.md", "Asked for CPU replicas too late")
    assert_quoted_in(quote, err.value.worker_traceback)
    assert "with 1 logical CPU device(s)" in err.value.worker_traceback
    assert "restart the kernel" in err.value.worker_traceback


def _strategy_twice():
    import mirrorkit as mk

    first = mk.strategy(cpu_replicas=2)
    return first is mk.strategy(cpu_replicas=2), mk.strategy(cpu_replicas=2).num_replicas_in_sync


def test_notebook_cell_run_twice(fresh):
    assert fresh(_strategy_twice) == (True, 2)


def _mirrorkit(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "mirrorkit", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})},
    )


def test_info_json_names_the_strategy():
    done = _mirrorkit("info", "--json", env={"TF_CONFIG": ""})
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    assert facts["versions"]["keras"].startswith("3.")
    assert facts["auto"]["strategy"] == "OneDeviceStrategy"
    assert "no GPU" in facts["auto"]["reason"] or "GPU" in facts["auto"]["reason"]


# What info says of a TF_CONFIG (a multi-worker choice, a malformed one) is checked in the
# pytest process by tests/test_info.py: info only reads TF_CONFIG and plans.


def _flag_rules_import_no_tensorflow():
    import sys

    from absl import flags

    from mirrorkit.flags import checks, definitions

    definitions.define_flags(flags.FlagValues())
    checks.combination_problem  # noqa: B018 - imported, with the strategy rules it reads
    return sorted(name for name in ("tensorflow", "keras") if name in sys.modules)


def test_the_flags_strategy_rules_import_no_tensorflow(fresh):
    """absl parses and checks the flags before main: no TensorFlow may start there."""
    assert fresh(_flag_rules_import_no_tensorflow) == []
