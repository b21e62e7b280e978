"""Budgets count what they say: --retries the charged failures of one activation,
max_attempts the charged failures of the job's life. Drains, takeovers, advances and
joins are attempts against neither, and `flow resume` starts both again."""

from __future__ import annotations

from pathlib import Path

from httk_flow.manager.decide import Decision, Ending, decide
from httk_flow.protocol.frames import Snapshot
from httk_flow.protocol.jobspec import JobSpec, Program
from httk_flow.protocol.outcome import Action, Outcome
from httk_flow.protocol.states import State

from .support import (
    Managers,
    committed,
    dump,
    flow,
    job,
    submit,
    write_program,
    write_script,
)

# -- the decision, as a pure function ------------------------------------------------


def spec_of(**fields: object) -> JobSpec:
    return JobSpec(
        id="0" * 32,
        key="0" * 32,
        tag=None,
        name="",
        program=Program(command="true"),
        args=(),
        step="main",
        params={},
        priority=500,
        placement="jobs/00",
        **fields,  # type: ignore[arg-type]
    )


def claim(snap: Snapshot) -> Snapshot:
    """What a claim does to the snapshot (passes.ClaimPass)."""
    return snap.but(try_=snap.try_ + 1, tries=snap.tries + 1)


def end(spec: JobSpec, snap: Snapshot, ending: Ending) -> tuple[Decision, Snapshot]:
    d = decide(spec, snap, ending, now=1000.0, backoff_base=0.0, backoff_cap=0.0)
    return d, d.changes.snapshot(snap)


DRAINED = Ending(None, 15, interrupted=True, drained=True)
TAKEN_OVER = Ending(None, None, interrupted=True)
FAILED = Ending(1)


def advance(step: str) -> Ending:
    return Ending(0, outcome=Outcome(action=Action.ADVANCE, step=step))


def test_drains_and_advances_between_them_leave_the_whole_retries_budget() -> None:
    """The issue's case: a checkpointing job drained at the end of many allocations,
    advancing between them, then failing once: it is retried, as --retries says."""
    spec = spec_of(retries=1, max_attempts=3)
    snap = Snapshot(step="s0")
    for i in range(1, 60):
        d, snap = end(spec, claim(snap), DRAINED)
        assert d.target is State.READY, d
        d, snap = end(spec, claim(snap), advance(f"s{i}"))
        assert d.target is State.READY, d
    assert (snap.tries, snap.charged, snap.try_) == (118, 0, 0)
    d, snap = end(spec, claim(snap), FAILED)
    assert (d.target, d.why) == (State.READY, "process failure: exit status 1")
    assert snap.charged == 1
    d, _ = end(spec, claim(snap), Ending(0))
    assert d.target is State.SUCCEEDED


def test_takeovers_count_against_no_budget_of_attempts() -> None:
    spec = spec_of(retries=0, max_attempts=1)
    snap = Snapshot(step="main")
    for _ in range(10):
        d, snap = end(spec, claim(snap), TAKEN_OVER)
        assert d.target is State.READY
    assert (snap.intr, snap.charged, snap.try_) == (10, 0, 0)
    d, _ = end(spec, claim(snap), Ending(0))
    assert d.target is State.SUCCEEDED


def test_max_attempts_counts_charged_failures_over_every_activation() -> None:
    spec = spec_of(retries=5, max_attempts=3)
    snap = Snapshot(step="main")
    for step in ("two", "three"):
        d, snap = end(spec, claim(snap), FAILED)
        assert d.target is State.READY
        d, snap = end(spec, claim(snap), advance(step))
        assert d.target is State.READY and snap.try_ == 0
    d, snap = end(spec, claim(snap), FAILED)
    assert d.target is State.FAILED and d.changes.failure is not None
    assert d.changes.failure.code == "budget_exhausted"
    assert "max_attempts budget (3 failed attempts)" in d.changes.failure.message
    assert snap.charged == 3


def test_a_hundred_and_fifty_advances_do_not_spend_max_attempts() -> None:
    spec = spec_of()  # the defaults: retries 2, max_attempts 100
    snap = Snapshot(step="main")
    for _ in range(150):
        d, snap = end(spec, claim(snap), advance("main"))
        assert d.target is State.READY
    d, snap = end(spec, claim(snap), FAILED)
    assert d.target is State.READY and snap.charged == 1


# -- real managers, real processes ----------------------------------------------------

#: steps s1..s4: a fresh start sleeps until the walltime drains it; the restart after the
#: drain advances. At `done`: the first try fails, the second succeeds.
CHECKPOINTER = """
echo "$FLOW_STEP $FLOW_ATTEMPT $FLOW_UNCLEAN_RESTART" >> "$FLOW_WORKDIR/runs"
case "$FLOW_STEP" in
    s[1-4])
        if [ "$FLOW_UNCLEAN_RESTART" = 0 ]; then
            exec sleep 60
        fi
        publish "{\\"action\\":\\"advance\\",\\"step\\":\\"s$(( ${FLOW_STEP#s} + 1 ))\\"}"
        ;;
    s5)
        publish '{"action":"advance","step":"done"}'
        ;;
    done)
        [ "$FLOW_ATTEMPT" = 1 ] && exit 1
        publish '{"action":"succeed"}'
        ;;
esac
"""


def test_a_job_drained_many_times_advancing_between_drains_keeps_its_retries(
    root: str, scripts: Path, managers: Managers
) -> None:
    program = write_script(scripts, "ckpt.sh", CHECKPOINTER)
    # a life budget smaller than the attempts it makes: only failures may spend it
    [jid] = submit(root, program, step="s1", retries=1, max_attempts=2)
    for _ in range(4):
        assert managers.run(root, "--walltime", "1.5s", "--kill-grace", "1s") == 0
        assert job(root, jid).state is State.READY, dump(root, [jid])
    assert managers.run(root) == 0
    info = job(root, jid)
    assert info.state is State.SUCCEEDED, dump(root, [jid])
    whys = [why for _, _, why in committed(info)]
    assert whys == [
        *["interrupted", "advance"] * 4,
        "advance",
        "process failure: exit status 1",
        "succeed",
    ]
    drains = [a for a in info.attempts if a["result"].get("interrupted") == "drain"]
    assert len(drains) == 4 and len(info.attempts) == 11
    assert info.last.get("charged") == 1


ADVANCER = """#!/usr/bin/env bash
source "$FLOW_BASH_API"
flow_steps main done
step_main() {
    local n
    n=$(( $(cat "$FLOW_WORKDIR/n" 2>/dev/null || echo 0) + 1 ))
    echo "$n" > "$FLOW_WORKDIR/n"
    if (( n < 150 )); then flow_advance main; else flow_advance done; fi
}
step_done() {
    if [ "$FLOW_IS_RESTART" = 0 ]; then exit 1; fi
    flow_succeed "after $(cat "$FLOW_WORKDIR/n") advances"
}
flow_main "$@"
"""


def test_an_advance_heavy_job_is_not_failed_by_max_attempts(
    root: str, scripts: Path, managers: Managers
) -> None:
    [jid] = submit(root, write_program(scripts, "adv.sh", ADVANCER))
    assert managers.run(root, timeout=240) == 0
    info = job(root, jid)
    assert info.state is State.SUCCEEDED, dump(root, [jid])
    assert info.last.get("message") == "after 150 advances"
    assert len(info.attempts) == 152  # 150 advances, one failure, one success
    assert info.last["act"] == 151 and info.last.get("charged") == 1


#: fails its first three runs, then succeeds
FAILS_THRICE = """
[ "$(bump runs)" -le 3 ] && exit 1
publish '{"action":"succeed"}'
"""


def test_resume_gives_a_fresh_budget(root: str, scripts: Path, managers: Managers) -> None:
    program = write_script(scripts, "thrice.sh", FAILS_THRICE)
    r = flow("submit", "-w", root, "--tag", "t", "--retries", "1", "--max-attempts", "2", program)
    assert r.returncode == 0, r.stderr
    assert managers.run(root) == 1
    info = job(root, "t")
    assert info.state is State.FAILED, dump(root)
    assert info.failure_code == "budget_exhausted"
    assert info.last.get("charged") == 2 and len(info.attempts) == 2
    r = flow("resume", "-w", root, "t")
    assert r.returncode == 0, r.stderr
    resumed = job(root, "t").last
    assert "charged" not in resumed and resumed["try"] == 0 and resumed["last"] == "resumed"
    # a fresh budget: one failure more is retried (and not the end of the job's life)
    assert managers.run(root) == 0
    info = job(root, "t")
    assert info.state is State.SUCCEEDED, dump(root)
    assert len(info.attempts) == 4
    assert [why for _, _, why in committed(info)] == [
        "process failure: exit status 1",
        "budget_exhausted",
        "process failure: exit status 1",
        "succeed",
    ]


def test_max_attempts_is_set_on_the_command_line_and_in_jsonl(
    root: str, scripts: Path, managers: Managers, tmp_path: Path
) -> None:
    program = write_script(scripts, "bad.sh", "exit 1\n")
    r = flow("submit", "-w", root, "--tag", "cli", "--retries", "5", "--max-attempts", "2", program)
    assert r.returncode == 0, r.stderr
    deck = tmp_path / "deck.jsonl"
    deck.write_text('{"tag": "line", "retries": 5, "max_attempts": 1}\n')
    r = flow("submit", "-w", root, "--from", str(deck), program)
    assert r.returncode == 0, r.stderr
    assert managers.run(root) == 1
    for tag, n in (("cli", 2), ("line", 1)):
        info = job(root, tag)
        assert info.state is State.FAILED, dump(root)
        assert info.failure_code == "budget_exhausted"
        assert f"max_attempts budget ({n} failed attempts)" in info.last["failure"]["message"]
        assert len(info.attempts) == n
