"""The user pages of the site read as instructions, not as a lab notebook.

A user page is every page under ``docs/`` but the API reference (generated from docstrings)
and the four pages written for the people who build mirrorkit or want its evidence:
Benchmarks, Development, Architecture and the Changelog. Measurements, dates, machine details,
test names and history belong there.

- No user page names a test file or a test, or a machine's load ("load average", "2-core"),
  and none says that something is "said once": it quotes what the user sees.
- Every user page over 300 words has at least two H2 sections (the site's contents list
  shows nothing for fewer).
- The average sentence of the user pages' prose is at most 20 words. Prose is the text
  outside code blocks, tables, headings and HTML comments; a list item counts as one
  sentence, a paragraph splits after ``.``, ``!`` or ``?`` before a capital letter or a code
  span. Run this file with Python to print the figures page by page::

      python tests/test_docs_prose.py
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

#: Pages for the people who build mirrorkit, or who want its evidence, rather than its users.
NOT_USER_PAGES = {"benchmarks.md", "development.md", "changelog.md", "ARCHITECTURE.md"}

#: The most words a user page's sentences may average.
MAX_AVERAGE_SENTENCE = 20

#: What a user page does not say: a test's name, a machine's load, "said once".
LAB_NOTEBOOK = {
    "a test file or test": re.compile(r"\btests/|\btest_\w+\.py\b|::test_\w+|\btest_[a-z]\w*\("),
    "a machine's load": re.compile(r"load average|\b\d+-core\b", re.I),
    '"said once"': re.compile(r"\bsaid once\b", re.I),
    "an undated run": re.compile(r"\bearlier runs?\b|\bruns? by hand\b", re.I),
}
#: Benchmarks gives each figure with its command and date: no undated run there either.
UNDATED = LAB_NOTEBOOK["an undated run"]

_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s+")
_ADMONITION = re.compile(r'^\s*(?:!!!|\?\?\?\+?)\s*\w+(?:\s+"(?P<title>[^"]*)")?\s*$')
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(*_]|CODE)")


def user_pages() -> dict[str, str]:
    """Each user page's path under docs/ and its Markdown."""
    pages = {}
    for path in sorted(DOCS.rglob("*.md")):
        name = path.relative_to(DOCS).as_posix()
        if name not in NOT_USER_PAGES and not name.startswith("api/"):
            pages[name] = path.read_text()
    return pages


def prose(markdown: str) -> list[tuple[str, str]]:
    """The page's prose as ("item", text) and ("paragraph", text) units, in order."""
    markdown = re.sub(r"<!--.*?-->", "", markdown, flags=re.S)
    units: list[tuple[str, str]] = []
    kind, lines = "", []
    fence = ""

    def flush():
        nonlocal kind, lines
        if lines:
            units.append((kind, " ".join(lines)))
        kind, lines = "", []

    for line in markdown.splitlines():
        text = line.strip()
        if fence:
            if text.startswith(fence):
                fence = ""
            continue
        if text.startswith(("```", "~~~")):
            flush()
            fence = text[:3]
            continue
        if not text or text.startswith(("|", "#", "--8<--", ":::", "<")) or _ADMONITION.match(line):
            flush()
            continue
        if _ITEM.match(line):
            flush()
            kind, lines = "item", [_ITEM.sub("", line).strip()]
            continue
        if not lines:
            kind = "paragraph"
        lines.append(text)
    flush()
    return units


def sentences(markdown: str) -> list[str]:
    """The prose's sentences: a list item is one; a paragraph is split at its sentence ends."""
    found = []
    for kind, text in prose(markdown):
        text = re.sub(r"`[^`]*`", "CODE", text)
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
        parts = [text] if kind == "item" else _SENTENCE_END.split(text)
        found += [part for part in parts if part.split()]
    return found


def _h2_count(markdown: str) -> int:
    outside_code = re.sub(r"```.*?```", "", markdown, flags=re.S)
    return len(re.findall(r"^## ", outside_code, re.M))


def figures() -> dict[str, dict]:
    """Per user page: words, H2 sections, sentences, average and longest sentence."""
    table = {}
    for name, markdown in user_pages().items():
        lengths = [len(s.split()) for s in sentences(markdown)]
        table[name] = {
            "words": len(markdown.split()),
            "h2": _h2_count(markdown),
            "sentences": len(lengths),
            "sentence_words": sum(lengths),
            "average": sum(lengths) / max(len(lengths), 1),
            "longest": max(lengths, default=0),
        }
    return table


def average_sentence(table: dict[str, dict]) -> float:
    """Words per sentence over every user page together."""
    words = sum(row["sentence_words"] for row in table.values())
    return words / sum(row["sentences"] for row in table.values())


def print_figures() -> None:
    table = figures()
    print(f"{'page':28} {'words':>6} {'H2':>3} {'sentences':>9} {'average':>7} {'longest':>7}")
    for name, row in table.items():
        print(
            f"{name:28} {row['words']:6} {row['h2']:3} {row['sentences']:9} "
            f"{row['average']:7.1f} {row['longest']:7}"
        )
    print(f"average sentence, every user page: {average_sentence(table):.1f} words")


def test_the_measure_counts_what_it_says():
    page = (
        "# Title\n\nOne two three. Four `five six` seven!\n\n- An item. Still the item.\n"
        "  Its second line.\n\n```python\nnot. prose. here.\n```\n\n| a. | b. |\n\n"
        '!!! note "A title"\n    Inside the note.\n\n<!-- hidden. words. -->\n'
    )
    assert sentences(page) == [
        "One two three.",
        "Four CODE seven!",
        "An item. Still the item. Its second line.",
        "Inside the note.",
    ]


def test_user_pages_name_no_tests_no_load_and_quote_what_users_see():
    found = []
    for name, markdown in user_pages().items():
        for what, pattern in LAB_NOTEBOOK.items():
            for match in pattern.finditer(markdown):
                found.append(f"{name}: {what}: {match.group(0)!r}")
    benchmarks = (DOCS / "benchmarks.md").read_text()
    found += [f"benchmarks.md: an undated run: {m[0]!r}" for m in UNDATED.finditer(benchmarks)]
    assert not found, "move these to Benchmarks or Development, or quote the output:\n" + (
        "\n".join(found)
    )


def test_every_long_user_page_has_sections():
    table = figures()
    short = {name: row["h2"] for name, row in table.items() if row["words"] > 300 and row["h2"] < 2}
    assert not short, f"user pages over 300 words with fewer than two H2 sections: {short}"


def test_the_average_sentence_is_short(capsys):
    with capsys.disabled():
        print()
        print_figures()
    average = average_sentence(figures())
    assert average <= MAX_AVERAGE_SENTENCE, f"{average:.1f} words a sentence on the user pages"


if __name__ == "__main__":
    print_figures()
