"""A program the launcher cannot execute fails its job at once, with a code of its own
(program_not_found, program_not_executable) and a message naming it: one attempt, no
retry, no backoff. A program that exits 127 or 126 itself is an ordinary process failure."""

from __future__ import annotations

import os
import time
from pathlib import Path

import orjson
import pytest
from helpers import attempt_output

from httk_flow.ops import lookup
from httk_flow.protocol import jobs
from httk_flow.protocol.jobspec import Program
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace

from .support import Managers, dump, flow, job, submit, write_program, write_script


def stored(root: str, jid: str) -> Path:
    """The stored copy of a job's program."""
    definition = orjson.loads((job(root, jid).job_dir(root) / "job.json").read_bytes())
    return Path(root) / ".flow" / "programs" / definition["program"]["digest"]


def register(root: str, jid: str) -> None:
    ws = Workspace.open(root)
    try:
        jobs.register(ws, lookup.find(ws, jid), actor="test")
    finally:
        ws.close()


def ran_once_and_failed(root: str, jid: str, code: str) -> str:
    info = job(root, jid)
    assert info.state is State.FAILED, dump(root, [jid])
    assert info.failure_code == code, dump(root, [jid])
    assert len(info.attempts) == 1
    assert info.last["failure"]["retryable"] is False
    return str(info.last["failure"]["message"])


def test_a_command_not_on_the_path_of_the_attempt_fails_at_once(
    root: str, managers: Managers
) -> None:
    # a command found when it was submitted, but not where the manager runs
    [jid] = submit(root, Program(command="flow_no_such_command_x", name="flow_no_such_command_x"))
    t0 = time.monotonic()
    assert managers.run(root) == 1
    assert time.monotonic() - t0 < 15
    message = ran_once_and_failed(root, jid, "program_not_found")
    assert message == (
        "the command 'flow_no_such_command_x' was not found on the attempt's PATH; "
        "it was not retried"
    )
    err = attempt_output(job(root, jid).job_dir(root), 1, "stderr")
    assert err == "flow: the program flow_no_such_command_x was not found\n"
    shown = flow("show", "-w", root, jid).stdout
    assert "failure     program_not_found: the command 'flow_no_such_command_x'" in shown


def test_a_stored_program_that_is_gone_or_not_executable_fails_at_once(
    root: str, scripts: Path, managers: Managers
) -> None:
    gone = write_script(scripts, "gone.sh", "exit 0\n")
    [jgone] = submit(root, gone, retries=5)
    plain = write_script(scripts, "plain.sh", "exit 0 # another digest\n")
    [jplain] = submit(root, plain, retries=5)
    register(root, jgone)  # registration looks for the stored copy: it is gone later
    stored(root, jgone).unlink()
    stored(root, jplain).chmod(0o644)
    assert managers.run(root) == 1
    message = ran_once_and_failed(root, jgone, "program_not_found")
    assert message == (
        f"the program 'gone.sh' (stored as {stored(root, jgone)}) was not found; it was not retried"
    )
    message = ran_once_and_failed(root, jplain, "program_not_executable")
    assert message == (
        f"the program 'plain.sh' (stored as {stored(root, jplain)}) is not an executable "
        "file; it was not retried"
    )


@pytest.mark.skipif(
    not os.path.realpath("/bin/sh").endswith("dash"),
    reason="only a shell that runs its EXIT trap after a failed exec (dash) can tell",
)
def test_a_missing_interpreter_fails_at_once_where_the_shell_can_tell(
    root: str, scripts: Path, managers: Managers
) -> None:
    [jid] = submit(root, write_program(scripts, "py.sh", "#!/no/such/interpreter\n"))
    assert managers.run(root) == 1
    message = ran_once_and_failed(root, jid, "program_not_found")
    assert message.endswith(
        "could not be executed: its #! interpreter '/no/such/interpreter' was not found; "
        "it was not retried"
    )


@pytest.mark.parametrize("status", [126, 127])
def test_a_program_that_exits_127_or_126_itself_is_retried_as_any_failure(
    root: str, scripts: Path, managers: Managers, status: int
) -> None:
    [jid] = submit(root, write_script(scripts, "own.sh", f"exit {status}\n"), retries=1)
    assert managers.run(root) == 1
    info = job(root, jid)
    assert info.state is State.FAILED, dump(root, [jid])
    assert info.failure_code == "budget_exhausted"
    assert len(info.attempts) == 2
    assert [a["result"]["exit"] for a in info.attempts] == [status, status]
