"""The architecture as a test: dependencies point cli -> manager -> protocol, never back."""

from __future__ import annotations

import ast
import pathlib
import re

PKG = pathlib.Path(__file__).resolve().parent.parent / "httk_flow"
#: protocol internals the CLI must reach only through the package's public functions
CLI_FORBIDDEN = (
    "httk_flow.journal",
    "httk_flow.fsio",
    "httk_flow.discovery",
    "httk_flow.crash",
    "httk_flow.manager.passes",
    "httk_flow.manager.local",
    "httk_flow.manager.launcher",
    "httk_flow.manager.commit",
    "httk_flow.manager.attempts",
    "httk_flow.manager.decide",
    "httk_flow.manager.owners",
)


def imports_of(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def modules(sub: str) -> list[pathlib.Path]:
    return sorted((PKG / sub).rglob("*.py")) if sub else sorted(PKG.glob("*.py"))


def test_the_cli_reaches_no_protocol_internals() -> None:
    bad = [
        (p.name, imp)
        for p in modules("cli")
        for imp in imports_of(p)
        if any(imp == f or imp.startswith(f + ".") for f in CLI_FORBIDDEN)
    ]
    assert bad == []


def test_the_cli_never_builds_a_marker_path_itself() -> None:
    for p in modules("cli"):
        text = p.read_text()
        assert ".flow/state" not in text and "state_dir(" not in text, p.name
        assert "marker_path(" not in text and "os.rename" not in text, p.name


def test_protocol_modules_import_neither_the_manager_nor_the_cli() -> None:
    bad = [
        (p.name, imp)
        for p in modules("")
        if p.name not in ("__main__.py", "demo.py")
        for imp in imports_of(p)
        if imp.startswith(("httk_flow.manager", "httk_flow.cli"))
    ]
    assert bad == []


def test_the_manager_never_imports_the_cli() -> None:
    bad = [
        (p.name, imp)
        for p in modules("manager")
        for imp in imports_of(p)
        if imp.startswith("httk_flow.cli")
    ]
    assert bad == []


def test_no_module_grows_past_five_hundred_lines() -> None:
    long = [(p.name, n) for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > 500]
    assert long == []


#: words that name a batch system; only its backend package may use them
SCHEDULER_WORDS = ("slurm", "sbatch", "squeue", "scancel", "scontrol", "sacct", "srun", "partition")


def test_no_scheduler_is_named_outside_its_backend_package() -> None:
    backend = PKG / "backends" / "slurm"
    offenders = []
    for p in PKG.rglob("*"):
        if not p.is_file() or p.suffix not in (".py", ".sh") or backend in p.parents:
            continue
        text = p.read_text(errors="replace").lower()
        offenders += [
            (str(p.relative_to(PKG)), w)
            for w in SCHEDULER_WORDS
            if re.search(rf"(?<![a-z.]){w}(?!\()", text)
        ]
    assert offenders == []


def test_the_lazy_cli_knows_which_module_holds_each_core_command() -> None:
    """cli/main loads one command module per command by its table; a stale entry would
    still work (everything is loaded as a fallback) but lose the speed, so keep it true."""
    import click

    from httk_flow.cli import main

    for mod, commands in main._MODULES.items():
        group = click.Group()
        __import__(f"httk_flow.cli.{mod}", fromlist=["register"]).register(group)
        assert sorted(group.commands) == sorted(commands), mod
