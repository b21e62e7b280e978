"""`flow fsck` and `flow gc`."""

from __future__ import annotations

import click

from httk_flow.cli.app import App
from httk_flow.cli.options import workspace_option
from httk_flow.ops.fsck import Fsck
from httk_flow.ops.gc import collect
from httk_flow.protocol.inputs import human_size


@click.command("fsck")
@click.option("--repair", is_flag=True, help="Fix what is provably safe to fix.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document.")
@workspace_option
@click.pass_obj
def fsck(app: App, /, repair: bool, as_json: bool) -> None:
    """Check markers, payloads and journal agree: exit 0 clean, 1 problems found."""
    r = Fsck(app.ws, repair=repair).run()
    if as_json:
        app.json(
            {
                "clean": r.clean,
                "markers": r.markers,
                "payloads": r.payloads,
                "segments": r.segments,
                "read_only": r.read_only is not None,
                **({"read_only_reason": r.read_only} if r.read_only is not None else {}),
                "problems": [p.to_json() for p in r.problems],
            }
        )
    else:
        if r.read_only is not None:
            app.echo(
                f"read-only: {r.lock} cannot be created ({r.read_only}); checking without repairs"
            )
        app.echo(
            f"checked {r.markers} markers, {r.payloads} payloads, {r.segments} journal segments"
        )
        for p in r.problems:
            mark = "repaired" if p.repaired else "problem"
            app.echo(f"{mark}: {p.kind}: {p.obj}: {p.message}")
        if not r.problems:
            app.echo("clean")
        elif r.fixable and not repair and r.read_only is None:
            app.echo("run `flow fsck --repair` to fix what is safe to fix")
    raise SystemExit(0 if r.clean else 1)


@click.command("gc")
@click.option("--dry-run", is_flag=True, help="Only list what would be collected.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document.")
@workspace_option
@click.pass_obj
def gc(app: App, /, dry_run: bool, as_json: bool) -> None:
    """Collect old attempt directories, journal and log segments per the retention policy."""
    r = collect(app.ws, dry_run=dry_run)
    if as_json:
        app.json(
            {
                "dry_run": dry_run,
                "bytes": r.bytes,
                "kept_segments": r.kept_segments,
                "misplaced": r.misplaced,
                "collected": [i.to_json() for i in r.items],
            }
        )
        return
    if r.misplaced:
        app.warn(
            f"{r.misplaced} marker(s) lie outside the directory their class places them in: "
            "their histories are kept and no streamed output was collected; run "
            "`flow fsck --repair` to put them back"
        )
    verb = "would collect" if dry_run else "collected"
    for i in r.items:
        app.echo(f"{verb}: {i.kind} {i.path} ({human_size(i.bytes)})")
    app.echo(
        f"{verb} {len(r.items)} item(s), {human_size(r.bytes)}; "
        f"kept {r.kept_segments} journal segment(s)"
    )
