"""The `flow` command group; each command lives in a module of its own."""

from __future__ import annotations

import importlib

import click

from httk_flow import __version__
from httk_flow.cli.app import App
from httk_flow.cli.options import FlowGroup, workspace_option

#: every core command, by name: "module:attr" of its click command in httk_flow.cli. This
#: is the one registry: a command loads only its own module (importing all of them costs
#: every command about 0.1 s). Commands a backend adds are found by listing the backends.
COMMANDS = {
    "allocations": "cmd_alloc:allocations",
    "cancel": "cmd_steer:cancel",
    "demo": "cmd_demo:demo_cmd",
    "fsck": "cmd_fsck:fsck",
    "gc": "cmd_fsck:gc",
    "groups": "cmd_groups:groups",
    "history": "cmd_read:history",
    "init": "cmd_init:init",
    "list": "cmd_read:list_",
    "lock": "cmd_ops:lock",
    "logs": "cmd_steer:logs",
    "managers": "cmd_ops:managers",
    "pause": "cmd_steer:pause",
    "priority": "cmd_steer:priority",
    "release": "cmd_steer:release",
    "requests": "cmd_steer:requests_",
    "resume": "cmd_steer:resume",
    "run": "cmd_serve:run",
    "scale": "cmd_alloc:scale",
    "serve": "cmd_serve:serve",
    "show": "cmd_read:show",
    "status": "cmd_status:status",
    "submit": "cmd_submit:submit",
    "unlock": "cmd_ops:unlock",
    "wait": "cmd_steer:wait",
}


#: how `flow --help` groups the commands, in this order; a command a backend adds (or
#: one missing here) is listed under "Cluster"
SECTIONS = {
    "Submit": ("init", "submit", "demo"),
    "Run": ("serve", "run"),
    "Inspect": (
        "status",
        "groups",
        "list",
        "show",
        "history",
        "logs",
        "wait",
        "managers",
        "requests",
    ),
    "Steer": ("cancel", "pause", "resume", "release", "priority"),
    "Maintain": ("fsck", "gc", "lock", "unlock"),
    "Cluster": ("allocations", "scale"),
}


def load(name: str) -> click.Command:
    """The click command COMMANDS names for `name`."""
    mod, attr = COMMANDS[name].split(":")
    command = getattr(importlib.import_module(f"httk_flow.cli.{mod}"), attr)
    assert isinstance(command, click.Command), COMMANDS[name]
    return command


class LazyGroup(FlowGroup):
    """Imports a command's module the first time the command is asked for; builds the
    commands backends describe when one of them (or the list) is asked for."""

    def _backend_commands(self) -> dict[str, click.Command]:
        from httk_flow.cli.cmd_alloc import backend_command
        from httk_flow.scale.backends import commands

        return {c.name: backend_command(c) for c in commands()}

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS:
            return load(cmd_name)
        return self._backend_commands().get(cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*COMMANDS, *self._backend_commands()])

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands in sections (Submit, Run, Inspect, ...), each with its short help."""
        names = self.list_commands(ctx)
        placed = {n for group in SECTIONS.values() for n in group}
        for title, group in SECTIONS.items():
            members = [n for n in group if n in names]
            if title == "Cluster":
                members = [n for n in names if n not in placed] + members
            rows = []
            limit = formatter.width - 6 - max((len(n) for n in names), default=0)
            for n in members:
                cmd = self.get_command(ctx, n)
                if cmd is not None and not cmd.hidden:
                    rows.append((n, cmd.get_short_help_str(limit=limit)))
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@workspace_option
@click.version_option(__version__, prog_name="flow")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """httk_flow: run thousands to millions of jobs from a shared workspace."""
    ctx.ensure_object(App)


def main() -> None:
    app = App()
    # standalone_mode=False: click would otherwise swallow a BrokenPipeError raised by a bug
    try:
        code = cli.main(obj=app, prog_name="flow", standalone_mode=False)
    except click.ClickException as e:
        e.show()
        raise SystemExit(e.exit_code) from None
    except click.Abort as e:
        if isinstance(e.__cause__ or e.__context__, KeyboardInterrupt):
            app.echo("flow: interrupted", err=True)
            raise SystemExit(130) from None  # 128 + SIGINT, as the shell reports it
        app.echo("flow: aborted", err=True)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        app.echo("flow: interrupted", err=True)
        raise SystemExit(130) from None
    raise SystemExit(code if isinstance(code, int) else 0)
