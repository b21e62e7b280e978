"""`flow init`."""

from __future__ import annotations

import os
from pathlib import Path

import click

from httk_flow.cli.app import App
from httk_flow.cli.options import workspace_option
from httk_flow.errors import UsageError
from httk_flow.protocol import layout
from httk_flow.protocol.durations import parse_duration
from httk_flow.protocol.workspace import FLOW_DIR, Workspace


def enclosing_workspace(path: str) -> str | None:
    """The nearest workspace root strictly above `path`, or None.

    Refuses a `path` inside that workspace's own `.flow` directory."""
    here = Path(path).resolve()
    for d in here.parents:
        if os.path.isfile(layout.format_file(str(d))):
            if here.is_relative_to(d / FLOW_DIR):
                raise UsageError(
                    f"is inside the {FLOW_DIR} directory of workspace {d}",
                    obj=os.path.abspath(path),
                    hint="create the workspace somewhere else",
                )
            return str(d)
    return None


@click.command("init")
@click.argument("path", default=".", type=click.Path(file_okay=False))
@click.option("--durable/--no-durable", default=False, help="fsync every publish (slower).")
@click.option(
    "--lease", default=None, help="Manager lease, e.g. 30s or 2m (default 30s, at least 1s)."
)
@click.option(
    "--keep-attempt-files",
    is_flag=True,
    help="Keep every file of a finished attempt (by default context.json, outcome.line "
    "and empty output are removed at its commit: fewer inodes).",
)
@click.option(
    "--logs",
    type=click.Choice(["files", "stream"]),
    default="files",
    show_default=True,
    help="Where a finished attempt's output lives: its own files, or appended to the "
    "manager's log segments at its commit (a finished job is then three inodes; "
    "`flow logs` reads it back either way).",
)
@click.option(
    "--class-dirs/--no-class-dirs",
    default=True,
    show_default=True,
    help="Keep the ready jobs of each pool and capability class in a directory of their "
    "own, so a manager never lists another pool's backlog; --no-class-dirs keeps the "
    "layout that httk_flow before protocol revision 8 reads.",
)
@click.option("--exist-ok", is_flag=True, help="Accept an existing workspace.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document.")
@workspace_option
@click.pass_obj
def init(
    app: App,
    /,
    path: str,
    durable: bool,
    lease: str | None,
    keep_attempt_files: bool,
    logs: str,
    class_dirs: bool,
    exist_ok: bool,
    as_json: bool,
) -> None:
    """Create a workspace in PATH (default: the current directory).

    Inside another workspace's tree it warns, naming that workspace; inside a
    workspace's .flow directory it refuses."""
    outer = enclosing_workspace(path)
    existed = os.path.isfile(layout.format_file(path))
    ws = Workspace.create(
        path,
        durable=durable,
        lease=parse_duration(lease, "--lease") if lease else None,
        exist_ok=exist_ok,
        keep_attempt_files=keep_attempt_files,
        logs=logs,
        class_dirs=class_dirs,
    )
    if outer is not None and not existed:
        app.warn(
            f"{ws.root} is inside workspace {outer}; "
            "commands run below it now find the new workspace, not that one"
        )
    if as_json:
        app.json(
            {
                "workspace": ws.root,
                "workspace_id": ws.format.workspace_id,
                "durable": ws.policy.durable,
                "lease": ws.policy.lease,
                "keep_attempt_files": ws.policy.keep_attempt_files,
                "logs": ws.policy.logs,
                "class_dirs": ws.policy.class_dirs,
            }
        )
    else:
        mode = "durable" if ws.policy.durable else "non-durable"
        logs = ", output streamed to log segments" if ws.policy.logs == "stream" else ""
        app.echo(f"workspace {ws.root} ({mode}, lease {ws.policy.lease:g}s{logs})")
