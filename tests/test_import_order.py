"""Which patches are in place does not depend on what was imported first.

Each order runs in its own process (a Python process imports a module once): the public
names of mirrorkit touched forwards or backwards, with the strategy made first or last, by
``mk.strategy()`` or by hand with ``mk.compat.enable``, and Keras's companion libraries
(KerasTuner, keras-hub, keras-rs, those installed) imported before or after. Every order
must give the same ``mk.compat.describe()``.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap

import pytest

import mirrorkit

#: Keras's companion libraries mirrorkit repairs or supports, where installed.
COMPANIONS = [
    name for name in ("keras_tuner", "keras_hub", "keras_rs") if importlib.util.find_spec(name)
]

#: (the public names in which order, the strategy first or last and made how, companions when)
ORDERS = {
    "a strategy by hand + compat.enable, no other name of mirrorkit": (
        "none",
        "first",
        "by hand",
        "last",
    ),
    "names forwards, mk.strategy() last, companions first": ("forwards", "last", "mk", "first"),
    "mk.strategy() first, names backwards, companions last": ("backwards", "first", "mk", "last"),
    "a strategy by hand + compat.enable first, names forwards, companions last": (
        "forwards",
        "first",
        "by hand",
        "last",
    ),
    "companions first, a strategy by hand + compat.enable last, names backwards": (
        "backwards",
        "last",
        "by hand",
        "first",
    ),
}


def _script(names: str, strategy_at: str, made_by: str, companions_at: str) -> str:
    public = sorted(mirrorkit.__all__) if names != "none" else []
    if names == "backwards":
        public.reverse()
    make = (
        "strategy = mk.strategy(cpu_replicas=2)"
        if made_by == "mk"
        else "import tensorflow as tf\n"
        "tf.config.set_logical_device_configuration(\n"
        "    tf.config.list_physical_devices('CPU')[0],\n"
        "    [tf.config.LogicalDeviceConfiguration()] * 2)\n"
        "strategy = tf.distribute.MirroredStrategy(['/cpu:0', '/cpu:1'])\n"
        "mk.compat.enable(strategy)"
    )
    steps = [f"getattr(mk, {name!r})" for name in public]
    imports = [f"import {name}" for name in COMPANIONS]
    steps = [make, *steps] if strategy_at == "first" else [*steps, make]
    steps = [*imports, *steps] if companions_at == "first" else [*steps, *imports]
    body = "\n".join(steps)
    return (
        "import json\nimport mirrorkit as mk\n"
        f"{body}\n"
        "print('DESCRIBE ' + json.dumps([(p['name'], p['target']) for p in "
        "mk.compat.describe()]))\n"
    )


@pytest.mark.multiprocess  # a fresh process per order
def test_every_import_order_gives_the_same_patches():
    described = {}
    for label, order in ORDERS.items():
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(_script(*order))],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, (label, done.stderr[-3000:])
        (line,) = [line for line in done.stdout.splitlines() if line.startswith("DESCRIBE ")]
        described[label] = sorted(map(tuple, json.loads(line.removeprefix("DESCRIBE "))))
    first, *others = described.values()
    assert ("optimizer_step" in {name for name, _ in first}) and len(first) > 30, first
    for label, patches in described.items():
        assert patches == first, (
            label,
            sorted(set(patches) - set(first)),
            sorted(set(first) - set(patches)),
        )
    if "keras_tuner" in COMPANIONS:  # a multi-worker strategy would add them; 2 replicas do not
        assert not any(name.startswith("keras_tuner") for name, _ in first)
    if "keras_hub" in COMPANIONS:
        assert "keras_hub_inputs" in {name for name, _ in first}, first
