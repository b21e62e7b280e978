"""The live panel of `flow run` and `flow serve` on a terminal.

The manager feeds it (it is the manager's `Reporter`, httk_flow.manager.log): a report
of its progress a few times a second, drawn as one panel on stderr (the jobs of the
workspace by state, the pace, the ETA, the running jobs), and the log lines worth
keeping (failures, problems, the manager's own news), printed above the panel so that
they stay in the terminal's scrollback. Nothing here waits or polls: the manager's loop
calls in.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from httk_flow.cli.app import App
from httk_flow.manager.log import Progress
from httk_flow.protocol.durations import format_duration
from httk_flow.protocol.states import State

#: seconds of finished jobs the pace is averaged over
PACE_WINDOW = 20.0
#: lines are printed above the panel in batches at most this often (each print redraws it)
FLUSH_EVERY = 0.2
#: the panel's widest
WIDTH = 100
STYLE = {
    State.RUNNING: "cyan",
    State.SUCCEEDED: "green",
    State.FAILED: "red",
    State.CANCELLED: "yellow",
}


def wanted(*, verbose: bool, quiet: bool, log_format: str) -> bool:
    """Whether a manager shows the panel: stderr (what it logs to) is a terminal that is not
    dumb, and neither lines (-v, --log-format json) nor silence (-q) were asked for."""
    if verbose or quiet or log_format == "json":
        return False
    return sys.stderr.isatty() and os.environ.get("TERM") != "dumb"


@contextlib.contextmanager
def panel(app: App, command: str, show: bool) -> Iterator[LivePanel | None]:
    """The panel to hand the manager (None when not shown); closed however the run ends."""
    if not show:
        yield None
        return
    p = LivePanel(app.console(stderr=True), command)
    try:
        yield p
    finally:
        p.close()


class LivePanel:
    def __init__(self, console: Any, command: str) -> None:
        self.console = console
        self.command = command
        self._live: Any = None
        self._done = False
        self._pending: list[str] = []
        self._flushed = -1e18
        #: writing to the terminal: a line that comes meanwhile (from a signal handler)
        #: waits for the next write rather than land inside this one
        self._writing = False
        # here, as rich below: a manager off a terminal never imports them (ops.status is
        # about 9 ms of every `flow run` start)
        from httk_flow.ops.status import Throughput

        self._pace = Throughput(window=PACE_WINDOW)

    # -- the Reporter ---------------------------------------------------------------

    def line(self, text: str) -> None:
        self._pending.append(text)
        if self._writing:
            return
        if self._live is None or time.monotonic() - self._flushed >= FLUSH_EVERY:
            self._flush()

    def progress(self, progress: Progress) -> None:
        if self._done:
            return
        from httk_flow.ops.status import StatusReport

        report = StatusReport(progress.workspace, dict(progress.counts), [], [])
        self._pace.add(report, progress.elapsed)
        drawn = view(
            progress,
            self.command,
            self._pace.rate,
            self._pace.eta(report),
            self.console.width,
        )
        with self._write():
            if self._live is None:
                from rich.live import Live

                self._flush()
                self._live = Live(
                    drawn, console=self.console, auto_refresh=False, redirect_stdout=False
                )
                self._live.start(refresh=True)
            else:
                # printing the lines redraws the panel below them: one drawing either way
                self._live.update(drawn, refresh=not self._pending)
                self._flush()
        if progress.final:
            self.close()

    # -- the rest ---------------------------------------------------------------------

    @contextlib.contextmanager
    def _write(self) -> Iterator[None]:
        was, self._writing = self._writing, True
        try:
            with contextlib.suppress(OSError):  # a terminal gone away stops no manager
                yield
        finally:
            self._writing = was

    def close(self) -> None:
        """Print what is left and leave the last panel on the screen; lines after this
        (the manager's summary) are printed below it."""
        self._flush()
        self._done = True
        if self._live is not None:
            with self._write():
                self._live.stop()
            self._live = None

    def _flush(self) -> None:
        self._flushed = time.monotonic()
        if not self._pending:
            return
        from rich.text import Text

        text, self._pending = "\n".join(self._pending), []
        with self._write():
            # soft_wrap: a long line is the terminal's to wrap, copied whole from scrollback
            self.console.print(Text(text), soft_wrap=True)


def view(p: Progress, command: str, rate: float, eta: float | None, width: int) -> Any:
    """The panel of one report: jobs by state, a bar of the finished ones, the pace and
    the ETA (`rate` jobs/s; no ETA once stopped), and the running jobs p names."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    counts = p.counts
    total = sum(counts.values())
    done = sum(counts[s] for s in State if s.is_terminal)
    states = Text()
    for s in [s for s in State if counts[s]] or [State.READY]:
        if states:
            states.append("   ")
        states.append(str(counts[s]), style=f"bold {STYLE.get(s, '')}".strip())
        states.append(f" {s.value}")
    bar = Table.grid(padding=(0, 1), expand=True)
    bar.add_column(ratio=1)
    bar.add_column(justify="right", no_wrap=True)
    bar.add_row(ProgressBar(total=max(1, total), completed=done), f"{done}/{total} done")
    # one line however narrow the terminal: what does not fit is cut
    pace = Text(f"{rate:.1f} jobs/s", no_wrap=True, overflow="ellipsis")
    pace.append(f"  ETA {format_duration(eta)}" if eta and not p.final else "  ETA -")
    pace.append(f"  elapsed {format_duration(p.elapsed)}")
    pace.append(
        f"  here: {p.succeeded} succeeded, {p.failed} failed, {p.attempts} attempts",
        style="dim",
    )
    rows = Table(box=None, padding=(0, 1), expand=True, show_edge=False, pad_edge=False)
    rows.add_column("RUNNING", ratio=1, no_wrap=True, overflow="ellipsis")
    rows.add_column("ELAPSED", justify="right", no_wrap=True)
    rows.add_column("MANAGER", no_wrap=True)
    for r in p.running:
        rows.add_row(r.key, format_duration(r.elapsed), r.manager)
    more = counts[State.RUNNING] - len(p.running)
    parts: list[Any] = [states, bar, pace]
    if p.running:
        parts += [Text(), rows]
    if more > 0:
        parts.append(Text(f"... and {more} more running", style="dim"))
    state = " (stopped)" if p.final else " (draining)" if p.draining else ""
    return Panel(
        Group(*parts),
        title=f"flow {command}: manager {p.manager}, {p.workers} worker(s){state}",
        subtitle=p.workspace,
        width=min(width, WIDTH),
    )
