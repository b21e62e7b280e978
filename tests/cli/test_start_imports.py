"""What a command imports is what every start of it pays: `flow run` off a terminal leaves
out what only its live panel needs (docs/benchmarks.md: a start's costs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

#: writes, at exit, the modules this interpreter has imported (argv: the file, then the
#: flow arguments)
_AT_EXIT = """
import atexit, pathlib, sys
out = pathlib.Path(sys.argv[1])
atexit.register(lambda: out.write_text("\\n".join(sorted(sys.modules))))
sys.argv = ["flow", *sys.argv[2:]]
from httk_flow.cli.main import main
main()
"""


def modules_of(tmp: Path, *args: str) -> set[str]:
    """The modules a `flow` command imports, beyond those of a bare interpreter here
    (a site's own hooks may import anything)."""
    bare = subprocess.run(
        [sys.executable, "-c", "import sys; print('\\n'.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    out = tmp / "modules"
    ran = subprocess.run(
        [sys.executable, "-c", _AT_EXIT, str(out), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    return set(out.read_text().split()) - set(bare)


def test_flow_run_off_a_terminal_imports_no_status_report(ws: str, tmp_path: Path) -> None:
    got = modules_of(tmp_path, "-w", ws, "run", "--idle", "0", "--quiet")
    assert "httk_flow.manager.loop" in got  # it did run a manager
    # the live panel's status report is drawn only on a terminal
    assert "httk_flow.ops.status" not in got


def test_the_check_sees_what_a_command_does_import(ws: str, tmp_path: Path) -> None:
    assert "httk_flow.ops.status" in modules_of(tmp_path, "-w", ws, "status")
