"""Typed journal frames: parsed once, written once, and read by no one by string key."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from httk_flow.protocol.frames import (
    AttemptRecord,
    BadFrame,
    Body,
    Changes,
    DecisionRecord,
    Evidence,
    Failure,
    Frame,
    Join,
    Joined,
    Killed,
    Last,
    LastKind,
    Result,
    Snapshot,
    check_frame,
)
from httk_flow.protocol.names import RecordRef
from httk_flow.protocol.states import State

PKG = Path(__file__).resolve().parent.parent / "httk_flow"

# -- strategies -------------------------------------------------------------------------

text = st.text(min_size=1, max_size=12)
small = st.integers(min_value=0, max_value=10_000)
refs = st.builds(RecordRef, st.from_regex(r"[0-9a-z]{4,10}", fullmatch=True), small, small)
lasts = st.one_of(
    st.sampled_from([k for k in LastKind if k not in (LastKind.RETRYING, LastKind.OTHER)]).map(
        Last.of
    ),
    st.sampled_from(["protocol_error", "manager_deaths", "commit_error"]).map(Last.failed),
    text.map(lambda t: Last.retrying(f"process failure: {t}")),
)
snapshots = st.builds(
    Snapshot,
    step=st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True),
    act=st.integers(1, 50),
    try_=small,
    tries=small,
    intr=small,
    deaths=small,
    last=st.none() | lasts,
    join_ref=st.none() | refs,
)
failures = st.builds(Failure, text, text, st.booleans())
attempts = st.builds(
    AttemptRecord,
    n=st.integers(1, 9999),
    id=text,
    manager=text,
    host=text,
    step=text,
    pid=st.none() | small,
    pgid=st.none() | small,
    start_time=st.none() | small,
    dir=st.none() | text,
)
results = st.builds(
    Result,
    exit=st.none() | st.integers(-255, 255),
    signal=st.none() | st.integers(1, 64),
    outcome=st.none() | st.just({"action": "succeed", "message": "m"}),
    outcome_error=st.none() | text,
    interrupted=st.none() | st.sampled_from(["drain", "takeover"]),
)
joins = st.builds(
    Join,
    mode=st.sampled_from(["all_succeeded", "all_done", "any_succeeded"]),
    next=text,
    on_impossible=st.none() | text,
    act=st.integers(1, 50),
    children=st.lists(st.tuples(text, st.none() | text), max_size=4).map(tuple),
)
changes = st.builds(
    Changes,
    step=st.none() | text,
    act=st.none() | small,
    try_=st.none() | small,
    intr=st.none() | small,
    deaths=st.none() | small,
    last=st.none() | lasts,
    clear_join_ref=st.booleans(),
    message=st.none() | text,
    failure=st.none() | failures,
    join=st.none() | joins,
)
takeovers = st.builds(
    Evidence,
    owner=st.none() | text,
    evidence=st.none() | text,
    host=st.none() | text,
    owner_evidence=st.none() | text,
    killed=st.none()
    | st.builds(
        Killed, st.just(9), text, small, st.floats(0, 2e9).map(lambda t: round(t, 3)), text
    ),
)
reapings = st.builds(
    Evidence,
    exit=st.none() | st.integers(-255, 255),
    signal=st.none() | st.integers(1, 64),
    verified=text,
    group_gone=st.booleans(),
)
bodies = st.builds(
    Body,
    snap=snapshots,
    why=st.none() | text,
    message=st.none() | text,
    reason=st.none() | text,
    attempt=st.none() | attempts,
    result=st.none() | results,
    decision=st.none()
    | st.builds(DecisionRecord, st.sampled_from(list(State)), text, changes, small),
    failure=st.none() | failures,
    join=st.none() | joins,
    joined=st.none() | st.builds(Joined, small, small, small),
    evidence=st.none() | takeovers | reapings,
    requests=st.none() | st.lists(text, max_size=3).map(tuple),
    set_priority=st.none() | st.integers(0, 1000),
    extra=st.just((("newer_member", {"x": 1}),)) | st.just(()),
)
frames = st.builds(
    Frame,
    job=text,
    key=text,
    placement=text,
    source=st.none() | st.sampled_from(list(State)),
    to=st.sampled_from(list(State)),
    gen=small,
    prev=st.none() | refs,
    t=st.floats(0, 2e9).map(lambda t: round(t, 3)),
    by=text,
    body=bodies,
)


@settings(max_examples=300, deadline=None)
@given(frames)
def test_every_frame_reads_back_as_it_was_written(frame: Frame) -> None:
    raw = orjson.loads(orjson.dumps(frame.to_json()))
    assert check_frame(raw) is None
    assert Frame.from_json(raw) == frame


# -- frames written by the code before the types ----------------------------------------

#: frames as the previous commit wrote them (one of each shape the engine writes)
OLD_FRAMES: list[dict[str, Any]] = [
    {
        "job": "j1",
        "key": "k1",
        "placement": "p",
        "to": "submitted",
        "gen": 0,
        "prev": None,
        "t": 1.5,
        "by": "submit",
        "step": "main",
        "act": 1,
        "try": 0,
        "tries": 0,
    },
    {
        "job": "j1",
        "key": "k1",
        "placement": "p",
        "from": "ready",
        "to": "claimed",
        "gen": 2,
        "prev": "w1-0-a",
        "t": 2.0,
        "by": "m1",
        "step": "main",
        "act": 1,
        "try": 1,
        "tries": 1,
        "attempt": {"n": 1, "manager": "m1", "host": "h", "step": "main", "id": "a0001"},
        "why": "claimed",
    },
    {
        "job": "j1",
        "key": "k1",
        "placement": "p",
        "from": "running",
        "to": "committing",
        "gen": 4,
        "prev": "w1-0-1b",
        "t": 3.0,
        "by": "m1",
        "step": "main",
        "act": 1,
        "try": 1,
        "tries": 1,
        "intr": 0,
        "deaths": 0,
        "attempt": {
            "n": 1,
            "manager": "m1",
            "host": "h",
            "step": "main",
            "id": "a0001",
            "pid": 77,
            "pgid": 77,
            "start_time": 12345,
            "dir": "/w/p/k1/attempts/a0001",
        },
        "result": {"exit": 0, "signal": None, "outcome": {"action": "wait", "message": ""}},
        "decision": {
            "target": "waiting",
            "why": "wait",
            "body": {
                "join": {
                    "mode": "all_succeeded",
                    "next": "collect",
                    "on_impossible": None,
                    "act": 1,
                    "children": [["c1", None], ["c2", "t2"]],
                },
                "last": "waiting",
                "join_ref": None,
            },
            "not_before": 0,
        },
        "why": "wait",
        "evidence": {"owner": "m0", "evidence": "lease_expired", "host": "h2"},
        "requests": ["r1"],
        "set_priority": 700,
    },
    {
        "job": "j1",
        "key": "k1",
        "placement": "p",
        "from": "waiting",
        "to": "ready",
        "gen": 6,
        "prev": "w1-0-2c",
        "t": 4.0,
        "by": "m1",
        "step": "collect",
        "act": 2,
        "try": 0,
        "tries": 1,
        "last": "joined",
        "join_ref": "w1-0-2c",
        "why": "joined",
        "joined": {"children": 2, "succeeded": 2, "failed": 0},
    },
    {
        "job": "j2",
        "key": "k2",
        "placement": "p",
        "from": "committing",
        "to": "failed",
        "gen": 5,
        "prev": "w1-1-0",
        "t": 5.0,
        "by": "m2",
        "step": "main",
        "act": 1,
        "try": 3,
        "tries": 3,
        "last": "process failure: exit status 1",
        "failure": {"code": "budget_exhausted", "message": "spent", "retryable": True},
        "why": "budget_exhausted",
    },
    {
        "job": "j3",
        "key": "k3",
        "placement": "p",
        "from": "cancelling",
        "to": "cancelled",
        "gen": 5,
        "prev": "w1-1-9",
        "t": 6.0,
        "by": "m2",
        "step": "main",
        "act": 1,
        "try": 1,
        "tries": 1,
        "attempt": {"n": 1, "manager": "m2", "host": "h", "step": "main", "id": "a0001"},
        "evidence": {"exit": None, "signal": 9, "verified": "reaped", "group_gone": True},
        "why": "cancelled",
        "reason": "wrong input",
    },
]


def _meaning(d: dict[str, Any]) -> dict[str, Any]:
    """A frame's content with the members that mean "nothing" dropped."""
    out = {k: v for k, v in d.items() if v is not None and not (k in ("intr", "deaths") and not v)}
    dec = out.get("decision")
    if isinstance(dec, dict):
        out["decision"] = {**dec, "body": {k: v for k, v in dec["body"].items()}}
    return out


@pytest.mark.parametrize("raw", OLD_FRAMES, ids=lambda d: f"{d['key']}-{d['to']}")
def test_frames_of_the_previous_format_read_and_write_back_the_same(raw: dict[str, Any]) -> None:
    frame = Frame.from_json(raw)
    assert _meaning(frame.to_json()) == _meaning(raw)
    assert Frame.from_json(frame.to_json()) == frame


def test_members_read_as_types() -> None:
    committing = Frame.from_json(OLD_FRAMES[2])
    assert committing.source is State.RUNNING and committing.to is State.COMMITTING
    assert committing.prev == RecordRef.parse("w1-0-1b")
    body = committing.body
    assert body.attempt is not None and body.attempt.pid == 77 and body.attempt.n == 1
    assert body.decision is not None and body.decision.target is State.WAITING
    join = body.decision.changes.join
    assert join is not None and join.children == (("c1", None), ("c2", "t2"))
    assert body.decision.changes.clear_join_ref
    assert body.requests == ("r1",) and body.set_priority == 700
    released = Frame.from_json(OLD_FRAMES[3])
    assert released.snap.join_ref == RecordRef.parse("w1-0-2c")
    assert released.snap.last == Last.of(LastKind.JOINED)
    failed = Frame.from_json(OLD_FRAMES[4])
    assert failed.snap.last is not None and failed.snap.last.kind is LastKind.RETRYING
    assert failed.body.failure == Failure("budget_exhausted", "spent", True)


def test_last_is_a_vocabulary_that_keeps_its_text() -> None:
    assert Last.parse("interrupted").unclean
    assert Last.parse("succeeded").kind is LastKind.SUCCEEDED
    assert Last.parse("manager_deaths") == Last.failed("manager_deaths")
    assert Last.parse("retry requested: later").kind is LastKind.RETRYING
    odd = Last.parse("something a newer version says")
    assert odd.kind is LastKind.OTHER and odd.text == "something a newer version says"
    assert not odd.unclean


@pytest.mark.parametrize(
    ("change", "member"),
    [
        ({"try": -1}, "try"),
        ({"act": "1"}, "act"),
        ({"attempt": {"n": "one"}}, "attempt"),
        ({"attempt": []}, "attempt"),
        ({"join_ref": "not a ref"}, "join_ref"),
        ({"to": "flying"}, "to"),
        ({"failure": {"code": 5}}, "failure"),
        ({"decision": {"target": "nowhere"}}, "decision"),
        ({"join": {"children": [["only-label"]]}}, "join"),
        ({"requests": "r1"}, "requests"),
        ({"evidence": {"group_gone": "yes"}}, "evidence"),
    ],
)
def test_a_member_of_the_wrong_shape_is_named(change: dict[str, Any], member: str) -> None:
    raw = {**OLD_FRAMES[1], **change}
    with pytest.raises(BadFrame) as e:
        Frame.from_json(raw)
    assert e.value.member.split(".")[0] == member
    assert check_frame(raw) == f"member {member!r}"


def test_members_a_newer_version_wrote_are_kept() -> None:
    raw = {**OLD_FRAMES[1], "lease_class": {"gpu": 1}}
    frame = Frame.from_json(raw)
    assert frame.body.extra == (("lease_class", {"gpu": 1}),)
    assert frame.to_json()["lease_class"] == {"gpu": 1}
    # carried into the next frame they are not: they described this move only
    assert frame.body.carry().extra == ()


# -- nobody else reads a frame by string key ---------------------------------------------

FRAME_MODULES = {"protocol/frames.py", "protocol/members.py", "protocol/frame_fields.py"}
MEMBERS = (
    "step act try tries intr deaths last join_ref attempt result decision failure join joined "
    "evidence requests set_priority why charged timeouts"
).split()
#: other documents that share member names: read by key in their own parsers
OTHER_DOCUMENTS = {
    "protocol/outcome.py": "outcome.json and children.jsonl",
    "protocol/jobspec.py": "job.json",
    "runner/context.py": "an attempt's context.json",
    "runner/__init__.py": "an attempt's context.json",
    "protocol/logstream.py": "a log record's header",
}
READ = re.compile(
    r"""(?:\.get\(\s*|\[\s*)["'](""" + "|".join(MEMBERS) + r""")["']\s*(?:[,)]|\](?!\s*=[^=]))"""
)


def test_no_module_outside_the_frame_types_reads_a_member_by_string_key() -> None:
    assert all((PKG / rel).is_file() for rel in FRAME_MODULES | set(OTHER_DOCUMENTS))
    found = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if rel in FRAME_MODULES or rel in OTHER_DOCUMENTS:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if READ.search(line):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert found == [], "read frames through httk_flow.protocol.frames:\n" + "\n".join(found)


def test_the_scan_sees_what_it_forbids() -> None:
    for bad in ('x = frame.get("attempt")', 'n = frame["try"]', "s = f.get('step', '?')"):
        assert READ.search(bad), bad
    for fine in ('d["step"] = s', 'body["result"] = r', 'frame.get("attemptx")'):
        assert not READ.search(fine), fine
