"""`flow demo`: build an example campaign, run it with a live display, show the results."""

from __future__ import annotations

import click

from httk_flow.cli.app import App
from httk_flow.ops import demo
from httk_flow.ops.status import StatusReport
from httk_flow.protocol.states import State


def _line(r: StatusReport, elapsed: float) -> str:
    shown = [s for s in State if r.counts[s]]
    parts = ", ".join(f"{r.counts[s]} {s.value}" for s in shown)
    return f"{elapsed:5.1f}s  {r.total} jobs: {parts}"


@click.command("demo")
@click.argument("path", default="flow-demo", type=click.Path(file_okay=False))
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Attempts the demo's manager runs at once.",
)
@click.pass_obj
def demo_cmd(app: App, /, path: str, workers: int) -> None:
    """Build a workspace with an example campaign in PATH and run it.

    PATH must not hold the demo already (from an earlier run): remove it or pick
    another directory."""
    demo.check(path)  # before any live display: the refusal is a plain error line
    if app.is_terminal:
        from rich.console import Group
        from rich.live import Live
        from rich.panel import Panel
        from rich.progress_bar import ProgressBar
        from rich.text import Text

        def view(r: StatusReport, elapsed: float) -> Panel:
            done = sum(r.counts[s] for s in State if s.is_terminal)
            shown = [s for s in State if r.counts[s]] or [State.READY]
            states = Text.from_markup(
                "   ".join(f"[bold]{r.counts[s]}[/] {s.value}" for s in shown)
            )
            bar = ProgressBar(total=max(1, r.total), completed=done, width=60)
            return Panel(
                Group(states, bar),
                title=f"flow demo: {done}/{r.total} jobs done in {elapsed:.1f}s",
                subtitle=r.workspace,
                expand=False,
            )

        with Live(console=app.console(), refresh_per_second=8) as live:
            res = demo.run(path, workers=workers, on_tick=lambda r, e: live.update(view(r, e)))
    else:
        last = [0.0]

        def plain(r: StatusReport, elapsed: float) -> None:
            if elapsed - last[0] >= 1.0 or r.counts[State.RUNNING] == 0:
                last[0] = elapsed
                app.echo(_line(r, elapsed))

        res = demo.run(path, workers=workers, on_tick=plain)
    r = res.report
    app.echo(f"workspace: {res.workspace}")
    app.echo(
        f"{r.counts[State.SUCCEEDED]} of {r.total} jobs succeeded, {r.counts[State.FAILED]} failed"
    )
    app.echo(f"fan-out results (20 children, joined): {res.campaign_results}")
    app.echo(f"three-step results: {len(res.relax_results)} files, e.g. {res.relax_results[0]}")
    app.echo(f"explore: flow -w {res.workspace} status | list | show campaign | history campaign")
    if res.exit_code:
        app.echo(f"the manager exited with status {res.exit_code}; its log: {res.manager_log}")
        raise SystemExit(res.exit_code)
