"""The throughput report as a notebook shows it: a table that fits a cell.

A figure per row and an epoch per column, at most `HTML_EPOCHS` epochs (the first and the last
ones, with a note naming the epochs left out), then the report's verdict lines.

Example:
```python
from mirrorkit.throughput import notebook_table

print(notebook_table.html("Throughput", [1, 2], [("examples/s", ["10.0", "12.0"])], []))
```
"""

from __future__ import annotations

import html as html_text
from collections.abc import Sequence

from mirrorkit import tables

#: The most epochs a notebook's report shows as columns (the first, then the last ones).
HTML_EPOCHS = 4


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
    shown = list(range(len(epochs)))
    if len(shown) > HTML_EPOCHS:  # the first epoch, then the last ones
        shown = [0, *shown[len(shown) - (HTML_EPOCHS - 1) :]]
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
