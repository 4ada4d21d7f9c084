"""The throughput report turned to fit: a figure per row, an epoch per column.

As a notebook shows it (`html`, at most `HTML_EPOCHS` epochs) and as ``print`` shows it
(`text`, at most `TEXT_EPOCHS`): the first and the last epochs, with a note naming the epochs
left out, then the report's verdict lines.

Example:
```python
from mirrorkit.throughput import turned_table

print(turned_table.html("Throughput", [1, 2], [("examples/s", ["10.0", "12.0"])], []))
```
"""

from __future__ import annotations

import html as html_text
from collections.abc import Sequence

from mirrorkit import tables

#: The most epochs a notebook's report shows as columns (the first, then the last ones).
HTML_EPOCHS = 4
#: The most epochs the text report shows as columns (the first, then the last ones), so that
#: it fits 80 columns: a terminal's, and a docs page's box.
TEXT_EPOCHS = 5


def _turned(
    epochs: Sequence[int], figures: Sequence[tuple[str, Sequence[str]]], most: int
) -> tuple[list[str], list[list[str]], str]:
    """The table's headers and rows, at most `most` epochs, and the note on those left out.

    All the epochs, or the first and the last `most` - 1; the note is empty when none is
    left out.
    """
    count = len(epochs)
    shown = list(range(count)) if count <= most else [0, *range(count - (most - 1), count)]
    headers = ["", *(f"epoch {epochs[e]}" for e in shown)]
    rows = [[label, *(values[e] for e in shown)] for label, values in figures]
    hidden = [epochs[e] for e in range(count) if e not in shown]
    note = (
        f"epochs {hidden[0]}-{hidden[-1]} are left out here: report.to_dict() has every epoch"
        if hidden
        else ""
    )
    return headers, rows, note


def html(
    title: str,
    epochs: Sequence[int],
    figures: Sequence[tuple[str, Sequence[str]]],
    verdicts: Sequence[str],
) -> str:
    """The report's HTML for a notebook's cell.

    Args:
        title: the report's first line.
        epochs: the epochs measured, in order.
        figures: each figure's label and its value per epoch (as text, one per epoch).
        verdicts: the report's verdict lines.

    Returns:
        An HTML table, a note on the epochs left out (if any), then the verdicts.
    """
    if not epochs:
        return f"<div>{html_text.escape(title)}</div><div>(no epoch measured yet)</div>"
    headers, rows, note = _turned(epochs, figures, HTML_EPOCHS)
    lines = [note, *verdicts] if note else verdicts
    table = tables.html_columns(headers, rows, caption=title)
    return table + "".join(f"<div>{html_text.escape(line)}</div>" for line in lines)


def text(
    title: str,
    epochs: Sequence[int],
    figures: Sequence[tuple[str, Sequence[str]]],
    verdicts: Sequence[str],
) -> str:
    """The report as ``print`` shows it: the same turned table as `html`, as text.

    Args:
        title: the report's first line.
        epochs: the epochs measured, in order.
        figures: each figure's label and its value per epoch (as text, one per epoch).
        verdicts: the report's verdict lines.

    Returns:
        The title, the table (at most `TEXT_EPOCHS` epochs), a line naming the epochs left
        out (if any), then the verdicts.
    """
    if not epochs:
        return f"{title}\n(no epoch measured yet)"
    headers, rows, note = _turned(epochs, figures, TEXT_EPOCHS)
    table = tables.columns(headers, rows, labels_left=True)
    return "\n".join([title, table, *([note] if note else []), *verdicts])
