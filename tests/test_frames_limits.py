"""The snapshot's budget counts and the members a time limit adds, as journal frames.

`charged` (charged failures over the job's life) and `timeouts` (attempts of this
activation stopped at their time limit) are written only when non-zero, so a frame of a
version that did not know them reads them as 0, and a frame that has them written back
is the same frame.
"""

from __future__ import annotations

from typing import Any

import pytest

from httk_flow.protocol.frames import (
    AttemptRecord,
    BadFrame,
    Changes,
    Frame,
    Last,
    LastKind,
    Result,
    Snapshot,
    check_frame,
)

RUNNING: dict[str, Any] = {
    "job": "j1",
    "key": "k1",
    "placement": "p",
    "from": "claimed",
    "to": "running",
    "gen": 3,
    "prev": "w1-0-a",
    "t": 2.0,
    "by": "m1",
    "step": "main",
    "act": 1,
    "try": 1,
    "tries": 1,
    "attempt": {"n": 1, "manager": "m1", "host": "h", "step": "main", "id": "a0001"},
}


def test_a_frame_without_the_counts_reads_them_as_zero_and_writes_none() -> None:
    frame = Frame.from_json(RUNNING)
    assert (frame.snap.charged, frame.snap.timeouts) == (0, 0)
    written = frame.to_json()
    assert "charged" not in written and "timeouts" not in written
    assert frame.body.attempt is not None and frame.body.attempt.limit is None
    assert "limit" not in written["attempt"]


def test_the_counts_and_the_limit_are_written_when_set_and_read_back() -> None:
    raw = {
        **RUNNING,
        "charged": 3,
        "timeouts": 2,
        "attempt": {**RUNNING["attempt"], "pid": 7, "pgid": 7, "dir": "/d", "limit": 8.0},
    }
    frame = Frame.from_json(raw)
    assert (frame.snap.charged, frame.snap.timeouts) == (3, 2)
    assert frame.body.attempt is not None and frame.body.attempt.limit == 8.0
    assert frame.to_json() == raw
    assert Frame.from_json(frame.to_json()) == frame
    assert frame.body.extra == ()  # known members, not kept as a newer version's


def test_a_result_records_the_limit_it_was_stopped_at_and_its_elapsed_time() -> None:
    r = Result(exit=None, signal=15, time_limit=2.0, elapsed=2.013)
    assert r.to_json() == {"exit": None, "signal": 15, "time_limit": 2.0, "elapsed": 2.013}
    assert Result.from_json(r.to_json()) == r
    assert Result.from_json({"exit": 0, "signal": None}) == Result(0)


@pytest.mark.parametrize(
    "bad",
    [
        {"charged": -1},
        {"charged": "1"},
        {"timeouts": 1.5},
        {"attempt": {**RUNNING["attempt"], "limit": -1}},
        {"attempt": {**RUNNING["attempt"], "limit": "2s"}},
    ],
    ids=repr,
)
def test_a_count_or_limit_of_the_wrong_shape_makes_the_frame_unreadable(
    bad: dict[str, Any],
) -> None:
    raw = {**RUNNING, **bad}
    with pytest.raises(BadFrame):
        Frame.from_json(raw)
    assert check_frame(raw) is not None


def test_timeouts_belong_to_their_activation() -> None:
    snap = Snapshot(step="main", act=2, try_=3, charged=2, timeouts=2)
    # a snapshot of another activation starts the count again, unless it is given
    assert snap.but(act=3, try_=0).timeouts == 0
    assert snap.but(act=3, timeouts=1).timeouts == 1
    assert snap.but(try_=1).timeouts == 2
    assert snap.but(act=3).charged == 2  # the life count runs on
    # so does a decision's final frame: an advance starts the count again
    advance = Changes(step="two", act=3, try_=0)
    assert advance.snapshot(snap).timeouts == 0
    assert advance.snapshot(snap).charged == 2
    retry = Changes(charged=3, timeouts=3)
    assert (retry.snapshot(snap).charged, retry.snapshot(snap).timeouts) == (3, 3)
    assert Changes.from_json(retry.to_json()) == retry


def test_the_words_of_a_time_limit_are_in_the_vocabulary_of_last() -> None:
    assert Last.parse("time limit 2s reached").kind is LastKind.RETRYING
    for code in ("time_limit", "program_not_found", "program_not_executable"):
        assert Last.parse(code) == Last.failed(code)


def test_a_launched_attempt_records_its_limit() -> None:
    att = AttemptRecord(n=1, id="a0001", manager="m", host="h", step="main")
    launched = att.launched(pid=5, start_time=9, dir="/d", limit=4.0)
    assert (launched.pid, launched.pgid, launched.limit) == (5, 5, 4.0)
    assert AttemptRecord.from_json(launched.to_json()) == launched
