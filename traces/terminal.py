"""Terminal styles and table shapes shared by `refinery traces` and the rest of the CLI.

It lives in traces/ so that traces/ never imports bench/ (bench/render.py builds on it). Tables
made here fit 80 columns and read the same when the output is a file or a pipe: no vertical rules,
numbers never cut (their columns do not wrap), headers wrap instead of being cut, and the one column
holding long names folds.
"""

from __future__ import annotations

from rich import box
from rich.console import Console, JustifyMethod
from rich.table import Table
from rich.text import Text

from kernel_refinery.core.verdict import Verdict


def badge(verdict: Verdict) -> str:
    """A verdict in console markup, in its style."""
    return f"[{verdict.style}]{verdict.value}[/]"


def badge_text(verdict: Verdict) -> Text:
    return Text(verdict.value, style=verdict.style)


def compact_table(title: str | None = None, caption: str | None = None) -> Table:
    """A table for 80 columns: a rule under the header only, one space between columns.

    print_table prints the title and caption as lines of their own, in the console's width, rather
    than wrapped into the width of a narrow table.
    """
    return Table(
        title=title,
        caption=caption,
        header_style="bold",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=0,
        title_justify="left",
        caption_justify="left",
        show_edge=False,
    )


def add_name_column(table: Table, header: str) -> None:
    """A column of names (tasks, labels): it folds a long name rather than squeeze the numbers."""
    table.add_column(header, overflow="fold", min_width=min(len(header), 8), ratio=1)


def add_number_column(table: Table, header: str, justify: JustifyMethod = "right") -> None:
    """A column of numbers: never wrapped or cut; its header may wrap onto two lines."""
    table.add_column(Text(header, overflow="fold"), justify=justify, no_wrap=True)


def print_table(console: Console, table: Table, wide: bool = False) -> None:
    """Print a table with its title and caption on lines of their own, in the console's width; a wide
    table gets the width it needs instead (the terminal wraps its lines), so that no cell is cut."""
    before = console.width
    title, caption = table.title, table.caption
    table.title = table.caption = None
    try:
        if wide:
            # console.print(width=...) cannot go past the console's own width.
            console.width = max(before, console.measure(table, options=console.options.update_width(10_000)).maximum)
        if title:
            console.print(title, style="bold", highlight=False, markup=False)
        console.print(table)
        if caption:
            console.print(caption, style="dim", highlight=False, markup=False)
    finally:
        table.title, table.caption = title, caption
        if wide:
            console.width = before
