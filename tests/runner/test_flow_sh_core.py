"""shell/flow.sh is the plain path only; shell/flow-more.sh, beside it, has the rest.

bash parses every line of a sourced file at each start of a step, so flow.sh keeps only
what a step that ends well runs: declare the steps, run one, read a parameter, publish
one outcome in place. Everything else (a misuse and its message, a message to escape, a
wait or a durable workspace, the ERR trap's report, spawning) is read from flow-more.sh
the first time it is needed. These tests prove, with real bash, that the plain path never
opens flow-more.sh, that a function read on first need behaves as it does once the file
was read, and that a flow-more.sh of another version is refused and fails the step.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import published_outcome

import httk_flow
from httk_flow.protocol.states import State

from .support import BASH, FLOW_SH, REPO, Bench

MORE_SH = FLOW_SH.parent / "flow-more.sh"
CHILDREN_SH = FLOW_SH.parent / "flow-children.sh"
STRACE = shutil.which("strace")
VERSION = httk_flow.__version__
#: the first lines of every runner here (a job's program, as docs/bash-api.md shows it)
PRELUDE = 'set -euo pipefail\nsource "$FLOW_BASH_API"\n'


@pytest.fixture
def attempt(tmp_path: Path) -> Path:
    d = tmp_path / "attempt"
    d.mkdir()
    return d


def runner(
    attempt: Path,
    body: str,
    *,
    api: Path = FLOW_SH,
    trace: Path | None = None,
    prelude: str = PRELUDE,
    **env: str,
) -> subprocess.CompletedProcess[bytes]:
    """Run a program made of `prelude` and `body` with `bash PROGRAM`, as the manager does,
    in a fake attempt (step main); under strace (its openat calls in `trace`) if asked."""
    prog = attempt.parent / "runner.sh"
    prog.write_text("#!/usr/bin/env bash\n" + prelude + body)
    full = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "FLOW_CONTROL_DIR": str(attempt),
        "FLOW_STEP": "main",
        "FLOW_BASH_API": str(api),
        **env,
    }
    argv = [BASH, str(prog)]
    if trace is not None:
        assert STRACE is not None
        argv = [STRACE, "-f", "-qq", "-e", "signal=none", "-e", "trace=openat", "-o", str(trace)]
        argv += [BASH, str(prog)]
    return subprocess.run(argv, capture_output=True, env=full, cwd=str(attempt), timeout=60)


def attempt_files(attempt: Path) -> dict[str, bytes]:
    """Every file and directory in the attempt, with its bytes (b"" for a directory)."""
    found: dict[str, bytes] = {}
    for root, dirs, files in os.walk(attempt):
        for name in dirs:
            found[os.path.relpath(os.path.join(root, name), attempt) + "/"] = b""
        for name in files:
            path = os.path.join(root, name)
            found[os.path.relpath(path, attempt)] = Path(path).read_bytes()
    return dict(sorted(found.items()))


def api_copy(tmp: Path, *, more: str | None) -> Path:
    """flow.sh and flow-children.sh in a directory of their own, with flow-more.sh beside
    them (text `more`) or none; returns the copy of flow.sh."""
    d = tmp / "api"
    d.mkdir()
    shutil.copyfile(FLOW_SH, d / "flow.sh")
    shutil.copyfile(CHILDREN_SH, d / "flow-children.sh")
    if more is not None:
        (d / "flow-more.sh").write_text(more)
    return d / "flow.sh"


def other_version() -> str:
    text = MORE_SH.read_text()
    other = text.replace(f"_FLOW_MORE_VERSION={VERSION}\n", "_FLOW_MORE_VERSION=9.9.9\n")
    assert other != text
    return other


# -- the files ----------------------------------------------------------------------------


def test_flow_more_sh_carries_the_package_version_and_ships_beside_flow_sh() -> None:
    found = re.findall(r"^_FLOW_MORE_VERSION=(\S+)$", MORE_SH.read_text(), flags=re.M)
    assert found == [VERSION]
    link = REPO / "httk_flow" / "shell" / "flow-more.sh"
    assert link.is_symlink() and os.readlink(link) == "../../shell/flow-more.sh"
    assert link.resolve() == MORE_SH.resolve()


def test_the_core_stays_small() -> None:
    # bash parses every character of flow.sh at each start of every bash step (about 3,000
    # instructions a word of code, 130 a character of comment): a line added here is paid
    # by every job, so what a step that ends well does not run belongs in flow-more.sh
    code = [
        line
        for line in FLOW_SH.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert len(code) <= 130, len(code)
    assert "eval" not in re.sub(r"#.*", "", FLOW_SH.read_text())


# -- the plain path -----------------------------------------------------------------------

#: runners whose step ends well, each publishing one outcome in place
PLAIN = {
    "succeed": ("step_main() { flow_succeed; }", {"action": "succeed", "message": ""}),
    "succeed with a message": (
        'step_main() { flow_succeed "all done: 42 items, 0 left (ok)"; }',
        {"action": "succeed", "message": "all done: 42 items, 0 left (ok)"},
    ),
    "fail": ("step_main() { flow_fail 'no input'; }", {"action": "fail", "message": "no input"}),
    "fail with a code": (
        "step_main() { flow_fail 'no input' no_input; }",
        {"action": "fail", "message": "no input", "code": "no_input"},
    ),
    "advance": (
        "step_main() { flow_advance two on we go; }",
        {"action": "advance", "message": "on we go", "step": "two"},
    ),
    "retry": ("step_main() { flow_retry later; }", {"action": "retry", "message": "later"}),
    "pause": ("step_main() { flow_pause look; }", {"action": "pause", "message": "look"}),
    "params, log and restart": (
        """step_main() {
    local n m
    flow_param -v n n 10
    m=$(flow_param m)
    flow_param unset_one fallback >/dev/null
    flow_param unset_one 2>/dev/null || true
    flow_log "n=$n m=$m"
    if flow_is_restart || flow_is_unclean_restart; then flow_fail restarted; fi
    flow_succeed "n=$n m=$m"
}""",
        {"action": "succeed", "message": "n=3 m=x"},
    ),
}


@pytest.mark.parametrize("case", PLAIN)
def test_the_plain_path_never_opens_flow_more_sh(tmp_path: Path, attempt: Path, case: str) -> None:
    if STRACE is None:
        if os.environ.get("CI") == "true":
            pytest.fail("strace is not installed (CI must have it)")
        pytest.skip("strace is not installed")
    step, expected = PLAIN[case]
    trace = tmp_path / "trace"
    body = f'flow_steps main two\n{step}\nflow_main "$@"\n'
    done = runner(attempt, body, trace=trace, FLOW_PARAM_n="3", FLOW_PARAM_m="x")
    assert done.returncode == 0, done.stderr
    assert published_outcome(attempt) == expected
    assert os.listdir(attempt) == ["outcome.line"]
    opened = trace.read_text()
    assert str(FLOW_SH) in opened  # (the trace is of the right program)
    assert "flow-more.sh" not in opened and "flow-children.sh" not in opened, opened
    if case == "params, log and restart":
        assert re.fullmatch(rb"\S+ flow\[main \?\]: n=3 m=x\n", done.stderr), done.stderr


# -- read on first need -------------------------------------------------------------------

#: runners that leave the plain path: (environment, program body, what the outcome says)
LONG_WAY = {
    "a parameter key that is not valid": (
        {},
        "flow_steps main\nstep_main() { flow_param 'bad key'; flow_succeed; }\nflow_main",
        "step main: flow_param: param key 'bad key' is not valid",
    ),
    "a parameter that is not set": (
        {},
        "flow_steps main\nstep_main() {\n  flow_param missing\n}\nflow_main",
        "step main: command `return 1` failed with status 1 at line 7",
    ),
    "-v without a variable name": (
        {},
        "flow_steps main\nstep_main() { flow_param -v '' x; }\nflow_main",
        "step main: flow_param: -v needs a variable name",
    ),
    "a fail code that is not valid": (
        {},
        "flow_steps main\nstep_main() { flow_fail oops 'no spaces'; }\nflow_main",
        "step main: flow_fail: code 'no spaces' is not valid",
    ),
    "advancing to an undeclared step": (
        {},
        "flow_steps main two\nstep_main() { flow_advance three; }\nflow_main",
        "step main: flow_advance: step 'three' is not declared with flow_steps "
        "(declared: main two)",
    ),
    "a retry without a reason": (
        {},
        "flow_steps main\nstep_main() { flow_retry; }\nflow_main",
        "step main: flow_retry: usage: flow_retry REASON",
    ),
    "a step name that is not valid": (
        {},
        "flow_steps main 9lives || true\nstep_main() { flow_succeed; }\nflow_main",
        "step main: flow_steps: step name '9lives' is not valid",
    ),
    "an undeclared step": (
        {"FLOW_STEP": "other"},
        "flow_steps main\nstep_main() { flow_succeed; }\nflow_main",
        "step other: flow_main: step 'other' is not declared with flow_steps (declared: main)",
    ),
    "the default step, undeclared": (
        {},
        "flow_steps first second\nstep_first() { flow_succeed; }\nflow_main",
        "step main: flow_main: step 'main' is not declared with flow_steps (declared: first "
        "second); a job starts at step main unless flow submit --step names another: submit "
        "with --step first, and continue this one with flow resume JOB --step first",
    ),
    "a step that ends without an outcome": (
        {},
        "flow_steps main\nstep_main() { :; }\nflow_main",
        "step main: step_main returned (status 0) without publishing an outcome",
    ),
    "the ERR trap": (
        {},
        "flow_steps main\nstep_main() { helper; }\nhelper() {\n  echo working\n  false\n}\n"
        "flow_main",
        "step main: command `false` failed with status 1 at line 9 (in helper)",
    ),
    "the ERR trap on a pipeline": (
        {},
        "flow_steps main\nstep_main() {\n  false | true\n}\nflow_main",
        "step main: a pipeline failed with statuses 1 0 at line 7 (near `true`)",
    ),
    "a message to escape": (
        {},
        "flow_steps main\nstep_main() { flow_succeed $'say \"hi\"\\n\\tand \\\\ \\x01 é'; }\n"
        "flow_main",
        'say "hi"\n\tand \\ \x01 é',
    ),
    "a durable workspace": (
        {"FLOW_DURABLE": "1"},
        "flow_steps main\nstep_main() { flow_succeed synced; }\nflow_main",
        "synced",
    ),
    "posix mode": (
        {},
        "set -o posix\nflow_steps main\nstep_main() { flow_pause look; }\nflow_main",
        "look",
    ),
    "a second outcome": (
        {},
        "flow_steps main\nstep_main() { ( flow_succeed first ); flow_fail second; }\nflow_main",
        "first",
    ),
    "a wait": (
        {},
        "flow_steps main\nstep_main() { flow_spawn --param k=v; flow_wait main; }\nflow_main",
        "",
    ),
}


@pytest.mark.parametrize("case", LONG_WAY)
def test_a_function_read_on_first_need_does_what_it_does_once_read(
    tmp_path: Path, case: str
) -> None:
    env, body, message = LONG_WAY[case]
    runs = []
    for preload in (False, True):
        attempt = tmp_path / f"attempt-{preload}"
        attempt.mkdir()
        # the same program, with flow-more.sh read before anything runs, or not; at its
        # exit it says whether flow-more.sh was read (1)
        said = 'trap \'printf "read=%s\\n" "$_flow_more_api" >&2\' EXIT'
        done = runner(attempt, said + ("; _flow_load\n" if preload else "\n") + body, **env)
        runs.append((done.returncode, done.stdout, done.stderr, attempt_files(attempt)))
    first, after = runs
    assert first[2].endswith(b"read=1\n"), first[2]
    assert message in str(published_outcome(tmp_path / "attempt-False")["message"])
    assert first == after


def test_the_err_trap_names_the_command_and_function_when_it_is_the_first_need(
    attempt: Path,
) -> None:
    body = (
        "flow_steps main\nstep_main() { helper; }\nhelper() {\n  cp /nonexistent/a b\n}\nflow_main"
    )
    done = runner(attempt, body)
    assert done.returncode == 1
    assert published_outcome(attempt) == {
        "action": "fail",
        "message": "step main: command `cp /nonexistent/a b` failed with status 1 at line 7 "
        "(in helper)",
        "code": "step_error",
    }


# -- another version ----------------------------------------------------------------------


def test_a_flow_more_sh_of_another_version_is_refused_and_the_step_fails(
    tmp_path: Path, attempt: Path
) -> None:
    api = api_copy(tmp_path, more=other_version())
    body = (
        "flow_steps main\nstep_main() { flow_fail oops 'no spaces'; flow_succeed; }\n"
        'flow_main\necho "main=$?" >&2\n'
        "declare -F _flow_more_outcome >&2 || echo 'nothing defined' >&2\n"
    )
    done = runner(attempt, body, api=api, prelude=PRELUDE.replace("set -euo", "set -uo"))
    err = done.stderr.decode()
    said = (
        f"flow: cannot load {api.parent}/flow-more.sh (version 9.9.9) for flow.sh (version "
        f"{VERSION}): the two ship together and one job never mixes versions (was httk_flow "
        "upgraded while it ran?)"
    )
    assert said + "\n" in err and err.count("cannot load") == 1, err
    assert "nothing defined" in err  # a refused file defines nothing
    assert "main=0" in err  # (flow_main returns 0 once an outcome was published)
    assert published_outcome(attempt) == {
        "action": "fail",
        "message": f"step main: {said}",
        "code": "protocol_error",
    }


def test_a_missing_flow_more_sh_is_refused_under_set_e_too(tmp_path: Path, attempt: Path) -> None:
    api = api_copy(tmp_path, more=None)
    body = "flow_steps main\nstep_main() { helper; }\nhelper() { false; }\nflow_main\n"
    done = runner(attempt, body, api=api)
    assert done.returncode != 0
    out = published_outcome(attempt)
    assert out["action"] == "fail" and out["code"] == "protocol_error"
    assert str(out["message"]).startswith(
        f"step main: flow: cannot load {api.parent}/flow-more.sh (version unknown) for flow.sh"
    )


def test_when_nothing_can_be_published_the_step_still_fails(tmp_path: Path, attempt: Path) -> None:
    # durable: only flow-more.sh can publish; flow_main returns non-zero, a process failure
    api = api_copy(tmp_path, more=other_version())
    done = runner(
        attempt,
        "flow_steps main\nstep_main() { flow_succeed; }\nflow_main\n",
        api=api,
        FLOW_DURABLE="1",
    )
    assert done.returncode == 2
    assert done.stderr.decode().count("cannot load") == 1
    assert os.listdir(attempt) == []


def test_the_plain_path_runs_beside_a_flow_more_sh_of_another_version(
    tmp_path: Path, attempt: Path
) -> None:
    api = api_copy(tmp_path, more=other_version())
    done = runner(
        attempt, "flow_steps main\nstep_main() { flow_succeed fine; }\nflow_main\n", api=api
    )
    assert done.returncode == 0 and done.stderr == b""
    assert published_outcome(attempt) == {"action": "succeed", "message": "fine"}


def test_a_job_with_a_mixed_install_fails_with_a_protocol_error(
    bench: Bench, tmp_path: Path
) -> None:
    api = api_copy(tmp_path, more=other_version())
    prelude = f'#!/usr/bin/env bash\nset -euo pipefail\nsource "{api}"\n'
    body = (
        "flow_steps main\nstep_main() { flow_param 'bad key'; flow_succeed; }\nflow_main \"$@\"\n"
    )
    ident = bench.submit(bench.script("mixed.sh", body, prelude=prelude))
    bench.run()
    job = bench.job(ident)
    assert job.state is State.FAILED, job.describe()
    assert job.code == "protocol_error"
    assert f"cannot load {api.parent}/flow-more.sh (version 9.9.9)" in job.reason
    assert len(job.attempt_ids()) == 1  # a protocol error is not retried
