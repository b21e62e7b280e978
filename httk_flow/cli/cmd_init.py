"""`flow init`."""

from __future__ import annotations

import click

from httk_flow.cli.app import App
from httk_flow.durations import parse_duration
from httk_flow.workspace import Workspace


def register(cli: click.Group) -> None:
    from httk_flow.cli.options import workspace_option

    @cli.command("init")
    @click.argument("path", default=".", type=click.Path(file_okay=False))
    @click.option("--durable/--no-durable", default=False, help="fsync every publish (slower).")
    @click.option(
        "--lease", default=None, help="Manager lease, e.g. 30s or 2m (default 30s, at least 1s)."
    )
    @click.option("--exist-ok", is_flag=True, help="Accept an existing workspace.")
    @click.option("--json", "as_json", is_flag=True, help="Print a JSON document.")
    @workspace_option
    @click.pass_obj
    def init(
        app: App, /, path: str, durable: bool, lease: str | None, exist_ok: bool, as_json: bool
    ) -> None:
        """Create a workspace in PATH (default: the current directory)."""
        ws = Workspace.create(
            path,
            durable=durable,
            lease=parse_duration(lease, "--lease") if lease else None,
            exist_ok=exist_ok,
        )
        if as_json:
            app.json(
                {
                    "workspace": ws.root,
                    "workspace_id": ws.format.workspace_id,
                    "durable": ws.policy.durable,
                    "lease": ws.policy.lease,
                }
            )
        else:
            mode = "durable" if ws.policy.durable else "non-durable"
            app.echo(f"workspace {ws.root} ({mode}, lease {ws.policy.lease:g}s)")
