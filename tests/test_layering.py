"""The architecture as a test: the layers are packages, and their imports point
cli -> ops / manager / scale / runner -> protocol, never back (docs/architecture.md)."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

PKG = pathlib.Path(__file__).resolve().parent.parent / "httk_flow"
#: protocol internals the CLI must reach only through the package's public functions
CLI_FORBIDDEN = (
    "httk_flow.protocol.journal",
    "httk_flow.protocol.fsio",
    "httk_flow.protocol.discovery",
    "httk_flow.protocol.crash",
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


#: what each layer package may import besides itself and httk_flow.errors: arrows point
#: down, cli -> ops / manager / scale / runner -> protocol, never back
MAY_IMPORT = {
    "protocol": (),
    "manager": ("httk_flow.protocol",),
    "runner": ("httk_flow.protocol",),
    "ops": (
        "httk_flow.protocol",
        # status names a paused allocation queue among the reasons work is blocked
        "httk_flow.scale.allocation_records",
    ),
    "scale": (
        "httk_flow.protocol",
        # the reconciler sizes its demand from the workspace's status
        "httk_flow.ops.status",
    ),
}


def _layer_of(imp: str) -> str:
    parts = imp.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PKG / parts[1]).is_dir()) else ""


@pytest.mark.parametrize("layer", sorted(MAY_IMPORT))
def test_each_layer_imports_only_what_lies_below_it(layer: str) -> None:
    allowed = (f"httk_flow.{layer}", "httk_flow.errors", *MAY_IMPORT[layer])
    bad = []
    for p in modules(layer):
        for imp in imports_of(p):
            if not imp.startswith("httk_flow.") or imp == "httk_flow.__version__":
                continue
            if _layer_of(imp) == "" and imp.split(".")[1] != "errors":
                bad.append((str(p.relative_to(PKG)), imp))  # a module outside every layer
            elif not any(imp == a or imp.startswith(a + ".") for a in allowed):
                bad.append((str(p.relative_to(PKG)), imp))
    assert bad == []


#: what only the CLI may import: the package below it neither parses flags nor draws
#: (ops reports progress through callbacks; the CLI decides how to show it)
CLI_ONLY = ("click", "rich")


def test_only_the_cli_imports_click_or_rich() -> None:
    bad = [
        (str(p.relative_to(PKG)), imp)
        for p in PKG.rglob("*.py")
        if PKG / "cli" not in p.parents
        for imp in imports_of(p)
        if imp.split(".")[0] in CLI_ONLY
    ]
    assert bad == []


def _sleeps_or_spins(path: pathlib.Path) -> list[str]:
    """Calls of time.sleep (however imported) and `while True` loops in one module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    sleep_names = {"time.sleep"} | {
        a.asname or a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "time"
        for a in node.names
        if a.name == "sleep"
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in sleep_names:
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node.func)}()")
        elif (
            isinstance(node, ast.While)
            and isinstance(node.test, ast.Constant)
            and bool(node.test.value)
        ):
            found.append(f"{path.name}:{node.lineno}: while {node.test.value!r}")
    return found


def test_the_cli_polls_nowhere() -> None:
    """Every wait (status --watch, flow wait, logs --follow, a backend's answer) is the
    package's: the CLI renders what a package generator or callback hands it."""
    assert [hit for p in modules("cli") for hit in _sleeps_or_spins(p)] == []


def test_the_poll_check_sees_what_it_looks_for(tmp_path: pathlib.Path) -> None:
    spin = tmp_path / "spin.py"
    spin.write_text("import time\nfrom time import sleep as nap\nwhile True:\n    nap(1)\n")
    assert _sleeps_or_spins(spin) == ["spin.py:3: while True", "spin.py:4: nap()"]
    spin.write_text("import time\nwhile 1:\n    time.sleep(1)\n")
    assert _sleeps_or_spins(spin) == ["spin.py:2: while 1", "spin.py:3: time.sleep()"]


def test_errors_are_printed_by_the_app_alone() -> None:
    """`flow: error: ...` has one renderer (App.error); every other module raises."""
    printers = [p.name for p in modules("cli") if "flow: error" in p.read_text()]
    assert printers == ["app.py"]


def test_only_the_package_root_and_the_layers_hold_modules() -> None:
    loose = sorted(p.name for p in PKG.glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "errors.py"]


def test_no_two_modules_import_each_other() -> None:
    graph: dict[str, set[str]] = {}
    for p in PKG.rglob("*.py"):
        rel = p.relative_to(PKG.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        graph[name] = {i for i in imports_of(p) if i.startswith("httk_flow.")}
    # a package and its own submodules may name each other: that is one module's inside
    cycles = sorted(
        (a, b)
        for a, deps in graph.items()
        for b in deps
        if b in graph and a in graph[b] and a < b and not b.startswith(a + ".")
    )
    assert cycles == []


def test_no_module_grows_past_five_hundred_lines() -> None:
    long = [(p.name, n) for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > 500]
    assert long == []


#: words that name a batch system; only its backend package may use them
SCHEDULER_WORDS = ("slurm", "sbatch", "squeue", "scancel", "scontrol", "sacct", "srun", "partition")


def test_no_scheduler_is_named_outside_its_backend_package() -> None:
    backend = PKG / "scale" / "backends" / "slurm"
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


def test_the_lazy_table_is_the_one_registry_of_the_core_commands() -> None:
    """cli/main finds each command through its name -> "module:attr" table: every entry is
    a click command of that name, and every command a cli module defines is in the table
    (a command missing from it would be unreachable)."""
    import importlib

    import click

    from httk_flow.cli import main

    for name, where in main.COMMANDS.items():
        mod, attr = where.split(":")
        command = getattr(importlib.import_module(f"httk_flow.cli.{mod}"), attr)
        assert isinstance(command, click.Command) and command.name == name, where
    defined = {
        f"{p.stem}:{attr}"
        for p in modules("cli")
        for attr, value in vars(importlib.import_module(f"httk_flow.cli.{p.stem}")).items()
        if isinstance(value, click.Command)
        and getattr(value.callback, "__module__", None) == f"httk_flow.cli.{p.stem}"
    }
    assert defined - {"main:cli"} == set(main.COMMANDS.values())
