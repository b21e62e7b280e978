"""states: the one table of legal transitions."""

from __future__ import annotations

import itertools

import pytest
from helpers import STATE_NAMES

from httk_flow.errors import FlowError, IllegalTransition
from httk_flow.protocol.states import TRANSITIONS, State, ends_commit

ALL_PAIRS = list(itertools.product(State, State))


def test_every_state_kind_has_a_row_in_the_table() -> None:
    assert set(TRANSITIONS) == set(State)
    assert [s.value for s in State] == STATE_NAMES


def test_terminal_states_are_exactly_succeeded_failed_and_cancelled() -> None:
    assert {s for s in State if s.is_terminal} == {State.SUCCEEDED, State.FAILED, State.CANCELLED}


def test_active_states_are_those_a_manager_holds_a_lease_on() -> None:
    assert {s for s in State if s.is_active} == {
        State.CLAIMED,
        State.RUNNING,
        State.COMMITTING,
        State.CANCELLING,
    }
    assert not any(s.is_active and s.is_terminal for s in State)


def test_succeeded_and_cancelled_are_permanent_and_nothing_else_is() -> None:
    assert {s for s in State if s.is_permanent} == {State.SUCCEEDED, State.CANCELLED}
    for target in State:
        for permanent in (State.SUCCEEDED, State.CANCELLED):
            with pytest.raises(IllegalTransition):
                permanent.check(target)


def test_failed_and_paused_can_be_continued_by_an_operator() -> None:
    State.FAILED.check(State.READY)
    State.PAUSED.check(State.READY)
    State.FAILED.check(State.CANCELLED)
    State.PAUSED.check(State.CANCELLED)


@pytest.mark.parametrize(("src", "dst"), ALL_PAIRS, ids=lambda s: s.value)
def test_check_accepts_exactly_the_pairs_in_the_table(src: State, dst: State) -> None:
    if dst in TRANSITIONS[src]:
        src.check(dst)
    else:
        with pytest.raises(IllegalTransition) as info:
            src.check(dst)
        assert isinstance(info.value, FlowError)
        assert f"{src.value} -> {dst.value}" in str(info.value)


def test_the_protocol_paths_of_a_job_are_legal() -> None:
    paths = [
        # a job that runs once and succeeds
        [State.SUBMITTED, State.READY, State.CLAIMED, State.RUNNING, State.COMMITTING,
         State.SUCCEEDED],
        # the same, committed directly (a plain success of the attempt's own manager)
        [State.SUBMITTED, State.READY, State.CLAIMED, State.RUNNING, State.SUCCEEDED],
        # a job that spawns children, waits, then continues
        [State.RUNNING, State.COMMITTING, State.WAITING, State.READY],
        # cancellation of a running job is fenced, then verified
        [State.RUNNING, State.CANCELLING, State.CANCELLED],
        # a failure resumed by an operator
        [State.COMMITTING, State.FAILED, State.READY],
        # a lease takeover puts work back
        [State.CLAIMED, State.READY],
        [State.RUNNING, State.READY],
    ]  # fmt: skip
    for path in paths:
        for a, b in itertools.pairwise(path):
            a.check(b)


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        (State.SUBMITTED, State.RUNNING),
        (State.READY, State.RUNNING),
        (State.RUNNING, State.FAILED),  # only a plain success is committed directly
        (State.RUNNING, State.CANCELLED),  # never cancelled without a verified exit
        (State.CANCELLING, State.READY),
        (State.FAILED, State.SUCCEEDED),
        (State.CLAIMED, State.CLAIMED),
    ],
)
def test_shortcuts_that_skip_a_protocol_step_are_illegal(src: State, dst: State) -> None:
    with pytest.raises(IllegalTransition):
        src.check(dst)


def test_every_state_but_the_permanent_ones_can_reach_a_terminal_state() -> None:
    for start in State:
        seen, frontier = {start}, [start]
        while frontier:
            for nxt in TRANSITIONS[frontier.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        assert any(s.is_terminal for s in seen), start


def test_a_commit_ends_out_of_committing_or_directly_from_running_to_succeeded() -> None:
    ends = {(a, b) for a, b in ALL_PAIRS if b in TRANSITIONS[a] and ends_commit(a, b)}
    out_of_committing = {(State.COMMITTING, b) for b in TRANSITIONS[State.COMMITTING]}
    assert ends == (out_of_committing - {(State.COMMITTING, State.COMMITTING)}) | {
        (State.RUNNING, State.SUCCEEDED)
    }
    # running -> committing starts a commit; running -> ready is an interruption, no commit
    assert not ends_commit(State.RUNNING, State.COMMITTING)
    assert not ends_commit(State.RUNNING, State.READY)
    assert not ends_commit(None, State.SUBMITTED)
