"""The bash launcher (protocol 2, §9): a program whose #! line names bash with no option is
started as `bash PROGRAM ARGS`, bash sourcing shell/flow-gate.sh (BASH_ENV) before the
program's first line. It must hold exactly as the /bin/sh launcher does: nothing of the
program runs before the gate opens (or ever, when it closes unopened), a program that cannot
run is said in exec.failed with 127/126, and the program sees what a normal exec gives it
($0, "$@", cwd, stdin) and nothing of the gate (BASH_ENV, _FLOW_GATE_*) in its children.

Both launchers are driven here directly (httk_flow.manager.launcher.launch), and through
real managers."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from helpers import wait_for

from httk_flow.manager import interp
from httk_flow.manager.interp import bash_for
from httk_flow.manager.launcher import (
    GATE_CLOSED,
    GATE_FD,
    NOT_EXECUTABLE,
    NOT_FOUND,
    LaunchedProcess,
    launch,
    read_exec_failure,
)
from httk_flow.protocol.states import State

from .support import Managers, dump, job, log_of, processes_of, submit, write_program

PATH = os.environ.get("PATH", os.defpath)
BASH = shutil.which("bash", path=PATH)
assert BASH is not None, "bash is needed by the bash API and its tests"
#: every name the gate adds to the environment it is started with
GATE_NAMES = (
    "BASH_ENV",
    "FLOW_LAUNCH_CONTEXT",
    *(f"_FLOW_GATE_{n}" for n in ("OUT", "ERR", "CTX", "CWD", "FAIL")),
)


class Attempt:
    """A fake attempt directory, a workdir, and the processes launched into them."""

    def __init__(self, tmp: Path) -> None:
        self.dir = tmp / "attempt"
        self.dir.mkdir()
        self.work = tmp / "work dir"  # a blank in the name: quoted everywhere
        self.work.mkdir()
        self.launched: list[LaunchedProcess] = []

    def launch(
        self,
        program: str,
        *args: str,
        bash: str | None,
        context: tuple[str, str] | None = None,
        env: dict[str, str] | None = None,
    ) -> LaunchedProcess:
        p = launch(
            [program, *args],
            cwd=str(self.work),
            env={"PATH": PATH, "LANG": "C.UTF-8", **(env or {})},
            stdout=str(self.dir / "stdout"),
            stderr=str(self.dir / "stderr"),
            exec_failure=str(self.dir / "exec.failed"),
            context=context,
            bash=bash,
        )
        self.launched.append(p)
        return p

    def run(self, program: str, *args: str, bash: str | None, **kw: object) -> int:
        """Launch, open the gate, wait: the exit status."""
        p = self.launch(program, *args, bash=bash, **kw)  # type: ignore[arg-type]
        assert p.open_gate()
        return p.wait()

    def out(self) -> str:
        return (self.dir / "stdout").read_text()

    def err(self) -> str:
        return (self.dir / "stderr").read_text()

    def close(self) -> None:
        for p in self.launched:
            if p.returncode is None and p.poll() is None:
                p.signal_group(signal.SIGKILL)
                p.wait()
            p.close()


@pytest.fixture
def attempt(tmp_path: Path) -> Iterator[Attempt]:
    a = Attempt(tmp_path)
    try:
        yield a
    finally:
        a.close()


def program(tmp_path: Path, body: str, *, shebang: str = "#!/usr/bin/env bash") -> str:
    return write_program(tmp_path / "bin", "prog.sh", f"{shebang}\n{body}")


#: the two launchers of the same program: bash directly (the gate), or /bin/sh
LAUNCHERS = ["bash", "sh"]


def launcher_of(which: str, prog: str) -> str | None:
    """The `bash` argument of launch() for this launcher; the bash one must be taken."""
    if which == "sh":
        return None
    found = bash_for(prog, PATH)
    assert found is not None, f"bash_for did not take {prog}"
    return found


# -- which programs bash takes ------------------------------------------------------------


@pytest.mark.parametrize(
    ("shebang", "taken"),
    [
        ("#!/usr/bin/env bash", "which"),
        ("#!/usr/bin/env  bash  ", "which"),
        ("#! /bin/bash", "/bin/bash"),
        ("#!/bin/bash", "/bin/bash"),
        (f"#!{BASH}", BASH),
        ("#!/bin/sh", None),
        ("#!/usr/bin/env sh", None),
        ("#!/usr/bin/env python3", None),
        ("#!/usr/bin/env bash -e", None),
        ("#!/usr/bin/env -S bash -e", None),
        ("#!/bin/bash -e", None),
        ("#!/bin/bash --posix", None),
        ("#!/opt/no/such/bash", None),
        ("#!/bin/rbash-like", None),
        ("echo no shebang", None),
    ],
)
def test_bash_is_taken_only_for_a_bash_with_no_option(
    tmp_path: Path, shebang: str, taken: str | None
) -> None:
    prog = program(tmp_path, "exit 0\n", shebang=shebang)
    expected = shutil.which("bash", path=PATH) if taken == "which" else taken
    assert bash_for(prog, PATH) == (os.path.abspath(expected) if expected else None)


def test_bash_is_not_taken_for_a_relative_name_or_a_file_that_cannot_run(tmp_path: Path) -> None:
    prog = program(tmp_path, "exit 0\n")
    assert bash_for(prog, PATH) is not None
    assert bash_for(os.path.relpath(prog), PATH) is None
    plain = write_program(tmp_path / "bin", "plain.sh", "#!/usr/bin/env bash\n")
    os.chmod(plain, 0o644)
    assert bash_for(plain, PATH) is None
    assert bash_for(str(tmp_path / "bin" / "missing.sh"), PATH) is None
    assert bash_for(str(tmp_path / "bin"), PATH) is None
    # env(1) finds bash on the attempt's PATH: none there, none taken
    empty = tmp_path / "empty"
    empty.mkdir()
    assert bash_for(prog, str(empty)) is None


@pytest.mark.parametrize("shebang", ["#!/bin/bash\r", "#!/usr/bin/env bash\r"])
def test_a_crlf_shebang_is_not_taken_for_bash(tmp_path: Path, shebang: str) -> None:
    # the kernel reads "/bin/bash\r" (or env's "bash\r") as the interpreter, which does
    # not exist: such a program never runs, and it must not run under bash either
    prog = program(tmp_path, f"touch '{tmp_path}/ran'\r\n", shebang=shebang)
    try:
        subprocess.run([prog], capture_output=True, check=False)
    except FileNotFoundError:
        pass  # execve: ENOENT, for the interpreter
    assert not (tmp_path / "ran").exists()
    assert bash_for(prog, PATH) is None


def test_a_crlf_bash_program_fails_as_not_found_through_a_manager(
    root: str, scripts: Path, managers: Managers
) -> None:
    # submission refuses one (tests/cli/test_program_files.py); one stored by an earlier
    # flow, or changed in the store since, must still never run, under bash or otherwise
    ran = scripts / "ran"
    prog = write_program(scripts, "crlf.sh", f"#!/bin/bash\ntouch '{ran}'\nexit 0\n")
    [jid] = submit(root, prog, retries=2)
    definition = orjson.loads((job(root, jid).job_dir(root) / "job.json").read_bytes())
    stored = Path(root) / ".flow" / "programs" / definition["program"]["digest"]
    stored.write_bytes(f"#!/bin/bash\r\ntouch '{ran}'\r\nexit 0\r\n".encode())
    assert managers.run(root) == 1
    info = job(root, jid)
    assert (info.state, info.failure_code) == (State.FAILED, "program_not_found"), dump(root)
    assert not ran.exists()
    if os.path.realpath("/bin/sh").endswith("dash"):  # a shell that can tell the exec failed
        assert str(info.last["failure"]["message"]).endswith(
            "could not be executed: its #! line ends in a carriage return (the file was saved "
            "with Windows line endings: convert it with dos2unix); it was not retried"
        )


def test_a_manager_with_a_bash_env_of_its_own_never_gates_through_bash(tmp_path: Path) -> None:
    prog = program(tmp_path, "exit 0\n")
    assert interp.can_gate_bash() and bash_for(prog, PATH) is not None
    code = "import sys\nfrom httk_flow.manager import interp\nprint(interp.bash_for(*sys.argv[1:]))"
    env = {**os.environ, "BASH_ENV": str(tmp_path / "mine.sh")}
    done = subprocess.run(
        [sys.executable, "-c", code, prog, PATH], env=env, capture_output=True, text=True
    )
    assert (done.returncode, done.stdout) == (0, "None\n"), done.stderr


# -- the gate -------------------------------------------------------------------------------


@pytest.mark.parametrize("which", LAUNCHERS)
def test_a_gate_closed_unopened_never_runs_the_first_line(
    tmp_path: Path, attempt: Attempt, which: str
) -> None:
    side = tmp_path / "side-effect"
    prog = program(tmp_path, f"touch '{side}'\n")
    p = attempt.launch(prog, bash=launcher_of(which, prog))
    # the launcher opens its output files before it waits on the gate
    wait_for(lambda: (attempt.dir / "stderr").exists(), 10)
    time.sleep(0.2)
    assert p.poll() is None, "the launcher must wait on its gate"
    p.close_gate()
    assert p.wait() == GATE_CLOSED
    assert not side.exists()
    assert attempt.out() == "" and attempt.err() == ""
    assert not (attempt.dir / "exec.failed").exists()


@pytest.mark.parametrize("which", LAUNCHERS)
def test_the_program_runs_only_once_the_gate_opens(
    tmp_path: Path, attempt: Attempt, which: str
) -> None:
    side = tmp_path / "side-effect"
    prog = program(tmp_path, f"touch '{side}'\necho ran\n")
    p = attempt.launch(prog, bash=launcher_of(which, prog))
    time.sleep(0.3)
    assert p.poll() is None and not side.exists()
    assert p.open_gate()
    assert p.wait() == 0
    assert side.exists() and attempt.out() == "ran\n"


#: what a program can see of how it was started
SHOW = r"""printf 'line=%s\n' "$LINENO"
printf '0=%s\n' "$0"
printf 'source=%s\n' "${BASH_SOURCE[0]}"
printf 'argc=%s\n' "$#"
for a in "$@"; do printf 'arg=<%s>\n' "$a"; done
printf 'pwd=%s\n' "$PWD"
if read -r x; then echo "stdin=<$x>"; else echo stdin=eof; fi
printf 'opts=%s\n' "$-"
printf 'shlvl=%s\n' "$SHLVL"
"""
ARGS = ("two words", "", "*", "-e", "line\nbreak", "$HOME")


@pytest.mark.parametrize("which", LAUNCHERS)
def test_the_program_sees_its_path_arguments_and_workdir_as_with_a_normal_exec(
    tmp_path: Path, attempt: Attempt, which: str
) -> None:
    prog = program(tmp_path, SHOW)
    assert attempt.run(prog, *ARGS, bash=launcher_of(which, prog)) == 0, attempt.err()
    # the kernel's #! run of the same program, in the same directory, stdin at EOF
    direct = subprocess.run(
        [prog, *ARGS],
        cwd=str(attempt.work),
        env={"PATH": PATH, "LANG": "C.UTF-8"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    assert direct.returncode == 0, direct.stderr
    assert attempt.out() == direct.stdout
    assert "line=2\n" in direct.stdout and f"0={prog}\n" in direct.stdout
    assert attempt.err() == ""


#: notes what its child processes and the program itself see of the gate
ENVIRONMENTS = r"""env -0 >"$FLOW_OUT/child.env"
bash -c 'compgen -v' >"$FLOW_OUT/child.vars"
compgen -v >"$FLOW_OUT/own.vars"
cat /proc/$$/environ >"$FLOW_OUT/exec.env"
"""


def env_names(raw: bytes) -> dict[str, str]:
    pairs = (e.split("=", 1) for e in raw.decode().split("\0") if e)
    return {k: v for k, v in pairs}


def test_the_gate_leaves_nothing_of_itself_to_the_program_or_its_children(
    tmp_path: Path, attempt: Attempt
) -> None:
    prog = program(tmp_path, ENVIRONMENTS)
    ctx = attempt.dir / "context.json"
    env = {"FLOW_OUT": str(tmp_path), "FLOW_KEEP": "kept"}
    rc = attempt.run(prog, bash=launcher_of("bash", prog), context=(str(ctx), '{"a":1}'), env=env)
    assert rc == 0, attempt.err()
    assert ctx.read_text() == '{"a":1}'
    # started by bash on the gate: its exec environment named flow-gate.sh
    started = env_names((tmp_path / "exec.env").read_bytes())
    assert started["BASH_ENV"] == f"/dev/fd/{GATE_FD}" and "_FLOW_GATE_OUT" in started
    child = env_names((tmp_path / "child.env").read_bytes())
    assert child["FLOW_KEEP"] == "kept"
    assert [n for n in GATE_NAMES if n in child] == []
    for listing in ("child.vars", "own.vars"):
        names = set((tmp_path / listing).read_text().split())
        assert "FLOW_KEEP" in names
        assert [n for n in GATE_NAMES if n in names] == [], listing


@pytest.mark.parametrize("which", LAUNCHERS)
@pytest.mark.parametrize("how", ["gone", "not_executable"])
def test_a_program_that_vanished_or_cannot_be_executed_is_said_with_126_or_127(
    tmp_path: Path, attempt: Attempt, which: str, how: str
) -> None:
    side = tmp_path / "side-effect"
    prog = program(tmp_path, f"touch '{side}'\n")
    bash = launcher_of(which, prog)  # taken while the program was there and executable
    if how == "gone":
        os.unlink(prog)
    else:
        os.chmod(prog, 0o644)
    rc = attempt.run(prog, bash=bash)
    word, status, said = {
        "gone": (NOT_FOUND, 127, "was not found"),
        "not_executable": (NOT_EXECUTABLE, 126, "is not an executable file"),
    }[how]
    assert rc == status, attempt.err()
    assert (attempt.dir / "exec.failed").read_text() == f"{word} {prog}\n"
    assert read_exec_failure(str(attempt.dir / "exec.failed"), rc) == (word, False)
    assert attempt.err() == f"flow: the program {prog} {said}\n"
    assert not side.exists()


@pytest.mark.parametrize("which", LAUNCHERS)
@pytest.mark.parametrize("status", [126, 127])
def test_a_program_s_own_exit_126_or_127_is_its_own(
    tmp_path: Path, attempt: Attempt, which: str, status: int
) -> None:
    prog = program(tmp_path, f"echo mine\nexit {status}\n")
    assert attempt.run(prog, bash=launcher_of(which, prog)) == status
    assert attempt.out() == "mine\n"
    assert not (attempt.dir / "exec.failed").exists()
    assert read_exec_failure(str(attempt.dir / "exec.failed"), status) is None


@pytest.mark.parametrize("which", LAUNCHERS)
def test_output_that_cannot_be_opened_ends_either_launcher_with_126_before_the_program(
    tmp_path: Path, which: str
) -> None:
    # /bin/sh (dash) ends at once, with 2, on a failed redirection of the special builtin
    # exec unless `command` takes that away: the launcher must say 126 like bash's gate
    side = tmp_path / "side-effect"
    prog = program(tmp_path, f"touch '{side}'\n")
    work = tmp_path / "work"
    work.mkdir()
    p = launch(
        [prog],
        cwd=str(work),
        env={"PATH": PATH, "LANG": "C.UTF-8"},
        stdout=str(tmp_path / "no-such-dir" / "stdout"),
        stderr=str(tmp_path / "stderr"),
        exec_failure=str(tmp_path / "exec.failed"),
        bash=launcher_of(which, prog),
    )
    try:
        p.open_gate()
        assert p.wait() == 126
    finally:
        p.close()
    assert not side.exists()


# -- through real managers ------------------------------------------------------------------

#: the first line after #! leaves a mark; the environment is noted; a0001 of a job whose
#: $FLOW_PARAM_fail is 1 exits 3 (a process failure, retried)
MARKS = r"""#!/bin/bash
echo "$FLOW_ATTEMPT_ID" >>"$FLOW_WORKDIR/ran"
tr '\0' '\n' </proc/$$/environ | grep '^BASH_ENV=' >"$FLOW_WORKDIR/exec.$FLOW_ATTEMPT_ID" || true
env | grep -E '^(BASH_ENV|_FLOW_GATE_|FLOW_LAUNCH_CONTEXT)' \
    >"$FLOW_WORKDIR/env.$FLOW_ATTEMPT_ID" || true
printf '%s' "${FLOW_PREVIOUS_END-(unset)}" >"$FLOW_WORKDIR/previous.$FLOW_ATTEMPT_ID"
cp "$FLOW_CONTEXT" "$FLOW_WORKDIR/context.$FLOW_ATTEMPT_ID"
[[ ${FLOW_PARAM_fail-0} == 1 && $FLOW_ATTEMPT_ID == a0001 ]] && exit 3
exit 0
"""


@pytest.mark.parametrize("point", ["launch.after_spawn", "launch.after_running"])
def test_a_bash_program_whose_manager_dies_before_the_gate_never_runs(
    root: str, scripts: Path, managers: Managers, point: str
) -> None:
    prog = write_program(scripts, "marks.sh", MARKS)
    assert bash_for(prog, PATH) == "/bin/bash"
    [jid] = submit(root, prog)
    first = managers.start(root, env={"FLOW_CRASH_AT": f"{point}:1"})
    assert first.wait(60) == -signal.SIGKILL, log_of(first)
    # the gated launcher sees its gate close, and ends before the program's first line
    wait_for(lambda: not processes_of(root), 10)
    run = job(root, jid).job_dir(root) / "run"
    assert not (run / "ran").exists()
    # the next manager runs it, once
    assert managers.run(root) == 0, log_of(managers.procs[-1])
    info = job(root, jid)
    assert info.state is State.SUCCEEDED, dump(root, [jid])
    [ran] = (run / "ran").read_text().splitlines()
    assert (run / f"exec.{ran}").read_text() == f"BASH_ENV=/dev/fd/{GATE_FD}\n"
    assert (run / f"env.{ran}").read_text() == ""


def test_a_retried_bash_program_is_told_how_its_previous_try_ended(
    root: str, scripts: Path, managers: Managers
) -> None:
    prog = write_program(scripts, "marks.sh", MARKS)
    [jid] = submit(root, prog, params={"fail": "1"}, retries=1)
    assert managers.run(root) == 0
    info = job(root, jid)
    assert info.state is State.SUCCEEDED, dump(root, [jid])
    run = info.job_dir(root) / "run"
    assert (run / "ran").read_text() == "a0001\na0002\n"
    assert (run / "previous.a0001").read_text() == "(unset)"
    first_end = info.commits()[0]["why"]
    assert first_end == "process failure: exit status 3"
    assert (run / "previous.a0002").read_text() == first_end
    for a in ("a0001", "a0002"):
        assert (run / f"exec.{a}").read_text() == f"BASH_ENV=/dev/fd/{GATE_FD}\n"
        assert (run / f"env.{a}").read_text() == ""
        # the attempt found its context.json; its commit tidied it away
        context = orjson.loads((run / f"context.{a}").read_bytes())
        assert context["attempt_id"] == a
        assert not (info.job_dir(root) / a / "context.json").exists()
    assert orjson.loads((run / "context.a0002").read_bytes())["previous_end"] == first_end


# -- environments under which bash would skip the gate ---------------------------------------

#: each makes bash skip BASH_ENV, or run something else in place of a command the gate uses
UNGATED = {
    "POSIXLY_CORRECT": {"POSIXLY_CORRECT": "1"},
    "SHELLOPTS posix": {"SHELLOPTS": "braceexpand:posix"},
    "an exported read": {"BASH_FUNC_read%%": "() { :; }"},
}


@pytest.mark.parametrize("extra", list(UNGATED.values()), ids=list(UNGATED))
def test_an_environment_that_would_skip_the_gate_is_never_launched_through_bash(
    tmp_path: Path, extra: dict[str, str]
) -> None:
    """bash itself really lets the program run past a closed gate there (shown with a copy
    of the gate's read), so such an environment goes through the /bin/sh launcher."""
    mark = tmp_path / "ran"
    gate = tmp_path / "gate.sh"
    gate.write_text(f"read -r _ || exit {GATE_CLOSED}\n")
    prog = program(tmp_path, f'echo yes >"{mark}"\n', shebang="#!/bin/bash")
    base = {"PATH": PATH, "BASH_ENV": str(gate)}
    held = subprocess.run([BASH, prog], env=base, stdin=subprocess.DEVNULL)
    assert held.returncode == GATE_CLOSED and not mark.exists()
    skipped = subprocess.run([BASH, prog], env={**base, **extra}, stdin=subprocess.DEVNULL)
    assert skipped.returncode == 0 and mark.exists()  # the program ran: no gate held it
    assert interp.gates_in({"PATH": PATH})
    assert not interp.gates_in({"PATH": PATH, **extra})


@pytest.mark.parametrize(
    "extra",
    [{"BASH_ENV": "/dev/null"}, {"BASHOPTS": "extglob"}, {"BASH_FUNC_cd%%": "() { :; }"}],
    ids=["a BASH_ENV of its own", "BASHOPTS", "an exported cd"],
)
def test_other_environments_that_change_what_the_gate_runs_go_through_sh(
    extra: dict[str, str],
) -> None:
    assert not interp.gates_in({"PATH": PATH, **extra})


def test_an_exported_return_would_end_the_gate_in_the_wrong_place(
    tmp_path: Path, attempt: Attempt
) -> None:
    """The gate ends its plain path with `return`, so bash never parses its failure branch:
    an exported function named return would run on into that branch, and the program would
    never start. Such an environment goes through /bin/sh."""
    prog = program(tmp_path, "echo ran\n")
    shadow = {"BASH_FUNC_return%%": "() { :; }"}
    assert attempt.run(prog, bash=BASH) == 0 and attempt.out() == "ran\n"
    assert attempt.run(prog, bash=BASH, env=shadow) == 126
    assert not interp.gates_in({"PATH": PATH, **shadow})


def test_a_harmless_exported_function_keeps_the_bash_launcher(tmp_path: Path) -> None:
    """Module systems export functions (module, ml) into every job: those do not shadow
    anything the gate runs."""
    assert interp.gates_in({"PATH": PATH, "BASH_FUNC_module%%": "() { :; }"})


def test_the_gate_is_read_from_the_descriptor_the_manager_opened_not_from_its_path(
    tmp_path: Path, attempt: Attempt
) -> None:
    """bash runs a program whose BASH_ENV it cannot read (a package upgraded in place under
    a running manager): the gate comes from a descriptor opened at the manager's start
    (BASH_ENV=/dev/fd/N, checked above), which the program itself never holds."""
    prog = program(tmp_path, 'ls /proc/$$/fd >"$PWD/fds"\n', shebang="#!/bin/bash")
    proc = attempt.launch(prog, bash=launcher_of("bash", prog))
    assert proc.open_gate()
    assert proc.wait() == 0
    fds = (attempt.work / "fds").read_text().split()
    assert str(GATE_FD) not in fds


def test_a_null_byte_in_how_the_last_try_ended_does_not_stop_the_launch(
    root: str, scripts: Path, managers: Managers
) -> None:
    """A retry's message may hold U+0000 (valid JSON); the next attempt's FLOW_PREVIOUS_END
    cannot: it is escaped, and the job runs its retry instead of crashing its manager."""
    prog = write_program(
        scripts,
        "nul.sh",
        "#!/bin/bash\nif [[ $FLOW_ATTEMPT_ID == a0001 ]]; then\n"
        '  printf \'{"action":"retry","message":"a\\\\u0000b"}\\n\' \\\n'
        '    >"$FLOW_CONTROL_DIR/outcome.line"\n'
        "fi\nexit 0\n",
    )
    [jid] = submit(root, prog, retries=2)
    assert managers.run(root) == 0, log_of(managers.procs[-1])
    info = job(root, jid)
    assert info.state is State.SUCCEEDED, dump(root, [jid])
