"""Every fenced ```python example of the docs pages, the README and the docstrings runs.

One test per example, its id the file and line of its first line of code
(``README.md:166``, ``mirrorkit/scale/lr.py:65``); `tests/_doc_examples.py`
finds them and says how an example tells what it needs (a context, a script
command with workers, ``# not run: <why>``). At the end of the run pytest
prints how many examples ran and how many are marked not runnable
(``tests/conftest.py``, ``pytest_terminal_summary``).

Why a collector of our own rather than a plugin: Sybil, pytest-markdown-docs
and pytest-codeblocks each run examples only in the pytest process and only
from the paths pytest is given (here ``testpaths = ["tests"]``, so README.md,
docs/ and mirrorkit/ would need their own invocation), with no notion of an
example that needs two workers under ``mirrorkit launch``; Sybil shares one
namespace per document (an example would pass only after the one above it);
phmdoctest generates test files and was last released in 2022. Ours is about
200 lines and runs what it finds: single-process examples in this process
(no fresh interpreter, which costs seconds of CPU each), the ones that start
workers or are scripts in their own processes, marked multiprocess (so slow).
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _doc_examples import CONTEXTS, ROOT, Example, find, run_here, run_script
from _quoted import Quote, assert_quoted_in, quoted_block

EXAMPLES = find()


def _distinct(examples: list[Example]) -> dict[Example, list[str]]:
    """Each distinct example (the same code and context run once) with all its places."""
    places: dict[Example, list[str]] = {}
    for example in examples:
        key = (example.code, example.context, example.script, example.command)
        for known in places:
            if (known.code, known.context, known.script, known.command) == key:
                places[known].append(example.id)
                break
        else:
            places[example] = [example.id]
    return places


DISTINCT = _distinct(EXAMPLES)

#: What a script example printed and the folder it ran in, by file:line, for the checks of
#: what its page says about it (they run it themselves when run alone).
_SCRIPT_RUNS: dict[str, tuple[str, Path]] = {}
#: What an example run in this process printed, by file:line, likewise.
_PRINTED: dict[str, str] = {}


#: An example that imports this optional extra skips without it, and is slow with it (importing
#: keras-hub costs seconds of CPU in the pytest process).
_KERAS_HUB = re.compile(r"^import keras_hub$", re.MULTILINE)
_KERAS_TUNER = re.compile(r"^import keras_tuner$", re.MULTILINE)


def _marks(example: Example) -> list:
    marks = [pytest.mark.multiprocess] if example.starts_processes and not example.not_run else []
    if _KERAS_HUB.search(example.code):
        marks.append(pytest.mark.slow)
    return marks


def _param(example: Example, ids: list[str]):
    return pytest.param(example, ids, id=example.id, marks=_marks(example))


@pytest.mark.parametrize(("example", "places"), [_param(e, p) for e, p in DISTINCT.items()])
def test_example(
    example: Example, places: list[str], tmp_path, monkeypatch, record_property, capfd
):
    """Runs the example; ``places`` are every file:line where the same code is shown."""
    record_property("places", places)  # counted by the closing summary (tests/conftest.py)
    if example.problem:
        pytest.fail(example.problem, pytrace=False)
    if example.not_run:
        compile(example.code, example.id, "exec")  # still valid Python
        pytest.skip(f"not run: {example.not_run}")
    if _KERAS_HUB.search(example.code):
        pytest.importorskip("keras_hub", reason="the hub extra: pip install -e '.[hub]'")
    if _KERAS_TUNER.search(example.code):
        pytest.importorskip("keras_tuner", reason="the tuner extra: pip install -e '.[tuner]'")
    if example.script:
        output = run_script(example, tmp_path)
        for place in places:
            _SCRIPT_RUNS[place] = (output, tmp_path)
        return
    from mirrorkit.feeding import fit_epoch

    listeners = list(fit_epoch._LISTENERS)
    monkeypatch.chdir(tmp_path)
    try:
        run_here(example)
    finally:
        fit_epoch._LISTENERS[:] = listeners
    printed = capfd.readouterr()  # capfd, not capsys: HangWatchdog's faulthandler needs a fileno
    print(printed.out, end="")
    for place in places:
        _PRINTED[place] = printed.out


def test_the_collector_finds_examples_in_pages_readme_and_docstrings():
    files = {example.path for example in EXAMPLES}
    assert "README.md" in files
    assert any(f.startswith("docs/") for f in files)
    assert any(f.startswith("mirrorkit/") for f in files)
    assert len(EXAMPLES) >= 60, len(EXAMPLES)


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def test_lines_markers_and_contexts_are_read_where_they_are(tmp_path):
    _write(
        tmp_path,
        "README.md",
        """\
        # Title

        ```python
        print("one")
        ```

        <!-- example context: fit -->
        ```python
        model.fit(data)
        ```

        - a list item:
          ```python
          # not run: needs an AWS account
          estimator.fit()
          ```
        """,
    )
    _write(
        tmp_path,
        "mirrorkit/mod.py",
        '''\
        """Module.

        Example:
        ```python
        # train.py -- run with: mirrorkit launch -n 2 train.py
        import mirrorkit as mk
        ```
        """


        def f():
            """F.

            Example:
            ```python
            x = 1
            ```
            """
        ''',
    )
    found = [(e.id, e.context, e.not_run, e.script, e.command) for e in find(tmp_path)]
    assert found == [
        ("README.md:4", None, None, None, None),
        ("README.md:9", "fit", None, None, None),
        ("README.md:14", None, "needs an AWS account", None, None),
        ("mirrorkit/mod.py:5", None, None, "train.py", "mirrorkit launch -n 2 train.py"),
        ("mirrorkit/mod.py:16", None, None, None, None),
    ]
    assert find(tmp_path)[-1].code == "x = 1\n"


def test_a_broken_example_fails_naming_its_file_and_line(tmp_path):
    _write(tmp_path, "docs/page.md", "Text.\n\n```python\nx = 1\nassert x == 2\n```\n")
    (example,) = find(tmp_path)
    with pytest.raises(AssertionError) as raised:
        run_here(example, root=tmp_path)
    frames = [(str(frame.path), frame.lineno + 1) for frame in raised.traceback]
    assert (str(tmp_path / "docs/page.md"), 5) in frames


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            "<!-- example context: nope -->\n```python\nx\n```\n",
            "README.md:3: unknown example context 'nope'",
        ),
        ('```python\nif __name__ == "__main__":\n    pass\n```\n', "README.md:2: a script"),
    ],
)
def test_a_malformed_marker_is_a_clear_error(tmp_path, text, says):
    _write(tmp_path, "README.md", text)
    (example,) = find(tmp_path)
    assert example.problem.startswith(says), example.problem


def test_every_context_runs_and_defines_what_it_says():
    for name, names in [
        ("data", {"make_model", "x", "y", "x_test", "y_test"}),
        ("fit", {"strategy", "model", "data", "train"}),
    ]:
        namespace: dict = {}
        exec(CONTEXTS[name], namespace)
        assert names <= namespace.keys(), name


def _script_run(path: str, tmp_path: Path) -> tuple[str, Path]:
    """The output and folder of the script example on page `path`: this session's run, or one."""
    (example,) = [e for e in EXAMPLES if e.path == path and e.script]
    if example.id not in _SCRIPT_RUNS:
        _SCRIPT_RUNS[example.id] = (run_script(example, tmp_path), tmp_path)
    return _SCRIPT_RUNS[example.id]


@pytest.mark.multiprocess  # its example's 2-worker run (shared with test_example when both run)
def test_the_keras_multi_worker_page_says_what_its_example_does(tmp_path):
    page = " ".join((ROOT / "docs/keras-multi-worker.md").read_text().split())
    output, folder = _script_run("docs/keras-multi-worker.md", tmp_path)
    claimed = re.search(r"`(mirrorkit: Keras [\d.]+ repaired for tf.distribute; [^`]*)`", page)
    assert claimed and claimed[1] in output, "the repairs line, in the page or the run's output"
    rows = re.search(r"`log\.csv` with a header and (\d+) rows", page)
    epochs = re.search(r"(\d+) `Epoch` lines", page)
    written = (folder / "log.csv").read_text().splitlines()
    assert len(written) == 1 + int(rows[1]), written
    assert output.count("Epoch ") == int(epochs[1]), output[-3000:]


def test_the_guards_page_says_what_its_example_prints(tmp_path, monkeypatch, capfd):
    page = " ".join((ROOT / "docs/guards.md").read_text().split())
    (example,) = [e for e in EXAMPLES if e.path == "docs/guards.md"]
    if example.id not in _PRINTED:
        monkeypatch.chdir(tmp_path)
        run_here(example)
        _PRINTED[example.id] = capfd.readouterr().out
    claimed = re.search(r"prints `([^`]+)` and `([^`]+)`", page)
    assert claimed, "docs/guards.md says what its example prints: prints `...` and `...`"
    printed = _PRINTED[example.id].splitlines()
    for line in claimed.groups():
        assert line in printed, f"docs/guards.md says its example prints {line!r}: {printed}"


def _printed_by(path: str, code: str, tmp_path, monkeypatch, capfd) -> str:
    """What page `path`'s example holding `code` printed: test_example's run, or one here."""
    (example,) = [e for e in EXAMPLES if e.path == path and code in e.code]
    if example.id not in _PRINTED:
        monkeypatch.chdir(tmp_path)
        capfd.readouterr()
        run_here(example)
        _PRINTED[example.id] = capfd.readouterr().out
    return _PRINTED[example.id]


def test_the_throughput_page_quotes_what_its_examples_print(tmp_path, monkeypatch, capfd):
    """The page keeps one run's figures; the lines are compared as `figures_vary` says. Which
    verdict an epoch gets (compute-, dispatch- or communication-bound) follows the machine's
    load in these examples, where nothing is planted: the verdict lines are left out here
    (the tests that plant each verdict compare theirs, on the same page)."""
    page = "docs/throughput.md"
    first = _printed_by(page, "rng.normal(size=(8192, 64))", tmp_path, monkeypatch, capfd)
    wide = _printed_by(page, "# 12.6M weights", tmp_path, monkeypatch, capfd)
    for quote, printed in [
        (quoted_block("throughput.md", "The chief prints one line per epoch"), first),
        (quoted_block("throughput.md", "and a verdict summary under it:"), first),
        (quoted_block("throughput.md", "It prints:"), wide),
    ]:
        lines = [line for line in quote.lines if "-bound" not in line]
        assert_quoted_in(Quote(lines, quote.where), printed, figures_vary=True)


@pytest.mark.multiprocess  # a fresh process: no optional package an earlier test imported
def test_the_repairs_page_says_what_its_turn_off_example_prints():
    page = (ROOT / "docs/compat.md").read_text()
    section = page[page.index("## Turn the repairs off") :]
    code = re.search(r"```python\n(.*?)```", section, re.S)[1]
    quote = quoted_block("compat.md", "It prints no repair after `disable()`")
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == quote.lines, (
        f"{quote.where}, 'Turn the repairs off', quotes {quote.lines!r}; the example prints "
        f"{done.stdout!r}"
    )


#: Before a fenced block on a docs page: the block is what the python example above it prints.
_QUOTED = re.compile(r"^<!-- printed by the example above -->\s*$")


def _quoted_outputs() -> list[tuple[Example, str, int]]:
    """(example, quoted text, its line) for each block marked as an example's printed output."""
    found = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        path = str(page.relative_to(ROOT))
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if not _QUOTED.match(line):
                continue
            start = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            end = next(j for j in range(start + 1, len(lines)) if lines[j].startswith("```"))
            above = [e for e in EXAMPLES if e.path == path and e.line < i + 1]
            assert above, f"{path}:{i + 1}: no python example above the marked output"
            example = max(above, key=lambda e: e.line)
            found.append((example, "\n".join(lines[start + 1 : end]), i + 1))
    return found


QUOTED = _quoted_outputs()


@pytest.mark.parametrize(
    ("example", "quoted", "line"),
    [pytest.param(e, q, n, id=f"{e.path}:{n}", marks=_marks(e)) for e, q, n in QUOTED],
)
def test_a_quoted_output_is_what_its_example_prints(
    example, quoted, line, tmp_path, monkeypatch, capfd
):
    """Every line of the quoted block, but a `...`, is a line the example printed (or said).

    A `...` inside a quoted line stands for any text: a figure that varies from run to run,
    or the rest of a long line.
    """
    if _KERAS_TUNER.search(example.code):
        pytest.importorskip("keras_tuner", reason="the tuner extra: pip install -e '.[tuner]'")
    if example.script:  # its run by test_example, when this session had one
        if example.id not in _SCRIPT_RUNS:
            _SCRIPT_RUNS[example.id] = (run_script(example, tmp_path), tmp_path)
        output = _SCRIPT_RUNS[example.id][0]
    elif example.id in _PRINTED and not _not_printed(quoted, _PRINTED[example.id]):
        return  # test_example's run of it printed every quoted line (a costly one runs once)
    else:
        from mirrorkit import notices

        monkeypatch.setattr(notices, "_said", set())  # its notices, said again here
        monkeypatch.chdir(tmp_path)
        capfd.readouterr()
        run_here(example)
        output = "".join(capfd.readouterr())
    missing = _not_printed(quoted, output)
    assert not missing, (
        f"{example.path}:{line} quotes {missing[0]!r}, which the example at {example.id} does "
        "not print; it printed:\n" + "\n".join(output.splitlines()[-40:])
    )


def _not_printed(quoted: str, output: str) -> list[str]:
    """The quoted lines, but blank ones and `...`, that are no line of `output`."""
    printed = [printed.rstrip() for printed in output.splitlines()]
    missing = []
    for quoted_line in quoted.splitlines():
        if quoted_line.strip() not in ("", "..."):
            # `...` inside a line stands for what varies (a time, an address) or is cut short
            pattern = ".*".join(re.escape(part) for part in quoted_line.rstrip().split("..."))
            if not any(re.fullmatch(pattern, p) for p in printed):
                missing.append(quoted_line)
    return missing
