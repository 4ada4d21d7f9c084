"""A docs page's quoted program output, compared with what the program really printed.

A page quotes output in a fenced block (```` ``` ```` or ```` ```text ````). The test that runs
the program finds the block with `quoted_block` and checks it with `assert_quoted_in`, the
convention of ``tests/test_doc_examples.py::test_a_quoted_output_is_what_its_example_prints``:

- every quoted line but a blank one, a line that is exactly ``...`` or a command typed (a
  line that begins with ``$ ``, as in a transcript) must be a line of the output (trailing
  spaces aside);
- a ``...`` inside a quoted line stands for any text: a port, a PID, a time that varies from
  run to run, or the rest of a long line;
- with ``assert_quoted_in(quote, output, figures_vary=True)``, for a page that keeps one real
  run's measured figures (a throughput, a share, a loss): every number in a quoted line (digits,
  with ``,`` and ``.`` between them) stands for any number, and a run of spaces for any run of
  spaces (a table's columns widen with its figures); every word, and a ``%`` or ``x`` after a
  number, must be as printed. Digits in a word (``[w0]``, ``p90``, ``fp16``, ``recall@10``) are
  part of the word. A part whose words depend on timing (which verdict a busy machine reaches,
  a notice that only a slow step adds) is written ``...`` on the page, or the test compares
  only the lines whose words its planted situation fixes.

The line before such a block on the page says which test compares it, as MODULE.TEST (a user
page names no ``tests/`` path: ``tests/test_docs_prose.py``)::

    <!-- compared by test_slurm.test_the_sbatch_example_trains_as_one_device -->

A block inside an admonition (``!!! note``, ``???``) is indented; its comment has the fence's
indentation, and the block's lines are compared without it. ``tests/test_quoted_outputs.py``
lists every output block of the user pages and requires each to be compared or listed there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The comment on the line before a compared block: the test module (under tests/) and test.
MARKER = re.compile(
    r"^(?P<indent> *)<!-- compared by (?P<module>test_\w+)\.(?P<test>test_\w+) -->\s*$"
)


@dataclass(frozen=True)
class Quote:
    """A fenced block's lines, and where it is (``docs/page.md:LINE``, the fence's line)."""

    lines: list[str]
    where: str


def quoted_block(page: str, after: str) -> Quote:
    """The first fenced block after the first line of `page` that contains `after`.

    `page` is relative to docs/ (``clusters/slurm.md``). The block must be marked as compared
    (`MARKER` on the line before its fence, naming a test that exists), so the page tells its
    maintainers.
    """
    lines = (ROOT / "docs" / page).read_text().splitlines()
    at = next((i for i, line in enumerate(lines) if after in line), None)
    assert at is not None, f"docs/{page} no longer says {after!r}"
    start = next(j for j in range(at + 1, len(lines)) if lines[j].lstrip().startswith("```"))
    end = next(j for j in range(start + 1, len(lines)) if lines[j].lstrip().startswith("```"))
    where = f"docs/{page}:{start + 1}"
    indent = lines[start][: len(lines[start]) - len(lines[start].lstrip())]
    marker = MARKER.match(lines[start - 1])
    assert marker and marker["indent"] == indent, (
        f"{where}: a compared block has `<!-- compared by MODULE.TEST -->` before it, "
        "indented as its fence"
    )
    module = ROOT / "tests" / f"{marker['module']}.py"
    assert module.exists() and f"def {marker['test']}(" in module.read_text(), (
        f"{where}: its comment names {marker['module']}.{marker['test']}, which is no test"
    )
    return Quote([line.removeprefix(indent) for line in lines[start + 1 : end]], where)


#: A number in a quoted line, under ``figures_vary``: not a word's digits (``[w0]``, ``p90``).
_FIGURE = re.compile(r"(?<![\w.@])\d+(?:[.,]\d+)*")
#: What a number or a run of spaces matches, under ``figures_vary``.
_ANY_FIGURE, _ANY_SPACES = r"\d+(?:[.,]\d+)*", " +"


def _part_pattern(part: str, figures_vary: bool) -> str:
    """The regular expression of a quoted line's part between two ``...``."""
    if not figures_vary:
        return re.escape(part)
    pieces = re.split(rf"({_FIGURE.pattern}| +)", part)
    return "".join(
        (_ANY_SPACES if piece.startswith(" ") else _ANY_FIGURE) if i % 2 else re.escape(piece)
        for i, piece in enumerate(pieces)
    )


def assert_quoted_in(quote: Quote, output: str, *, figures_vary: bool = False) -> None:
    """Every line of `quote`, but a blank one, ``...`` or ``$ command``, is a line of `output`.

    With `figures_vary`, its numbers stand for any numbers (the module's docstring says how).
    """
    printed = [line.rstrip() for line in output.splitlines()]
    for quoted_line in quote.lines:
        if quoted_line.strip() in ("", "...") or quoted_line.startswith("$ "):
            continue
        # `...` inside a line stands for what varies (a time, an address) or is cut short
        parts = quoted_line.rstrip().split("...")
        pattern = ".*".join(_part_pattern(part, figures_vary) for part in parts)
        assert any(re.fullmatch(pattern, p) for p in printed), (
            f"{quote.where} quotes {quoted_line!r}, which the program did not print; "
            "it printed:\n" + "\n".join(printed[-60:])
        )
