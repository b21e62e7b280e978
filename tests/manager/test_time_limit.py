"""--time-limit: the attempt's whole process group is stopped at its limit (TERM, KILL
after the kill grace), the ending is a charged failure retried within --retries, each
retry after a time limit gets the limit times --time-limit-factor, and that count lives
in the journal, so a manager that takes the job over gives the same limit."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import orjson
from helpers import wait_for

from httk_flow.manager.launcher import group_alive
from httk_flow.protocol.states import State

from .support import (
    Managers,
    committed,
    dump,
    flow,
    job,
    log_of,
    manager_up,
    submit,
    write_script,
)

#: leaves a sleeper in its group that only KILL stops, then works for $FLOW_PARAM_needs s
NEEDS_TIME = """
( trap '' TERM; exec sleep 300 ) &
echo "$FLOW_ATTEMPT_ID $$ $!" >> "$FLOW_WORKDIR/pids"
printf %s "${FLOW_PREVIOUS_END-(unset)}" > "$FLOW_WORKDIR/previous.$FLOW_ATTEMPT_ID"
cp "$FLOW_CONTEXT" "$FLOW_WORKDIR/context.$FLOW_ATTEMPT_ID"
sleep "$FLOW_PARAM_needs"
"""


def pids(info_dir: Path) -> dict[str, tuple[int, int]]:
    """attempt id -> (its pgid, its background sleeper), as the attempts wrote them."""
    try:
        lines = (info_dir / "run" / "pids").read_text().splitlines()
    except FileNotFoundError:
        return {}
    return {a: (int(g), int(s)) for a, g, s in (line.split() for line in lines)}


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_time_limit_stops_the_whole_group_and_the_retry_gets_the_grown_limit(
    root: str, scripts: Path, managers: Managers
) -> None:
    program = write_script(scripts, "needs.sh", NEEDS_TIME)
    # needs 2.5 s: more than the first limit (1 s), less than the second (1 s x 4)
    [jid] = submit(
        root,
        program,
        tag="tl",
        params={"needs": "2.5"},
        time_limit=1.0,
        time_limit_factor=4.0,
    )
    p = managers.start(root, "--kill-grace", "1s")
    job_dir = job(root, jid).job_dir(root)
    seen = wait_for(lambda: len(pids(job_dir)) >= 2 and pids(job_dir), 30)
    assert isinstance(seen, dict)
    # the first attempt's group is gone by the time the second runs: the sleeper that
    # ignores TERM too, since the whole group is KILLed once its leader has ended
    pgid, sleeper = seen["a0001"]
    wait_for(lambda: not group_alive(pgid) and not alive(sleeper), 5)
    assert p.wait(60) == 0
    info = job(root, jid)
    assert info.state is State.SUCCEEDED, dump(root, [jid])
    assert [why for _, _, why in committed(info)] == ["time limit 1s reached", "exit_0"]
    first, second = info.attempts
    assert first["limit"] == 1.0 and second["limit"] == 4.0
    assert first["result"]["time_limit"] == 1.0 and first["result"]["signal"] == signal.SIGTERM
    assert 1.0 <= first["elapsed"] < 2.5
    assert second["result"] == {"exit": 0, "signal": None, "elapsed": second["elapsed"]}
    assert 2.5 <= second["elapsed"] < 4.0
    assert (info.last["timeouts"], info.last["charged"]) == (1, 1)
    # the second attempt was told how the first ended
    # (in its environment, FLOW_PREVIOUS_END, and in context.json)
    assert (job_dir / "run" / "previous.a0001").read_text() == "(unset)"
    assert (job_dir / "run" / "previous.a0002").read_text() == "time limit 1s reached"
    context = orjson.loads((job_dir / "run" / "context.a0002").read_bytes())
    assert context["previous_end"] == "time limit 1s reached"
    for g, s in pids(job_dir).values():
        assert not group_alive(g) and not alive(s)

    shown = flow("show", "-w", root, "tl").stdout
    host, key = os.uname().nodename, info.handle.key
    # (text, or a pattern where pids, widths and timings vary)
    expected = [
        f"id          {jid}",
        f"key         {key}",
        "state       succeeded",
        "step        main",
        "generation  8",
        "priority    500",
        f"directory   {job_dir}",
        "program     needs.sh",
        "params      needs=2.5",
        "retries     2 per activation; 1 of at most 100 failures charged",
        "limit       4s (--time-limit 1s, ×4 after each attempt stopped at its limit)",
        re.compile(r"elapsed     2\.\ds"),
        "",
        re.compile(r"ATTEMPT  STEP  STATE      HOST +PID +ELAPSED  LIMIT  RESULT"),
        re.compile(rf"1        main  ready      {host} +\d+ +1\.\ds     1s     time limit 1s"),
        re.compile(rf"2        main  succeeded  {host} +\d+ +2\.\ds     4s     exit 0"),
    ]
    lines = shown.splitlines()
    assert len(lines) == len(expected), shown
    for line, want in zip(lines, expected, strict=True):
        if isinstance(want, str):
            assert line == want, shown
        else:
            assert want.fullmatch(line), (line, want.pattern)
    listed = flow("list", "-w", root, "--json").stdout
    assert '"limit":4.0' in listed.replace(" ", "") and '"elapsed":2.' in listed.replace(" ", "")


#: ignores TERM (so does its sleep: an ignored signal stays ignored across exec)
HUNG = """
trap '' TERM
echo "$$" > "$FLOW_WORKDIR/pgid"
sleep 60
"""


def test_a_hung_job_that_ignores_term_is_killed_after_the_grace(
    root: str, scripts: Path, managers: Managers
) -> None:
    [jid] = submit(root, write_script(scripts, "hung.sh", HUNG), time_limit=1.0, retries=0)
    t0 = time.monotonic()
    assert managers.run(root, "--kill-grace", "1s") == 1
    assert time.monotonic() - t0 < 20
    info = job(root, jid)
    assert info.state is State.FAILED, dump(root, [jid])
    assert info.failure_code == "time_limit"
    assert info.last["failure"]["message"] == (
        "step main failed 1 time(s) in this activation (time limit 1s reached); "
        "the retries budget (0 per activation) is spent"
    )
    [only] = info.attempts
    assert only["result"]["signal"] == signal.SIGKILL and only["result"]["time_limit"] == 1.0
    assert 2.0 <= only["elapsed"] < 10
    pgid = int((info.job_dir(root) / "run" / "pgid").read_text())
    assert not group_alive(pgid)
    shown = flow("show", "-w", root, jid).stdout
    assert "failure     time_limit: step main failed 1 time(s)" in shown
    assert re.search(r"\n1 +main +failed .* 1s +time limit 1s\n", shown), shown


#: a0001 runs into its 1 s limit; a0002 (3 s) loses its manager; a0003 needs 2 s
TAKEN_OVER = """
echo "$FLOW_ATTEMPT_ID" >> "$FLOW_WORKDIR/runs"
case "$FLOW_ATTEMPT_ID" in
    a0001 | a0002) sleep 60 ;;
    *) sleep 2 ;;
esac
"""


def test_the_grown_limit_survives_the_death_of_the_manager(
    root: str, scripts: Path, managers: Managers
) -> None:
    program = write_script(scripts, "taken.sh", TAKEN_OVER)
    [jid] = submit(root, program, time_limit=1.0, time_limit_factor=3.0, retries=1)
    p = managers.start(root, command="serve", workers=1)
    manager_up(root, p)
    runs = job(root, jid).job_dir(root) / "run" / "runs"
    wait_for(lambda: runs.exists() and "a0002" in runs.read_text(), 30)
    p.send_signal(signal.SIGKILL)
    p.wait(10)
    # a manager of this host sees the owner's process gone: it kills the orphaned group and
    # gives the job back uncharged; the new attempt's limit is read from the journal
    assert managers.run(root, "--kill-grace", "1s") == 0
    info = job(root, jid)
    assert info.state is State.SUCCEEDED, dump(root, [jid])
    assert [a["limit"] for a in info.attempts] == [1.0, 3.0, 3.0]
    assert [why for _, _, why in committed(info)] == [
        "time limit 1s reached",
        "interrupted",
        "exit_0",
    ]
    assert info.attempts[1]["result"]["interrupted"] == "takeover"
    assert (info.last["timeouts"], info.last["charged"], info.last["intr"]) == (1, 1, 1)


#: catches the TERM of its limit and publishes where to go on: the outcome wins
CHECKPOINTS_ON_TERM = """
on_term() {
    publish '{"action":"advance","step":"next","message":"checkpointed"}'
    exit 0
}
case "$FLOW_STEP" in
    main) trap on_term TERM; sleep 60 & wait ;;
    next) publish '{"action":"succeed"}' ;;
esac
"""


def test_an_outcome_published_at_the_limit_is_used(
    root: str, scripts: Path, managers: Managers
) -> None:
    program = write_script(scripts, "ckpt.sh", CHECKPOINTS_ON_TERM)
    [jid] = submit(root, program, time_limit=1.0, retries=0)
    assert managers.run(root, "--kill-grace", "1s") == 0
    info = job(root, jid)
    assert info.state is State.SUCCEEDED, dump(root, [jid])
    assert [why for _, _, why in committed(info)] == ["advance", "succeed"]
    assert info.attempts[0]["result"]["time_limit"] == 1.0
    assert "timeouts" not in info.last and "charged" not in info.last


def test_the_time_request_grows_with_the_limit_and_the_fit_uses_it(
    root: str, scripts: Path, managers: Managers
) -> None:
    """After a stop at its limit, the job asks for its --time times the factor: a manager
    whose walltime has less left than that no longer claims it, and says what it needs."""
    program = write_script(scripts, "needs.sh", NEEDS_TIME)
    [jid] = submit(
        root,
        program,
        tag="grows",
        params={"needs": "30"},
        time=2.0,
        time_limit=2.0,
        time_limit_factor=10.0,
    )
    p = managers.start(root, "--walltime", "12s", "--kill-grace", "1s")
    p.wait(60)
    # the first attempt fitted (2 s of 12) and was stopped at 2 s; the retry needs 20 s
    assert p.returncode == 4, log_of(p)
    info = job(root, jid)
    assert info.state is State.READY and len(info.attempts) == 1, dump(root, [jid])
    assert info.attempts[0]["result"]["time_limit"] == 2.0
    assert info.last["timeouts"] == 1
    assert re.search(r"1 ready job needs 20s but this manager had \d+s left", log_of(p)), log_of(p)
