"""How the operator commands print: a table on a terminal, plain columns in a pipe, or JSON.

A command builds what it shows once, as plain values (what ``--json``
prints), and hands it to an :class:`Out`, which picks the form:

- on a terminal, a rich table that fits the window;
- in a pipe or a file, a title line, a header line and one line per row,
  each column padded to its widest cell and never cut or wrapped, so
  ``grep``, ``sort`` and ``awk`` see whole rows whatever the width;
- with ``--json``, one JSON document: an array for a listing, an object
  for a report (``chalk status``), on one line;
- with ``--json-lines``, one JSON object a line: each row of a listing (also
  while ``--follow`` follows), or the report's object.

Times are ISO 8601 with their UTC offset, durations are seconds; prose (a
title, "nothing matches") is left out of JSON, so it parses as a whole
(``--json``) or line by line (``--json-lines``).

docs/guide.md ("Output for scripts") documents the rule and the shapes;
tests/listener_router/test_output.py runs every listing both ways.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Collection, Sequence
from typing import Any, TextIO

__all__ = ["FORMS", "Out", "add_json_options", "iso", "plain_rows"]


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


FORMS = ("text", "json", "json-lines")


def add_json_options(parser: Any, what: str = "the rows") -> None:
    """``--json`` and ``--json-lines`` on ``parser`` (one of them; docs/guide.md)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--json", action="store_true",
                       help=f"print {what} as one JSON document (docs/guide.md)")
    group.add_argument("--json-lines", action="store_true",
                       help="print one JSON object a line (docs/guide.md)")


class Out:
    """Where a command prints (stdout by default), in the form the options and the stream
    ask for (see the module doc): ``form`` is ``text``, ``json`` or ``json-lines``."""

    def __init__(self, form: str = "text", file: TextIO | None = None):
        if form not in FORMS:
            raise ValueError(f"output form {form!r}: one of {', '.join(FORMS)}")
        self.form = form
        self.file = file if file is not None else sys.stdout
        isatty = getattr(self.file, "isatty", None)
        self.terminal = form == "text" and bool(isatty and isatty())
        self._console: Any = None

    @classmethod
    def of(cls, args: Any) -> Out:
        """The form a command's ``--json`` / ``--json-lines`` ask for."""
        if getattr(args, "json_lines", False):
            return cls("json-lines")
        return cls("json" if getattr(args, "json", False) else "text")

    @property
    def json(self) -> bool:
        """JSON of either kind: prose and tables are left out."""
        return self.form != "text"

    @property
    def console(self) -> Any:
        """A rich console on this output (tables on a terminal)."""
        if self._console is None:
            from rich.console import Console
            self._console = Console(file=self.file)
        return self._console

    def text(self, line: str) -> None:
        """A line of prose; nothing in JSON (it is not data)."""
        if not self.json:
            print(line, file=self.file, flush=True)

    def _dump(self, value: Any) -> None:
        print(json.dumps(value, ensure_ascii=False, default=str), file=self.file, flush=True)

    def listing(self, rows: Sequence[Any], empty: str | None = None) -> bool:
        """``rows`` as JSON in this output's form (an array, or one a line), or in text the
        line ``empty`` when there are none; False when the caller is to print its table."""
        if self.form == "json":
            self._dump(list(rows))
        elif self.form == "json-lines":
            for row in rows:
                self._dump(row)
        elif not rows and empty is not None:
            self.text(empty)
            return True
        return self.json

    def row(self, value: Any) -> None:
        """One more row of a stream (``--follow``): a line of JSON Lines."""
        self._dump(value)

    def document(self, value: Any) -> bool:
        """A report (one object) as JSON on one line; False in text."""
        if self.json:
            self._dump(value)
        return self.json

    def table(self, title: str | None, columns: Sequence[str],
              rows: Sequence[Sequence[object]], right: Collection[str] = ()) -> None:
        """A table of text cells (in JSON the caller prints its rows instead)."""
        if self.json:
            return
        if self.terminal:
            from rich.markup import escape
            from rich.table import Table
            table = Table(title=escape(title) if title else None)
            for name in columns:
                table.add_column(escape(name), justify="right" if name in right else "left",
                                 overflow="fold")
            for row in rows:
                table.add_row(*(escape(_cell(v)) for v in row))
            self.console.print(table)
            return
        if title:
            self.text(title)
        for line in plain_rows(columns, rows, right):
            self.text(line)
