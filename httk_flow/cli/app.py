"""The application object: the one place a command writes to the user.

It owns the workspace of one command, the output mode (a terminal gets rich, anything
else gets plain stable text; NO_COLOR turns colour off), the consoles, the JSON and
table renderers, and the one error renderer (`flow: error: ...`).
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

import click
import orjson

from httk_flow.errors import FlowError
from httk_flow.protocol.workspace import Workspace

#: the machine refusing (full disk, quota, read-only, permissions): not a bug
_ENVIRONMENT_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}
)


class App:
    def __init__(self) -> None:
        self.workspace_path: str | None = None
        self._ws: Workspace | None = None
        self._consoles: dict[bool, Any] = {}
        self.is_terminal = sys.stdout.isatty() and os.environ.get("TERM") != "dumb"
        self.color = self.is_terminal and "NO_COLOR" not in os.environ

    @property
    def ws(self) -> Workspace:
        if self._ws is None:
            self._ws = Workspace.find(self.workspace_path)
        return self._ws

    # -- text ------------------------------------------------------------------------

    def console(self, stderr: bool = False) -> Any:
        """The rich console of stdout (or stderr), made once: for live displays."""
        if stderr not in self._consoles:
            from rich.console import Console  # lazy: keeps `flow --help` fast

            self._consoles[stderr] = Console(
                stderr=stderr,
                no_color=not self.color,
                highlight=False,
                force_terminal=self.is_terminal if not stderr else None,
            )
        return self._consoles[stderr]

    def echo(self, text: str = "", *, err: bool = False) -> None:
        click.echo(text, err=err)

    def write(self, data: bytes) -> None:
        """Bytes as they are (a job's output), flushed."""
        sys.stdout.buffer.write(data)
        sys.stdout.flush()

    # -- documents ---------------------------------------------------------------------

    def json(self, doc: object) -> None:
        """The one JSON document of a `--json` command."""
        self.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")

    def json_line(self, doc: object) -> None:
        """One JSON document on one line, for commands that print one per pass."""
        self.write(orjson.dumps(doc) + b"\n")

    def rich_table(
        self,
        headers: Sequence[str],
        rows: Sequence[Sequence[object]],
        *,
        title: str | None = None,
        right: Sequence[str] = (),
    ) -> Any:
        """The rich form of a table (for a live display); `right` names right-aligned columns."""
        from rich.table import Table

        t = Table(title=title, title_justify="left", header_style="bold")
        for h in headers:
            t.add_column(h, overflow="fold", justify="right" if h in right else "left")
        for r in rows:
            t.add_row(*(_cell(c) for c in r))
        return t

    def table(
        self,
        headers: Sequence[str],
        rows: Sequence[Sequence[object]],
        *,
        title: str | None = None,
    ) -> None:
        """A rich table on a terminal; aligned plain columns otherwise (stable for scripts)."""
        if self.is_terminal:
            self.console().print(self.rich_table(headers, rows, title=title))
            return
        for line in _plain_table(headers, rows, title=title):
            click.echo(line)

    # -- problems ------------------------------------------------------------------------

    def warn(self, text: str) -> None:
        click.echo(f"flow: warning: {text}", err=True)

    def error(self, err: FlowError) -> None:
        """The one place `flow: error: ...` is printed."""
        click.echo(f"flow: error: {err.render()}", err=True)

    def fail(self, err: FlowError) -> NoReturn:
        """Print the error and exit with its status (2 bad input, 1 a failed operation)."""
        self.error(err)
        raise SystemExit(err.exit_code)

    @contextmanager
    def reporting_errors(self) -> Iterator[None]:
        """The error handler of every command: a FlowError becomes `flow: error: ...` and
        its exit status, and so does the machine refusing; anything else is a bug and
        keeps its traceback."""
        try:
            yield
        except FlowError as e:
            self.fail(e)
        except OSError as e:
            if e.errno not in _ENVIRONMENT_ERRNOS:
                raise
            refused = FlowError(
                f"{e.strerror}",
                obj=str(e.filename) if e.filename else None,
                hint="free space or fix permissions in the workspace and run the command again",
            )
            self.fail(refused)


def _plain_table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], *, title: str | None = None
) -> list[str]:
    """A table as aligned plain lines: two spaces between columns, no trailing blanks."""
    cells = [[_cell(c) for c in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, r, strict=False)]
    lines = [title] if title else []
    for r in [list(headers), *cells]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip())
    return lines


def _cell(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.1f}"
    return str(v)
