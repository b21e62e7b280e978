"""The application object: owns the consoles, output mode and the workspace of one command."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click
import orjson

from httk_flow.errors import FlowError
from httk_flow.protocol.workspace import Workspace


class App:
    def __init__(self) -> None:
        self.workspace_path: str | None = None
        self._ws: Workspace | None = None
        self.is_terminal = sys.stdout.isatty() and os.environ.get("TERM") != "dumb"
        self.color = self.is_terminal and "NO_COLOR" not in os.environ

    @property
    def ws(self) -> Workspace:
        if self._ws is None:
            self._ws = Workspace.find(self.workspace_path)
        return self._ws

    def console(self, stderr: bool = False) -> Any:
        from rich.console import Console  # lazy: keeps `flow --help` fast

        return Console(
            stderr=stderr,
            no_color=not self.color,
            highlight=False,
            force_terminal=self.is_terminal if not stderr else None,
        )

    def echo(self, text: str = "") -> None:
        click.echo(text)

    def json(self, doc: object) -> None:
        sys.stdout.buffer.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
        sys.stdout.flush()

    def table(
        self,
        headers: Sequence[str],
        rows: Sequence[Sequence[object]],
        *,
        title: str | None = None,
    ) -> None:
        """A rich table on a terminal; aligned plain columns otherwise (stable for scripts)."""
        cells = [[_cell(c) for c in r] for r in rows]
        if self.is_terminal:
            from rich.table import Table

            t = Table(title=title, title_justify="left", header_style="bold")
            for h in headers:
                t.add_column(h, overflow="fold")
            for r in cells:
                t.add_row(*r)
            self.console().print(t)
            return
        if title:
            click.echo(title)
        widths = [len(h) for h in headers]
        for r in cells:
            widths = [max(w, len(c)) for w, c in zip(widths, r, strict=False)]
        for r in [list(headers), *cells]:
            click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip())

    def warn(self, text: str) -> None:
        click.echo(f"flow: warning: {text}", err=True)

    def abort(self, message: str, code: int = 1) -> NoReturn:
        click.echo(f"flow: error: {message}", err=True)
        raise SystemExit(code)

    def fail(self, err: FlowError) -> NoReturn:
        self.abort(err.render(), err.exit_code)


def _cell(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.1f}"
    return str(v)
