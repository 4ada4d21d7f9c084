"""Every output block on a user page is compared with what its program prints, or listed here.

A page that quotes a count or a message goes stale when the program changes, unless a test
runs the program and compares (``tests/_quoted.py``). This file makes the quotes that are not
compared yet visible, and keeps their list from growing:

- **The pages**: the user pages of ``tests/test_docs_prose.py`` (every page under ``docs/``
  but the API reference and the four builders' pages). Benchmarks, Development, Architecture
  and the Changelog are left out: Benchmarks quotes measurements of one machine on one date
  (its figures are evidence, not promises), Architecture draws diagrams in untagged blocks,
  and Development and the Changelog quote no program.
- **An output block** is a fenced block tagged ``text`` or not tagged at all. What a reader
  types or writes is tagged with its language (``python``, ``bash``, ``yaml``, ``json``,
  ``toml``, ``dockerfile``, ``diff``), and every user page keeps to that: an untagged block
  is what a program printed, a transcript (``$ command`` and what it printed) included. A
  file a program writes and the page shows in its language (``throughput.json``) is not
  counted.
- **Compared** means the line before the fence (at the fence's indentation) is
  ``<!-- compared by MODULE.TEST -->``, naming a test whose body calls
  ``quoted_block(PAGE, AFTER)`` for this very block; or the last line before it that is not
  blank is ``<!-- printed by the example above -->``, which
  ``test_doc_examples.test_a_quoted_output_is_what_its_example_prints`` compares with what
  the page's python example above it prints.
- **Every other output block is in `NOT_COMPARED_YET`**, keyed ``page:first words``, with
  why it is not compared. The words are how the block's text begins (its lines but blank
  ones, ``...`` and ``$ command``, whitespace collapsed, joined by `` / ``), 60 characters
  of them (`key_for`: fewer, then ``...`` and the start of a later line, where 60 would name
  two blocks). In a key, ``...`` stands for any text and a number for any number, so a block
  whose figures are refreshed keeps its key. The test fails on an output block that is neither
  (compare it, or list it with a reason: the failure suggests its key), on a key that names
  no block, or a compared one (take it off the list), or two, so the list only shrinks.

Run this file with Python to print the counts, by reason::

    python tests/test_quoted_outputs.py
"""

from __future__ import annotations

import ast
import collections
import re
from dataclasses import dataclass
from pathlib import Path

from _quoted import MARKER
from test_docs_prose import user_pages

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"

_FENCE = re.compile(r"^(?P<indent> *)```(?P<tag>\S*)")
_PRINTED = re.compile(r"^(?P<indent> *)<!-- printed by the example above -->\s*$")
#: The tags of output blocks: ``text``, or none.
OUTPUT_TAGS = ("", "text")
KEY_LENGTH = 60

# Why a block is not compared yet; the part before the first ";" is the reason's kind.
#: mirrorkit prints it, and no test compares it yet: the list's to-do.
NOT_YET = "mirrorkit prints it, and no test compares it yet"
#: The situation it quotes is set up by no test.
NO_RUN = "no test sets up the situation it quotes"
#: Keras's, TensorFlow's or a cluster engine's words, which mirrorkit does not print.
NOT_OURS = "another program's output, not mirrorkit's"
#: A template (``NODE``, hosts ``a`` and ``b``), not one run's output.
TEMPLATE = "a template, not one run's output"
#: Figures from one run on one machine (a throughput, a time, a loss) that vary run to run.
MEASURED = "figures measured in one run, which vary"
KINDS = (NOT_YET, NO_RUN, NOT_OURS, TEMPLATE, MEASURED)

#: Output blocks not compared yet, and why: this list only shrinks.
NOT_COMPARED_YET: dict[str, str] = {
    "clusters/slurm.md:mirrorkit: Slurm: the step's 2 tasks on NODE share the 4 GPU": TEMPLATE,
    "clusters/slurm.md:Epoch 22/40": NO_RUN
    + "; a job cancelled at its time limit without --signal: minutes of Slurm for one quote"
    + " (the --signal recipe on the same page is compared)",
    "multi-worker.md:mirrorkit: workers 2-3 of 4 on this host; cluster a:29470, a": TEMPLATE,
    "troubleshooting.md:WARNING: All log messages before absl::InitializeLog() is ca": NOT_OURS,
    "troubleshooting.md:E0000 ... UNAVAILABLE: Failed to send RPC to coordination se": NOT_OURS,
}


@dataclass(frozen=True, eq=False)
class Block:
    """An output block of a user page."""

    page: str  # under docs/
    line: int  # the fence's line, from 1
    body: list[str]  # without the fence's indentation
    before: str  # the line before the fence
    above: str  # the last line before the fence that is not blank

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"

    @property
    def text(self) -> list[str]:
        """Its lines but blank ones, ``...`` and ``$ command``, whitespace collapsed."""
        lines = [" ".join(line.split()) for line in self.body]
        kept = [x for x in lines if x not in ("", "...") and not x.startswith("$ ")]
        return kept or [x for x in lines if x]


_NUMBER = re.compile(r"\d[\d,.]*")


def _figures_out(text: str) -> str:
    return _NUMBER.sub("N", text)


def listed_as(key: str, block: Block) -> bool:
    """Whether `key` (``page:words``) names `block`: its text begins with the words.

    In the words, ``...`` (and the spaces around it) stands for any text, and a number for any
    number.
    """
    page, _, words = key.partition(":")
    if page != block.page:
        return False
    parts = re.split(r"\s*\.\.\.\s*", words)
    pattern = ".*".join(re.escape(_figures_out(part)) for part in parts)
    return re.match(pattern, _figures_out(" / ".join(block.text))) is not None


def key_for(block: Block, page_blocks: list[Block]) -> str:
    """The key that names `block` alone among its page's output blocks.

    Its first 60 characters; where they name another block too, its first 30, then ``...``
    and the start (30 characters) of each later line that tells it from those blocks.
    """
    first, *later = block.text or [""]
    key = f"{block.page}:{first[:KEY_LENGTH]}"
    if not any(listed_as(key, other) for other in page_blocks if other is not block):
        return key
    key = f"{block.page}:{first[: KEY_LENGTH // 2]}"
    others = [other for other in page_blocks if other is not block and listed_as(key, other)]
    for line in later:
        longer = f"{key} ... {line[: KEY_LENGTH // 2]}"
        fewer = [other for other in others if listed_as(longer, other)]
        if len(fewer) < len(others):
            key, others = longer, fewer
        if not others:
            break
    return key


def output_blocks() -> list[Block]:
    """Every output block (``text`` or untagged) of the user pages, in page order."""
    blocks = []
    for page, text in user_pages().items():
        lines = text.splitlines()
        i = 0
        while i < len(lines):
            fence = _FENCE.match(lines[i])
            if not fence:
                i += 1
                continue
            indent = fence["indent"]
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            if fence["tag"] in OUTPUT_TAGS:
                body = [line.removeprefix(indent) for line in lines[i + 1 : end]]
                before = lines[i - 1] if i else ""
                above = next((line for line in reversed(lines[:i]) if line.strip()), "")
                blocks.append(Block(page, i + 1, body, before, above))
            i = end + 1
    return blocks


def _strings(body: list[ast.stmt]) -> dict[str, str]:
    """The ``NAME = "string"`` assignments of a module's or function's body (a ``PAGE``)."""
    names = {}
    for node in body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                    names[target.id] = node.value.value
    return names


def _quoted_calls(module: str, test: str) -> list[tuple[str, str]] | None:
    """(page, after) of each ``quoted_block`` call in the test's body; None: no such test."""
    path = TESTS / f"{module}.py"
    if not path.exists():
        return None
    tree = ast.parse(path.read_text())
    function = next(
        (
            node
            for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == test
        ),
        None,
    )
    if function is None:
        return None
    strings = _strings(tree.body) | _strings(function.body)
    calls = []
    for node in ast.walk(function):
        if not (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "quoted_block"
            and len(node.args) == 2
        ):
            continue
        page, after = node.args
        if isinstance(page, ast.Name):
            page = strings.get(page.id)
        elif isinstance(page, ast.Constant):
            page = page.value
        if isinstance(page, str) and isinstance(after, ast.Constant):
            calls.append((page, after.value))
    return calls


def _block_after(page: str, after: str) -> int | None:
    """The fence line (from 1) of the first block after `after`, as `quoted_block` finds it."""
    lines = (ROOT / "docs" / page).read_text().splitlines()
    at = next((i for i, line in enumerate(lines) if after in line), None)
    if at is None:
        return None
    start = next(j for j in range(at + 1, len(lines)) if lines[j].lstrip().startswith("```"))
    return start + 1


def compared(block: Block) -> str | None:
    """How the block is compared ("MODULE.TEST" or "its example"), or None; raises if falsely."""
    if (printed := _PRINTED.match(block.above)) and printed["indent"] == _indent(block):
        return "its example"
    marker = MARKER.match(block.before)
    if not marker:
        return None
    name = f"{marker['module']}.{marker['test']}"
    calls = _quoted_calls(marker["module"], marker["test"])
    assert calls is not None, f"{block.where}: its comment names {name}, which is no test"
    assert marker["indent"] == _indent(block), (
        f"{block.where}: its comment is not indented as its fence"
    )
    assert any(
        page == block.page and _block_after(page, after) == block.line for page, after in calls
    ), f"{block.where}: {name} calls no quoted_block({block.page!r}, ...) that finds it"
    return name


def _indent(block: Block) -> str:
    line = (ROOT / "docs" / block.page).read_text().splitlines()[block.line - 1]
    return line[: len(line) - len(line.lstrip())]


def inventory() -> tuple[dict[Block, str], list[Block]]:
    """{block: how it is compared} for the compared blocks, and the others."""
    done, left = {}, []
    for block in output_blocks():
        how = compared(block)
        if how:
            done[block] = how
        else:
            left.append(block)
    return done, left


def test_every_output_block_is_compared_or_listed_with_why_not():
    done, left = inventory()
    blocks = [*done, *left]
    new = [
        f"{b.where}: {key_for(b, [o for o in blocks if o.page == b.page])!r}"
        for b in left
        if not any(listed_as(key, b) for key in NOT_COMPARED_YET)
    ]
    assert not new, (
        "output blocks neither compared with what their program prints nor listed in "
        "NOT_COMPARED_YET (compare each, as tests/_quoted.py says, or list it with why):\n"
        + "\n".join(new)
    )


def test_the_not_compared_list_only_shrinks():
    done, left = inventory()
    named = {key: [b for b in [*done, *left] if listed_as(key, b)] for key in NOT_COMPARED_YET}
    gone = [key for key, blocks in named.items() if not blocks]
    twice = {key: [b.where for b in blocks] for key, blocks in named.items() if len(blocks) > 1}
    now_compared = [key for key, blocks in named.items() if blocks and blocks[0] in done]
    listed_twice = [b.where for b in left if sum(b in blocks for blocks in named.values()) > 1]
    assert not now_compared, f"compared now, take them off NOT_COMPARED_YET: {now_compared}"
    assert not gone, f"no output block begins so any more, take them off the list: {gone}"
    assert not twice, f"keys that name more than one block, make them longer: {twice}"
    assert not listed_twice, f"blocks listed under two keys: {listed_twice}"


def test_every_reason_is_one_of_the_kinds():
    odd = {k: why for k, why in NOT_COMPARED_YET.items() if why.split(";")[0] not in KINDS}
    assert not odd, odd


def counts() -> str:
    done, left = inventory()
    why = [next((r for k, r in NOT_COMPARED_YET.items() if listed_as(k, b)), "?") for b in left]
    by_kind = collections.Counter(reason.split(";")[0] for reason in why)
    lines = [f"compared: {len(done)}", f"not compared yet: {len(left)}"]
    lines += [f"  {n:3}  {kind}" for kind, n in by_kind.most_common()]
    return "\n".join(lines)


if __name__ == "__main__":
    print(counts())
