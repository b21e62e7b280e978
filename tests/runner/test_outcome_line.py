"""Protocol 2's outcome written in place: flow.sh publishes every outcome but a wait (and any
outcome in a durable workspace) as one line in `outcome.line`, created exclusively, with no
process started; the manager takes it only when whole (ending in its newline).

Real bash against fake attempt directories, and real `flow run` managers on real jobs.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from helpers import duplicate_note, published_outcome

from httk_flow.errors import InvalidOutcome
from httk_flow.protocol.outcome import Action, TornOutcome, read_outcome
from httk_flow.protocol.states import State

from .support import BASH, FLOW_SH, Bench, bash

STRACE = shutil.which("strace")


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Bench]:
    """These tests read what the runner left in its attempt: the workspace keeps it all."""
    b = Bench(tmp_path, keep_files=True)
    yield b
    b.close()


@pytest.fixture
def attempt(tmp_path: Path) -> Path:
    d = tmp_path / "attempt"
    d.mkdir()
    return d


def in_attempt(attempt: Path, **extra: str) -> dict[str, str]:
    return {"FLOW_CONTROL_DIR": str(attempt), "FLOW_STEP": "main", **extra}


def traced(tmp_path: Path, attempt: Path, script: str, **extra: str) -> list[str]:
    """The system calls that create, rename or start something, made by one bash process
    (and anything it starts) that sources flow.sh and runs `script`: strace's lines."""
    if STRACE is None:
        if os.environ.get("CI") == "true":
            pytest.fail("strace is not installed (CI must have it)")
        pytest.skip("strace is not installed")
    trace = tmp_path / "trace"
    calls = "execve,execveat,fork,vfork,clone,clone3,mkdir,mkdirat,rename,renameat,renameat2,openat"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    env.update(in_attempt(attempt, **extra))
    strace = [STRACE, "-f", "-qq", "-e", "signal=none", "-e", f"trace={calls}", "-o", str(trace)]
    done = subprocess.run(
        [*strace, BASH, "-c", f'source "$1"\n{script}', "flow-test", str(FLOW_SH)],
        capture_output=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return trace.read_text().splitlines()


# -- what flow.sh writes ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "line"),
    [
        ("flow_succeed", b'{"action":"succeed","message":""}\n'),
        ("flow_fail 'no \"input\"' bad_input", None),
        ("flow_advance two 'on \\ we go'", None),
        ("flow_retry later", b'{"action":"retry","message":"later"}\n'),
        ("flow_pause look", b'{"action":"pause","message":"look"}\n'),
    ],
)
def test_an_outcome_is_one_whole_line_in_the_only_file_made(
    attempt: Path, call: str, line: bytes | None
) -> None:
    done = bash(call, env=in_attempt(attempt), cwd=str(attempt))
    assert done.returncode == 0, done.stderr
    assert os.listdir(attempt) == ["outcome.line"]
    raw = (attempt / "outcome.line").read_bytes()
    assert raw.endswith(b"\n") and raw.count(b"\n") == 1, raw
    if line is not None:
        assert raw == line
    data = orjson.loads(raw)
    out = read_outcome(str(attempt))
    assert out is not None and (out.action.value, out.message) == (data["action"], data["message"])


def test_flow_succeed_starts_no_process_and_creates_outcome_line_exclusively(
    tmp_path: Path, attempt: Path
) -> None:
    lines = traced(tmp_path, attempt, 'flow_succeed "by bash alone"')
    execs = [x for x in lines if re.match(r"\d+\s+execve\(", x)]
    assert len(execs) == 1 and '"-c"' in execs[0], execs  # bash itself, and nothing else
    assert not [x for x in lines if re.search(r" (v?fork|clone3?)\(", x)], lines
    assert not [x for x in lines if re.search(r" (mkdir|rename)\w*\(", x)], lines
    opened = [x for x in lines if "outcome.line" in x]
    assert len(opened) == 1 and "O_CREAT" in opened[0] and "O_EXCL" in opened[0], opened
    assert published_outcome(attempt) == {"action": "succeed", "message": "by bash alone"}


def test_flow_succeed_needs_no_command_on_the_path(tmp_path: Path, attempt: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    done = bash("flow_succeed fine", env={**in_attempt(attempt), "PATH": str(empty)})
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    assert published_outcome(attempt) == {"action": "succeed", "message": "fine"}


def test_a_wait_and_a_durable_workspace_use_the_directory_form(
    tmp_path: Path, attempt: Path
) -> None:
    lines = traced(tmp_path, attempt, "flow_spawn; flow_wait main")
    assert [x for x in lines if re.search(r" renameat2?\(.*outcome\.ready", x)], lines
    assert sorted(os.listdir(attempt)) == ["outcome.ready"]
    assert sorted(os.listdir(attempt / "outcome.ready")) == ["children.jsonl", "outcome.json"]
    durable = tmp_path / "durable"
    durable.mkdir()
    lines = traced(tmp_path, durable, "flow_succeed synced", FLOW_DURABLE="1")
    assert [x for x in lines if re.search(r" renameat2?\(.*outcome\.ready", x)], lines
    assert [x for x in lines if re.search(r'execve\("[^"]*/sync"', x)], lines
    assert os.listdir(durable) == ["outcome.ready"]
    assert published_outcome(durable) == {"action": "succeed", "message": "synced"}


def test_a_second_outcome_beside_outcome_line_is_noted_and_read_as_a_protocol_error(
    attempt: Path,
) -> None:
    done = bash("flow_succeed one; flow_fail two; echo rc=$?", env=in_attempt(attempt))
    assert done.stdout == b"rc=1\n"
    assert sorted(os.listdir(attempt)) == ["outcome.duplicate", "outcome.line"]
    assert duplicate_note(attempt) == "fail\n"
    with pytest.raises(InvalidOutcome) as info:
        read_outcome(str(attempt))
    assert info.value.render() == (
        f"{attempt}: the attempt published more than one outcome: succeed ('one'), then fail; "
        "publishing an outcome does not end the step, so return (or exit) right after it"
    )


def test_subshells_racing_to_publish_leave_one_line_and_one_note_per_loser(
    attempt: Path,
) -> None:
    # eight subshells wait for one signal file, then publish at the same moment
    script = """
        for i in 1 2 3 4 5 6 7 8; do
            ( while [[ ! -e go ]]; do :; done; flow_succeed "from $i" ) 2>/dev/null &
        done
        : >go
        wait
    """
    for _ in range(5):
        for name in ("go", "outcome.line", "outcome.duplicate"):
            (attempt / name).unlink(missing_ok=True)
        done = bash(script, env=in_attempt(attempt), cwd=str(attempt))
        assert done.returncode == 0, done.stderr
        raw = (attempt / "outcome.line").read_bytes()
        assert re.fullmatch(rb'\{"action":"succeed","message":"from [1-8]"\}\n', raw), raw
        assert duplicate_note(attempt) == "succeed\n" * 7
        with pytest.raises(InvalidOutcome, match="more than one outcome"):
            read_outcome(str(attempt))


def test_an_outcome_line_cut_short_is_torn_and_one_of_two_lines_is_invalid(
    attempt: Path,
) -> None:
    line = attempt / "outcome.line"
    line.write_bytes(b'{"action":"succeed","message":"cut')
    with pytest.raises(TornOutcome) as e:
        read_outcome(str(attempt))
    assert str(line) in e.value.render() and "not whole" in e.value.render()
    line.write_bytes(b'{"action":"succeed"}\n{"action":"fail"}\n')
    with pytest.raises(InvalidOutcome) as invalid:
        read_outcome(str(attempt))
    assert not isinstance(invalid.value, TornOutcome)
    assert "one JSON object on one line" in invalid.value.render()
    line.write_bytes(b'{"action":"wait","step":"two"}\n')
    with pytest.raises(InvalidOutcome, match=r"publish it as outcome\.ready/"):
        read_outcome(str(attempt))
    line.write_bytes(b'{"action":"succeed","message":"whole"}\n')
    out = read_outcome(str(attempt))
    assert out is not None and (out.action, out.message) == (Action.SUCCEED, "whole")


# -- through a real manager -----------------------------------------------------------------

#: attempt a0001 does what $FLOW_PARAM_mode says; every later attempt succeeds
MODES = r"""
if [[ $FLOW_ATTEMPT_ID != a0001 ]]; then
    flow_succeed "attempt $FLOW_ATTEMPT_ID"
    exit 0
fi
line=$FLOW_CONTROL_DIR/outcome.line
case $FLOW_PARAM_mode in
torn_exit) printf '{"action":"succeed"}' >"$line"; exit 0 ;;
torn_killed) printf '{"action":"succeed"}' >"$line"; kill -KILL $$ ;;
torn_termed) printf '{"action":"succeed","mess' >"$line"; kill -TERM $$ ;;
both)
    flow_succeed "in place"
    mkdir "$FLOW_CONTROL_DIR/t"
    echo '{"action":"succeed"}' >"$FLOW_CONTROL_DIR/t/outcome.json"
    mv "$FLOW_CONTROL_DIR/t" "$FLOW_CONTROL_DIR/outcome.ready" ;;
race)
    for i in 1 2 3 4; do
        ( while [[ ! -e $FLOW_WORKDIR/go.$FLOW_ATTEMPT_ID ]]; do :; done
          flow_succeed "from $i" ) &
    done
    : >"$FLOW_WORKDIR/go.$FLOW_ATTEMPT_ID"
    wait ;;
plain) flow_succeed "in place" ;;
esac
"""


def run_modes(bench: Bench, *modes: str) -> dict[str, str]:
    prog = bench.script("modes.sh", MODES)
    ids = {m: bench.submit(prog, params={"mode": m}, options=("--retries", "2")) for m in modes}
    bench.run()
    return ids


def test_a_torn_outcome_after_exit_0_fails_the_job_naming_the_file(bench: Bench) -> None:
    ids = run_modes(bench, "torn_exit", "plain")
    job = bench.job(ids["torn_exit"])
    line = job.attempt_dirs()[0] / "outcome.line"
    assert (job.state, job.code) == (State.FAILED, "protocol_error"), job.describe()
    assert str(line) in job.reason and "not whole" in job.reason, job.reason
    assert len(job.attempt_dirs()) == 1  # a protocol error is not retried
    plain = bench.job(ids["plain"])
    assert plain.state is State.SUCCEEDED, plain.describe()
    assert published_outcome(plain.attempt_dirs()[0]) == {
        "action": "succeed",
        "message": "in place",
    }


@pytest.mark.parametrize(("mode", "sig"), [("torn_killed", 9), ("torn_termed", 15)])
def test_a_torn_outcome_of_an_attempt_killed_by_a_signal_is_a_process_failure(
    bench: Bench, mode: str, sig: int
) -> None:
    job = bench.job(run_modes(bench, mode)[mode])
    assert job.state is State.SUCCEEDED, job.describe()
    first, second = job.attempt_dirs()
    # the part written is left as it was, and taken as no outcome at all
    assert not (first / "outcome.line").read_bytes().endswith(b"\n")
    assert published_outcome(second) == {"action": "succeed", "message": "attempt a0002"}
    [ended, _] = job.commits()
    assert ended["why"] == f"process failure: signal {sig}", ended
    assert (ended["result"]["exit"], ended["result"]["signal"]) == (None, sig), ended
    assert "outcome" not in ended["result"], ended


def test_outcome_line_beside_outcome_ready_fails_the_job(bench: Bench) -> None:
    job = bench.job(run_modes(bench, "both")["both"])
    assert (job.state, job.code) == (State.FAILED, "protocol_error"), job.describe()
    assert "more than one outcome" in job.reason
    assert len(job.attempt_dirs()) == 1


def test_subshells_racing_to_publish_fail_the_job_with_exactly_one_line(bench: Bench) -> None:
    job = bench.job(run_modes(bench, "race")["race"])
    assert (job.state, job.code) == (State.FAILED, "protocol_error"), job.describe()
    assert "more than one outcome" in job.reason
    [attempt] = job.attempt_dirs()
    raw = (attempt / "outcome.line").read_bytes()
    assert re.fullmatch(rb'\{"action":"succeed","message":"from [1-4]"\}\n', raw), raw
    assert duplicate_note(attempt) == "succeed\n" * 3


#: a parent that joins two children, each publishing in place; the step after the join
#: notes what it was told
FAMILY = r"""
flow_steps main kid collect
step_main() {
    flow_spawn --step kid --param n=1
    flow_spawn --step kid --param n=2 --label two
    flow_wait collect
}
step_kid() { flow_succeed "kid $(flow_param n)"; }
step_collect() {
    flow_children >"$FLOW_WORKDIR/kids"
    printf '%s\n' "${FLOW_CONTEXT-unset}" >"$FLOW_WORKDIR/context"
    flow_succeed collected
}
flow_main "$@"
"""


def test_a_wait_still_registers_its_children_and_the_join_gets_its_context(
    bench: Bench,
) -> None:
    parent = bench.job(bench.submit(bench.script("family.sh", FAMILY)))
    assert bench.run() == 0, bench.logs[-1].read_text()
    parent = bench.job(parent.handle.key)
    assert parent.state is State.SUCCEEDED, parent.describe()
    first, collect = parent.attempt_dirs()
    assert sorted(os.listdir(first / "outcome.ready")) == ["children.jsonl", "outcome.json"]
    assert not (first / "outcome.line").exists()
    # after the join: context.json, named by FLOW_CONTEXT, with the children
    context = collect / "context.json"
    assert (parent.dir / "run" / "context").read_text() == f"{context}\n"
    told = orjson.loads(context.read_bytes())
    assert sorted(c["label"] for c in told["children"]) == ["c1", "two"]
    assert published_outcome(collect) == {"action": "succeed", "message": "collected"}
    kids = (parent.dir / "run" / "kids").read_text().splitlines()
    assert sorted(k.split()[0] for k in kids) == ["c1", "two"]
    assert all(k.split()[2] == "succeeded" for k in kids)
    children = [j for j in bench.all_jobs() if j.handle.placement.endswith(parent.handle.key)]
    assert sorted(published_outcome(c.attempt_dirs()[0])["message"] for c in children) == [
        "kid 1",
        "kid 2",
    ]


def test_a_durable_workspace_publishes_every_outcome_as_a_directory(tmp_path: Path) -> None:
    bench = Bench(tmp_path, keep_files=True)
    try:
        fmt = Path(bench.root) / ".flow" / "format.json"
        data = orjson.loads(fmt.read_bytes())
        data["policy"]["durable"] = True
        fmt.write_bytes(orjson.dumps(data))
        jid = bench.submit(bench.script("plain.sh", 'flow_succeed "in place"\n'))
        assert bench.run() == 0
        job = bench.job(jid)
        assert job.state is State.SUCCEEDED, job.describe()
        [attempt] = job.attempt_dirs()
        assert (attempt / "outcome.ready" / "outcome.json").is_file()
        assert not (attempt / "outcome.line").exists()
        assert published_outcome(attempt) == {"action": "succeed", "message": "in place"}
    finally:
        bench.close()


#: a Python runner that fails its first try and notes, on the next, how that one ended
PY_PREVIOUS = r"""#!/usr/bin/env python3
import os
from httk_flow.runner import Runner

flow = Runner()
where = os.path.join(os.environ["FLOW_WORKDIR"], "seen." + os.environ["FLOW_ATTEMPT_ID"])
with open(where, "w") as fh:
    fh.write(f"{flow.previous_end}|{os.environ.get('FLOW_PREVIOUS_END', '(unset)')}")
if os.environ["FLOW_ATTEMPT_ID"] == "a0001":
    os._exit(3)  # no outcome: a process failure, retried


@flow.step
def main(flow):
    flow.succeed()


flow.run()
"""


def test_a_retry_is_told_how_the_previous_try_ended_in_its_environment(bench: Bench) -> None:
    prog = bench.script("prev.py", PY_PREVIOUS, prelude="")
    jid = bench.submit(prog, options=("--retries", "1"))
    assert bench.run() == 0, bench.logs[-1].read_text()
    job = bench.job(jid)
    assert job.state is State.SUCCEEDED, job.describe()
    run = job.dir / "run"
    assert (run / "seen.a0001").read_text() == "None|(unset)"
    first_end, _ = run.joinpath("seen.a0002").read_text().split("|")
    [ended, _] = job.commits()
    assert first_end == ended["why"] and first_end, ended
    assert (run / "seen.a0002").read_text() == f"{first_end}|{first_end}"


@pytest.mark.parametrize("kind", ["symlink", "directory", "fifo", "oversized"])
def test_an_outcome_line_that_is_no_plain_file_is_refused_at_once(
    tmp_path: Path, attempt: Path, kind: str
) -> None:
    line = attempt / "outcome.line"
    if kind == "symlink":
        target = tmp_path / "elsewhere"
        target.write_bytes(b'{"action":"succeed"}\n')
        line.symlink_to(target)
    elif kind == "directory":
        line.mkdir()
    elif kind == "fifo":
        os.mkfifo(line)
    else:
        line.write_bytes(b'{"action":"succeed","message":"' + b"x" * 4_000_000 + b'"}\n')
    result: list[BaseException | object] = []

    def read() -> None:
        try:
            result.append(read_outcome(str(attempt)))
        except BaseException as e:  # the kind of error is what is tested
            result.append(e)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(5)
    blocked = t.is_alive()
    while t.is_alive():  # a reader stuck opening the FIFO: give it a writer, then a line
        with contextlib.suppress(OSError):
            os.close(os.open(line, os.O_WRONLY | os.O_NONBLOCK))
        t.join(0.1)
    assert not blocked, "read_outcome blocked on outcome.line"
    [got] = result
    assert isinstance(got, InvalidOutcome) and not isinstance(got, TornOutcome), got
    assert str(line) in got.render()
