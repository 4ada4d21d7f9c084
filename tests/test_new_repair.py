"""A new repair of Keras is three files: its module, its canary test and its account.

In a copy of the project, a toy repair is added as a maintainer adds one (a module of
``mirrorkit/compat``, a test marked ``upstream`` that takes it off and shows Keras's behaviour,
a ``###`` section of docs/compat.md), and nothing else is touched: the catalogue finds it,
``mk.compat.enable`` applies it, the Keras repairs page's tables (made from the repairs) list
it, and the checks on repairs, the architecture and the layers pass with it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

TOY_MODULE = '''\
"""A toy repair (tests/test_new_repair.py): Keras's snake case, unchanged but wrapped."""

from __future__ import annotations

from mirrorkit.cluster.workers import every_strategy
from mirrorkit.patching.repair import Repair


def _replacement(original):
    def to_snake_case(name):
        return original(name)

    to_snake_case.__wrapped__ = original
    return to_snake_case


REPAIR = Repair(
    name="toy_snake_case",
    upstream="a toy for tests/test_new_repair.py",
    module="keras.src.utils.naming",
    target="to_snake_case",
    replacement=_replacement,
    applies_to=every_strategy,
    account="a-toy-repair",
    tests=("tests/test_toy_repair.py::test_toy_snake_case_upstream",),
)
'''

TOY_CANARY = """\
import pytest
from keras.src.utils import naming

from mirrorkit.compat import toy_snake_case


@pytest.mark.upstream
def test_toy_snake_case_upstream():
    toy_snake_case.REPAIR.apply()
    toy_snake_case.REPAIR.remove()
    assert not hasattr(naming.to_snake_case, "__wrapped__")  # Keras's own, once it is off
    assert naming.to_snake_case("AToy") == "a_toy"
"""

TOY_ACCOUNT = """
### A toy repair

Added by `tests/test_new_repair.py` in a copy of the project: Keras's `to_snake_case`, wrapped.
"""


def _copy_of_the_project(into: Path) -> Path:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for name in listed:
        source = ROOT / name
        if source.is_file() and not name.startswith(("notebooks/", "examples/", "benchmarks/")):
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into


@pytest.mark.slow  # a copy of the project, and its checks on repairs there
def test_a_new_repair_is_its_module_its_canary_and_its_account(tmp_path):
    copy = _copy_of_the_project(tmp_path / "project")
    (copy / "mirrorkit/compat/toy_snake_case.py").write_text(TOY_MODULE)
    (copy / "tests/test_toy_repair.py").write_text(TOY_CANARY)
    page = copy / "docs/compat.md"
    failures = page.read_text().index("\n## Failures and their repairs")
    end = page.read_text().index("\n## ", failures + 5)
    text = page.read_text()
    page.write_text(text[:end] + TOY_ACCOUNT + text[end:])

    made = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SHOW)],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr[-3000:]
    assert made.stdout.splitlines() == [
        "enabled: True",
        "every strategy: True",
        "at a glance: [A toy repair](#a-toy-repair) | `toy_snake_case`",
        "target: `keras.src.utils.naming.to_snake_case` | `toy_snake_case`",
        "development: `toy_snake_case` | [A toy repair](compat.md#a-toy-repair)",
    ], made.stdout

    checks = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            "0",
            "-m",
            "upstream or not upstream",
            "tests/test_toy_repair.py",
            "tests/test_repair_accounts.py",
            "tests/test_architecture.py",
            "tests/test_layers.py",
            "tests/test_compat.py::test_enable_is_idempotent_and_disable_restores",
            "tests/test_compat.py::test_strategy_applies_what_the_repairs_page_says",
        ],  # fmt: skip
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert checks.returncode == 0, checks.stdout[-4000:]
    assert "toy_snake_case" in (copy / "mirrorkit/compat/toy_snake_case.py").read_text()


#: What the copy's mirrorkit and docs/repair_tables.py make of the toy repair.
SHOW = """
import importlib.util
import mirrorkit as mk

names = mk.compat.enable()
print("enabled:", "toy_snake_case" in names)
spec = importlib.util.spec_from_file_location("tables", "docs/repair_tables.py")
hooks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hooks)
row = next(r for r in hooks.strategies_table().splitlines() if r.startswith("| every strategy |"))
print("every strategy:", "`toy_snake_case`" in row)
for label, table in (("at a glance", hooks.glance_table()), ("target", hooks.targets_table()),
                     ("development", hooks.repairs_table())):
    (line,) = [r for r in table.splitlines() if "toy_snake_case" in r]
    print(label + ":", " | ".join(line.strip("| ").split(" | ")[:2]))
"""
