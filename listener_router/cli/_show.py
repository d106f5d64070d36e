"""How the operator commands print: a table on a terminal, plain columns in a pipe, or JSON.

A command builds what it shows once, as plain values (what ``--json``
prints), and hands it to an :class:`Out`, which picks the form:

- on a terminal, a rich table that fits the window;
- in a pipe or a file, a title line, a header line and one line per row,
  each column padded to its widest cell and never cut or wrapped, so
  ``grep``, ``sort`` and ``awk`` see whole rows whatever the width;
- with ``--json``, JSON: a listing prints one object per line (JSON Lines,
  also while it follows), a report (``chalk status``) one object.  Times
  are ISO 8601 with their UTC offset, durations are seconds; prose (a title,
  "nothing matches") is left out, so the output parses line by line.

docs/guide.md ("Output for scripts") documents the shapes; the CLI tests
check them.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Collection, Sequence
from typing import Any, TextIO

__all__ = ["Out", "iso", "plain_rows"]


def iso(at: float | None, timespec: str = "milliseconds") -> str | None:
    """``at`` (epoch seconds) as local ISO 8601 time with its offset; None stays None."""
    if at is None:
        return None
    return dt.datetime.fromtimestamp(at).astimezone().isoformat(timespec=timespec)


def _cell(value: object) -> str:
    return " ".join(str(value).split()) if value is not None else ""


def plain_rows(columns: Sequence[str], rows: Sequence[Sequence[object]],
               right: Collection[str] = ()) -> list[str]:
    """``rows`` under ``columns`` as text lines: each column as wide as its widest cell
    (``right``: right-aligned), two spaces apart, nothing cut, one line per row."""
    cells = [[_cell(c) for c in columns]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = []
    for line in cells:
        parts = [cell.rjust(width) if name in right else cell.ljust(width)
                 for name, cell, width in zip(columns, line, widths, strict=True)]
        lines.append("  ".join(parts).rstrip())
    return lines


class Out:
    """Where a command prints (stdout by default), in the form ``--json`` and the stream ask
    for (see the module doc)."""

    def __init__(self, json_lines: bool = False, file: TextIO | None = None):
        self.json = json_lines
        self.file = file if file is not None else sys.stdout
        isatty = getattr(self.file, "isatty", None)
        self.terminal = not json_lines and bool(isatty and isatty())
        self._console: Any = None

    @property
    def console(self) -> Any:
        """A rich console on this output (tables and JSON on a terminal)."""
        if self._console is None:
            from rich.console import Console
            self._console = Console(file=self.file)
        return self._console

    def text(self, line: str) -> None:
        """A line of prose; nothing with ``--json`` (it is not data)."""
        if not self.json:
            print(line, file=self.file, flush=True)

    def record(self, value: Any, *, indent: int | None = None) -> None:
        """One JSON value on one line (``indent``: over several, for a report)."""
        print(json.dumps(value, ensure_ascii=False, default=str, indent=indent),
              file=self.file, flush=True)

    def table(self, title: str | None, columns: Sequence[str],
              rows: Sequence[Sequence[object]], right: Collection[str] = ()) -> None:
        """A table of text cells (with ``--json`` the caller prints records instead)."""
        if self.terminal:
            from rich.table import Table
            table = Table(title=title)
            for name in columns:
                table.add_column(name, justify="right" if name in right else "left",
                                 overflow="fold")
            for row in rows:
                table.add_row(*(_cell(v) for v in row))
            self.console.print(table)
            return
        if title:
            self.text(title)
        for line in plain_rows(columns, rows, right):
            self.text(line)
