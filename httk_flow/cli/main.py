"""The `flow` command group; each command lives in a module of its own."""

from __future__ import annotations

import importlib

import click

from httk_flow import __version__
from httk_flow.cli.app import App
from httk_flow.cli.options import FlowGroup, workspace_option

#: the command modules, and the commands each is known to hold: a command loads only its
#: own module (importing all of them costs every command about 0.1 s); a name missing
#: here (a new command) still works, by loading everything
_MODULES = {
    "cmd_alloc": ("scale", "allocations"),
    "cmd_demo": ("demo",),
    "cmd_fsck": ("fsck", "gc"),
    "cmd_init": ("init",),
    "cmd_ops": ("managers", "lock", "unlock"),
    "cmd_read": ("list", "show", "history", "status"),
    "cmd_serve": ("serve", "run"),
    "cmd_steer": ("cancel", "pause", "resume", "priority", "requests", "wait", "logs"),
    "cmd_submit": ("submit",),
}
_WHERE = {name: mod for mod, names in _MODULES.items() for name in names}


class LazyGroup(FlowGroup):
    """Registers a command module the first time one of its commands is asked for."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._loaded: set[str] = set()
        self._all = False

    def _load(self, mod: str) -> None:
        if mod not in self._loaded:
            self._loaded.add(mod)
            importlib.import_module(f"httk_flow.cli.{mod}").register(self)

    def _load_all(self) -> None:
        if not self._all:
            self._all = True
            for mod in _MODULES:
                self._load(mod)
            from httk_flow.scale.backends import commands as backend_commands

            for command in backend_commands():
                self.add_command(command)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        mod = _WHERE.get(cmd_name)
        if mod is not None:
            self._load(mod)
        found = super().get_command(ctx, cmd_name)
        if found is None:
            self._load_all()
            found = super().get_command(ctx, cmd_name)
        return found

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._load_all()
        return super().list_commands(ctx)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@workspace_option
@click.version_option(__version__, prog_name="flow")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """httk_flow: run thousands to millions of jobs from a shared workspace."""
    ctx.ensure_object(App)


def main() -> None:
    # standalone_mode=False: click would otherwise swallow a BrokenPipeError raised by a bug
    app = App()
    try:
        code = cli.main(obj=app, prog_name="flow", standalone_mode=False)
    except click.ClickException as e:
        e.show()
        raise SystemExit(e.exit_code) from None
    except click.Abort:
        app.echo("flow: aborted", err=True)
        raise SystemExit(1) from None
    raise SystemExit(code if isinstance(code, int) else 0)
