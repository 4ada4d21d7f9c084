"""mirrorkit.patching.post_import: a function runs once its modules are imported, in any order.

Each test imports small modules the test writes (no TensorFlow), in a fresh interpreter so
that ``sys.meta_path`` and ``sys.modules`` start clean.
"""

import subprocess
import sys
import textwrap

import pytest

MODULES = {
    # "inner" is imported inside "outer"'s import, as Keras is inside TensorFlow's.
    "outer.py": "import inner\nLOADED = True\n",
    "inner.py": "LOADED = True\n",
    "recorder.py": textwrap.dedent(
        """
        import sys
        CALLS = []

        def record():
            CALLS.append(
                sorted(m for m in ("outer", "inner") if getattr(sys.modules.get(m), "LOADED", 0))
            )

        def fail():
            raise RuntimeError("the waiting function broke")
        """
    ),
}


def _run(tmp_path, program: str) -> subprocess.CompletedProcess:
    for name, text in MODULES.items():
        (tmp_path / name).write_text(text)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(program)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={"PYTHONPATH": f"{tmp_path}:{sys.path[0] or '.'}", "PATH": ""},
    )


@pytest.mark.parametrize(
    "before, after",
    [
        ("", "import outer"),  # the hook first, then the imports
        ("import outer", ""),  # the modules first: the function runs at once
        ("import inner", "import outer"),  # one of the two first
    ],
)
def test_the_function_runs_once_after_both_modules_complete(tmp_path, before, after):
    done = _run(
        tmp_path,
        f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        {before}
        from mirrorkit.patching import post_import
        post_import.when_imported(("inner", "outer"), "recorder:record")
        {after}
        import recorder
        import outer, inner
        print(recorder.CALLS)
        """,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[['inner', 'outer']]"


def test_a_failing_function_is_logged_and_the_import_still_succeeds(tmp_path):
    done = _run(
        tmp_path,
        f"""
        import logging, sys
        sys.path.insert(0, {str(tmp_path)!r})
        logging.basicConfig()
        from mirrorkit.patching import post_import
        post_import.when_imported(("outer",), "recorder:fail")
        import outer
        print("imported", outer.LOADED, outer.__spec__.loader.__class__.__name__)
        """,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "imported True SourceFileLoader"
    assert done.stderr == (
        "mirrorkit: recorder:fail failed after an import (RuntimeError: the waiting function "
        "broke); it is not in place. Report this with `mirrorkit info`'s output.\n"
    )


def test_a_repair_waits_for_its_package_and_a_disable_cancels_the_wait(tmp_path):
    """`compat.apply_when_imported`: a repair of a package imported later goes in place then."""
    for package in ("toypkg", "toypkg2"):
        (tmp_path / f"{package}.py").write_text(
            "class Tuner:\n    def search(self):\n        return 'x'\n"
        )
    done = _run(
        tmp_path,
        f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        import mirrorkit as mk
        from mirrorkit.patching.repair import Repair

        def repaired(original):
            return lambda self: original(self) + " repaired"

        def toy(package):
            return Repair(name=f"toy_{{package}}", upstream="a toy", module=package,
                          target="Tuner.search", replacement=repaired,
                          applies_to=lambda strategy: True,
                          needed=lambda: package in sys.modules)

        first, second = toy("toypkg"), toy("toypkg2")
        mk.compat.apply_when_imported(first)
        mk.compat.apply_when_imported(second)
        print(first.active, second.active)
        import toypkg
        print(first.active, toypkg.Tuner().search())
        mk.compat.disable()  # the second waits no more
        import toypkg2
        print(second.active, toypkg2.Tuner().search(), toypkg.Tuner().search())
        """,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["False False", "True x repaired", "False x x"]
    assert "mirrorkit: toypkg imported: toy_toypkg now in place\n" in done.stderr
