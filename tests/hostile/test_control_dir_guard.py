"""The tests' job scripts publish by hand, with mkdir and mv into $FLOW_CONTROL_DIR. Run
outside an attempt (the variable unset or empty) they must stop before acting on any
path: "$FLOW_CONTROL_DIR/outcome.ready" is then /outcome.ready, at the root of the
filesystem, where a CI rehearsal once found such a directory.

mkdir, mv, ln and cp are replaced by shims on PATH that only record their arguments, so
a script that does go wrong is caught without touching the root directory. (A mode that
writes by shell redirection alone, `ready_file`, is left out for that reason.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from manager.support import write_script

from .support import HOSTILE

SHIM = '#!/bin/sh\nprintf "%s\\n" "$(basename "$0") $*" >> "$SHIM_LOG"\nexit 1\n'
#: HOSTILE modes that create or rename something in the control directory
WRITING_MODES = ("good", "garbage", "no_json", "duplicate", "ready_link", "json_link")


def _calls(tmp_path: Path, program: str, control: str | None, **params: str) -> list[str]:
    """What the program asked mkdir/mv/ln/cp to do, run with FLOW_CONTROL_DIR=control."""
    shims = tmp_path / "shims"
    shims.mkdir(exist_ok=True)
    for tool in ("mkdir", "mv", "ln", "cp"):
        (shims / tool).write_text(SHIM)
        (shims / tool).chmod(0o755)
    log = tmp_path / "calls"
    log.unlink(missing_ok=True)
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    env = {
        "PATH": f"{shims}:/usr/bin:/bin",
        "SHIM_LOG": str(log),
        "FLOW_ATTEMPT_ID": "a0001",
        "FLOW_WORKDIR": str(cwd),
        **{f"FLOW_PARAM_{k}": v for k, v in params.items()},
    }
    if control is not None:
        env["FLOW_CONTROL_DIR"] = control
    subprocess.run([program], env=env, cwd=cwd, capture_output=True, timeout=60, check=False)
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("control", [None, ""], ids=["unset", "empty"])
@pytest.mark.parametrize("mode", WRITING_MODES)
def test_the_hostile_job_script_writes_nothing_outside_an_attempt(
    tmp_path: Path, mode: str, control: str | None
) -> None:
    program = write_script(tmp_path / "scripts", "hostile.sh", HOSTILE)
    assert _calls(tmp_path, program, control, mode=mode) == []


def test_the_shims_see_what_the_script_does_inside_an_attempt(tmp_path: Path) -> None:
    """The check above is not vacuous: with a control directory, the calls are recorded."""
    program = write_script(tmp_path / "scripts", "hostile.sh", HOSTILE)
    calls = _calls(tmp_path, program, str(tmp_path / "a0001"), mode="garbage")
    assert calls and calls[0].startswith("mkdir ") and str(tmp_path) in calls[0]


#: the PRELUDE of tests/manager/support.py (every manager test's job script): `set -u` stops
#: an unset FLOW_CONTROL_DIR and `${...:?}` an empty one, which would otherwise make
#: publish() run `mkdir /outcome.tmp.<pid>` and `mv /outcome.tmp.<pid> /outcome.ready`
@pytest.mark.parametrize("control", [None, ""], ids=["unset", "empty"])
def test_the_manager_tests_publish_writes_nothing_outside_an_attempt(
    tmp_path: Path, control: str | None
) -> None:
    program = write_script(tmp_path / "scripts", "ok.sh", 'publish \'{"action":"succeed"}\'\n')
    assert _calls(tmp_path, program, control) == []
