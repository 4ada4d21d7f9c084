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


def shown_epochs(count: int, most: int) -> list[int]:
    """The indices of the epochs a turned report shows: all, or the first and the last ones.

    Args:
        count: the epochs measured.
        most: the most epochs to show (at least 2).

    Returns:
        Every index when `count` <= `most`, else 0 and the last `most` - 1.
    """
    if count <= most:
        return list(range(count))
    return [0, *range(count - (most - 1), count)]


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
    shown = shown_epochs(len(epochs), HTML_EPOCHS)
    table = tables.html_columns(
        ["", *(f"epoch {epochs[e]}" for e in shown)],
        [[label, *(values[e] for e in shown)] for label, values in figures],
        caption=title,
    )
    hidden = [epochs[e] for e in range(len(epochs)) if e not in shown]
    note = (
        f"<div>epochs {hidden[0]}-{hidden[-1]} are left out here: report.to_dict() has every "
        "epoch</div>"
        if hidden
        else ""
    )
    return table + note + "".join(f"<div>{html_text.escape(line)}</div>" for line in verdicts)


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
    shown = shown_epochs(len(epochs), TEXT_EPOCHS)
    headers = ["", *(f"epoch {epochs[e]}" for e in shown)]
    rows = [[label, *(values[e] for e in shown)] for label, values in figures]
    lines = [title, tables.columns(headers, rows, labels_left=True)]
    hidden = [epochs[e] for e in range(len(epochs)) if e not in shown]
    if hidden:
        lines.append(
            f"epochs {hidden[0]}-{hidden[-1]} are left out here: report.to_dict() has every epoch"
        )
    return "\n".join([*lines, *verdicts])
