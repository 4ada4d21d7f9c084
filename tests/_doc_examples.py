"""The fenced ```python examples of the docs pages, the README and the docstrings.

`find` reads every ```python block of ``README.md``, ``docs/**/*.md`` and the
docstrings of ``mirrorkit/**/*.py``; `tests/test_doc_examples.py` runs them.
What an example needs is said where the example is, in one of three ways:

- ``# not run: <why>`` as its first line: deliberately not runnable (an AWS
  account, a GPU, a real cluster); it is counted, not run.
- ``# train.py -- run with: mirrorkit launch -n 2 train.py`` (or ``python
  train.py ...``) as its first line: a script, written to that file name in an
  empty folder and run with that command in its own processes, workers included.
  A block with ``if __name__ == "__main__":`` must have this line.
- ``<!-- example context: NAME -->`` on the line before the fence (a blank
  line may stand between): the example continues from context NAME
  (`CONTEXTS`: a tiny model and data), run first in the example's namespace
  (or, for a script, imported by it). The comment is not shown on the
  rendered page; the comment in `CONTEXTS` says what each context defines.

Every other example runs as it is, in the pytest process (4 logical CPUs, so
``mk.strategy(cpu_replicas=1, 2 or 4)`` works), in a fresh namespace, in an
empty current folder; its code is compiled under the name of its file with
its own line numbers, so a traceback names the page or module and the line.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_FENCE = re.compile(r"^(?P<indent>[ \t]*)```python[ \t]*$")
_CONTEXT = re.compile(r"^\s*<!--\s*example context:\s*(?P<name>[\w-]+)\s*-->\s*$")
_NOT_RUN = re.compile(r"^#\s*not run:\s*(?P<why>\S.*)$")
_RUN_WITH = re.compile(
    r"^#\s*(?P<file>[\w.-]+\.py)\s+--\s+run with:\s*(?P<command>(mirrorkit launch|python)\s.*)$"
)
_MAIN = re.compile(r"""^if __name__ == ["']__main__["']:""", re.M)

# What an example starts besides the pytest process: fresh TensorFlow
# interpreters, seconds of CPU each. Such examples are marked multiprocess (so slow).
STARTS_PROCESSES = (
    "mk.launch(",
    "run_job(",
    "run_function(",
    "check_equivalence(",
    "plan_memory(",
    "benchmark(",
)

_DATA = """
import keras
import numpy as np

import mirrorkit as mk


def make_model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


x = np.random.default_rng(0).normal(size=(256, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
x_test, y_test = x[:64], y[:64]
"""

#: Named contexts: code run before an example that says ``<!-- example context: NAME -->``.
CONTEXTS = {
    # make_model (a compiled Dense(1) on 4 features), x, y (256 rows), x_test, y_test (64 rows),
    # keras, np, mk: what a script or a model-building example starts from.
    "data": _DATA,
    # data, and strategy (2 CPU replicas), model = mk.build(make_model, strategy), and
    # data = train = mk.distribute((x, y), strategy, global_batch_size=64, seed=0).
    "fit": _DATA
    + """
strategy = mk.strategy(cpu_replicas=2)
model = mk.build(make_model, strategy)
data = train = mk.distribute((x, y), strategy, global_batch_size=64, seed=0)
""",
}


@dataclasses.dataclass(frozen=True)
class Example:
    """One fenced ```python block, where it is and how it runs."""

    path: str  # relative to the repository root
    line: int  # the first line of code, 1-based, in the file
    code: str  # dedented
    context: str | None = None
    not_run: str | None = None  # the reason, when marked not runnable
    script: str | None = None  # the file name, when a script
    command: str | None = None  # how a script runs
    problem: str | None = None  # a malformed marker: what is wrong and what to do

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def starts_processes(self) -> bool:
        return self.script is not None or any(name in self.code for name in STARTS_PROCESSES)


def _blocks(text: str) -> list[tuple[int, str, str | None]]:
    """(first code line 0-based, dedented code, context) for each ```python block of `text`."""
    lines = text.splitlines()
    found = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        indent = len(match.group("indent"))
        j = i - 1
        if j >= 0 and not lines[j].strip():  # one blank line may stand between
            j -= 1
        context = _CONTEXT.match(lines[j]) if j >= 0 else None
        start = i + 1
        i = start
        while i < len(lines) and lines[i].strip() != "```":
            i += 1
        body = [
            line[indent:] if not line[:indent].strip() else line.lstrip() for line in lines[start:i]
        ]
        found.append((start, textwrap.dedent("\n".join(body)) + "\n", context and context["name"]))
        i += 1
    return found


def _example(path: str, line: int, code: str, context: str | None) -> Example:
    first = code.lstrip("\n").split("\n", 1)[0].strip()
    where = f"{path}:{line}"
    if context is not None and context not in CONTEXTS:
        return Example(
            path,
            line,
            code,
            problem=(
                f"{where}: unknown example context {context!r}; the contexts are "
                f"{sorted(CONTEXTS)} (tests/_doc_examples.py CONTEXTS): name one or add it there"
            ),
        )
    not_run = _NOT_RUN.match(first)
    if not_run:
        return Example(path, line, code, context, not_run=not_run["why"])
    run_with = _RUN_WITH.match(first)
    if run_with:
        return Example(
            path, line, code, context, script=run_with["file"], command=run_with["command"]
        )
    if _MAIN.search(code):
        return Example(
            path,
            line,
            code,
            context,
            problem=(
                f'{where}: a script example (it has `if __name__ == "__main__":`) needs a first '
                "line saying how it runs, e.g. `# train.py -- run with: python train.py`, or "
                "`# not run: <why>`"
            ),
        )
    return Example(path, line, code, context)


def _docstrings(source: str) -> list[tuple[int, str]]:
    """(line of the docstring's first character 1-based, raw docstring) of a module's docstrings."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                value = body[0].value.value
                if isinstance(value, str):
                    found.append((body[0].value.lineno, value))
    return found


def documents(root: Path = ROOT) -> list[Path]:
    """README.md, docs/**/*.md and mirrorkit/**/*.py, in a stable order."""
    paths = [root / "README.md"]
    paths += sorted((root / "docs").rglob("*.md"))
    paths += sorted((root / "mirrorkit").rglob("*.py"))
    return [p for p in paths if p.is_file()]


def find(root: Path = ROOT) -> list[Example]:
    """Every ```python example of the documentation, in file order."""
    examples = []
    for path in documents(root):
        rel = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".md":
            for start, code, context in _blocks(text):
                examples.append(_example(rel, start + 1, code, context))
            continue
        if "```python" not in text:
            continue
        for lineno, doc in _docstrings(text):
            # The docstring's text starts on the line of its opening quotes; an escape such
            # as \n inside would shift lines, so the lines are counted in the source.
            for start, code, context in _blocks(doc):
                examples.append(_example(rel, lineno + start, code, context))
    return examples


def _padded(example: Example) -> str:
    """The code preceded by blank lines, so that its line numbers are the file's."""
    return "\n" * (example.line - 1) + example.code


def run_here(example: Example, root: Path = ROOT) -> dict:
    """Runs an example in this process, in a fresh namespace; returns the namespace."""
    namespace: dict = {"__name__": "__doc_example__"}
    if example.context:
        exec(compile(CONTEXTS[example.context], f"<context {example.context}>", "exec"), namespace)
    exec(compile(_padded(example), str(root / example.path), "exec"), namespace)
    return namespace


def run_script(example: Example, folder: Path, timeout_s: float = 420) -> str:
    """Writes the script into `folder`, runs its command there; returns the output.

    Raises:
        AssertionError: the command failed; the message names the example and
            has the end of the output.
    """
    head = ""
    if example.context:
        (folder / "_example_context.py").write_text(CONTEXTS[example.context])
        head = "from _example_context import *  # noqa: F403\n"
    (folder / example.script).write_text(head + example.code)
    words = example.command.split()
    if words[0] == "python":
        argv = [sys.executable, *words[1:]]
    else:  # mirrorkit launch ...
        argv = [sys.executable, "-m", "mirrorkit", *words[1:]]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    result = subprocess.run(
        argv, cwd=folder, capture_output=True, text=True, timeout=timeout_s, env=env
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, (
        f"{example.id}: `{example.command}` exited {result.returncode}:\n{output[-6000:]}"
    )
    return output


def summary(stats: dict) -> str | None:
    """The closing line: how many examples ran, failed, are marked not runnable, were left out.

    `stats` is pytest's terminal reporter's: reports by outcome. Each test of
    `tests/test_doc_examples.py` records the places (file:line) its example is
    shown at, so an example shown twice and run once counts twice. None when no
    example test ran in this session.
    """
    outcome: dict[str, str] = {}
    for reports in stats.values():
        for report in reports:
            if "test_doc_examples.py::test_example[" not in getattr(report, "nodeid", ""):
                continue
            places = dict(getattr(report, "user_properties", ())).get("places", ())
            for place in places:
                if report.failed:
                    outcome[place] = "failed"
                elif report.skipped:
                    outcome.setdefault(place, "not run")
                elif report.when == "call":
                    outcome.setdefault(place, "passed")
    if not outcome:
        return None
    found = len(find())
    counts = {
        name: sum(1 for o in outcome.values() if o == name)
        for name in ("passed", "failed", "not run")
    }
    ran = counts["passed"] + counts["failed"]
    left = found - len(outcome)
    return (
        f"documentation examples: {found} found in README.md, docs/ and docstrings; "
        f"{ran} ran ({counts['passed']} passed, {counts['failed']} failed), "
        f"{counts['not run']} marked not runnable"
        + (f", {left} left out of this session (deselected or not selected)" if left else "")
    )
