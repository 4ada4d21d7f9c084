"""Tables in text and HTML: the one renderer behind every table mirrorkit shows.

Two shapes: `columns` (a header row over data rows, right-aligned, for
figures: the throughput report, the benchmark table) and `pairs` (a label
and its value per line: `mk.describe`, `mirrorkit info`). Each has an HTML
twin for notebooks. Cells are strings; HTML escapes them.
"""

from __future__ import annotations

import html
from collections.abc import Sequence


def columns(
    headers: Sequence[str], rows: Sequence[Sequence[str]], labels_left: bool = False
) -> str:
    """Right-aligned columns two spaces apart, the header first.

    Args:
        headers: the header of each column.
        rows: each row's cells, as text.
        labels_left: the first column (each row's label) aligned left.

    Example:
    ```python
    from mirrorkit import tables

    print(tables.columns(["epoch", "examples/s"], [["1", "1,024.0"]]))
    ```
    """
    widths = [max(len(h), *(len(r[j]) for r in rows)) for j, h in enumerate(headers)]

    def aligned(j: int, cell: str) -> str:
        return cell.ljust(widths[j]) if labels_left and j == 0 else cell.rjust(widths[j])

    return "\n".join(
        "  ".join(aligned(j, cell) for j, cell in enumerate(line)).rstrip()
        for line in [headers, *rows]
    )


def pairs(rows: Sequence[tuple[str, str]]) -> str:
    """``label  value`` lines, the labels left-aligned to the longest.

    Example:
    ```python
    from mirrorkit import tables

    print(tables.pairs([("workers", "2"), ("replicas in sync", "4")]))
    ```
    """
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label.ljust(width)}  {value}" for label, value in rows)


def html_columns(
    headers: Sequence[str], rows: Sequence[Sequence[str]], caption: str | None = None
) -> str:
    """`columns` as an HTML ``<table>``, with an optional caption."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    title = f"<caption>{html.escape(caption)}</caption>" if caption is not None else ""
    return f"<table>{title}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def html_pairs(rows: Sequence[tuple[str, str]], css_class: str) -> str:
    """`pairs` as an HTML ``<table>`` of class `css_class`, label cells as headers."""
    cells = "".join(
        f"<tr><th style='text-align:left'>{html.escape(label)}</th>"
        f"<td style='text-align:left'>{html.escape(value)}</td></tr>"
        for label, value in rows
    )
    return f"<table class='{css_class}'>{cells}</table>"
