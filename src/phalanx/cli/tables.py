"""Print rich tables so that names (pods, workloads, profiles, nodes) never break over lines.

rich fits a table to the terminal by wrapping cells, and a pipe looks to it like an 80-column
terminal: `default/infer-half-0` became `default/infer` over `-half-0`, which neither reads nor
greps. Name columns are made with `name_column` (never wrapped; the other columns give way), and
into a pipe or a file the table is laid out at its natural width, one line per row.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

# wide enough for any table we print; rich only lays out to this width, it pads nothing
NATURAL_WIDTH = 10_000


def name_column(table: Table, header: str, **kwargs: object) -> None:
    """A column of names: never wrapped or folded, the other columns wrap first."""
    table.add_column(header, no_wrap=True, overflow="ignore", **kwargs)  # type: ignore[arg-type]


def print_table(table: Table, console: Console | None = None) -> None:
    """In a terminal, fit its width (only wrappable columns give way); elsewhere, natural width."""
    console = console or Console()
    if console.is_terminal:
        console.print(table)
        return
    need = console.measure(table, options=console.options.update_width(NATURAL_WIDTH)).maximum
    width = console.width
    console.width = max(need, width)
    try:
        console.print(table)
    finally:
        console.width = width
