"""Every parser of hostile input fed random bytes and structured garbage: each returns a
value or raises a FlowError subclass, never another exception. Each test runs a fixed
number of examples; conftest.py prints how many inputs each parser was handed."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from httk_flow.cli.main import cli
from httk_flow.errors import (
    CorruptRecord,
    FlowError,
    InvalidJob,
    InvalidName,
    InvalidOutcome,
    UsageError,
    WorkspaceError,
)
from httk_flow.ops import bulk
from httk_flow.protocol import names, requests
from httk_flow.protocol.jobspec import JobSpec, Program
from httk_flow.protocol.journal import JournalReader, check_frame, iter_segment
from httk_flow.protocol.leases import ManagerInfo
from httk_flow.protocol.names import Marker, RecordRef
from httk_flow.protocol.outcome import (
    Action,
    Outcome,
    TornOutcome,
    parse_outcome,
    read_outcome,
)
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.workspace import Policy, Workspace, WorkspaceFormat

from .tally import tried


def fuzz(n: int) -> settings:
    return settings(
        max_examples=n,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        database=None,
    )


# -- strategies ---------------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=24)
    | st.sampled_from(["", "main", "../x", "a/b", ".flow", "\x00", "0" * 32, "f" * 64])
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def encoded(v: Any) -> bytes:
    """JSON as any writer may produce it (integers of any size included)."""
    return json.dumps(v).encode()


def structured(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects with the parser's own member names, each holding anything."""
    return st.fixed_dictionaries({}, optional={k: values for k in keys})


def documents(keys: list[str], valid: dict[str, Any] | None = None) -> st.SearchStrategy[bytes]:
    """Raw bytes, JSON garbage, the parser's members with wrong contents, and (given a
    valid document) that document with one member replaced or removed."""
    options = [
        st.binary(max_size=200),
        values.map(encoded),
        structured(keys).map(encoded),
    ]
    if valid is not None:

        def mutate(change: tuple[str, Any, bool]) -> bytes:
            key, value, drop = change
            d = dict(valid)
            if drop:
                d.pop(key, None)
            else:
                d[key] = value
            return encoded(d)

        options.append(st.tuples(st.sampled_from(sorted(valid)), values, st.booleans()).map(mutate))
    return st.one_of(*options)


JOB_ID = "0123456789abcdef0123456789abcdef"
VALID_JOB = JobSpec(
    id=JOB_ID,
    key=f"t--{JOB_ID}",
    tag="t",
    name="n",
    program=Program(digest="a" * 64, name="run.sh"),
    args=("x",),
    step="main",
    params={"n": 1},
    priority=500,
    placement="jobs/012",
    time=60.0,
).to_dict()


# -- job.json -----------------------------------------------------------------------------


@fuzz(200)
@given(documents(sorted(VALID_JOB), VALID_JOB))
def test_job_json(raw: bytes) -> None:
    tried("JobSpec.from_json")
    try:
        spec = JobSpec.from_json(raw, "job.json")
    except InvalidJob:
        return
    # whatever it accepts it writes back as a definition it accepts again, unchanged
    assert JobSpec.from_json(spec.to_json(), "again") == spec


# -- outcome.json and children.jsonl ------------------------------------------------------

OUTCOME_KEYS = ["action", "message", "step", "code", "join", "on_impossible"]
outcome_docs = st.one_of(
    documents(OUTCOME_KEYS),
    st.fixed_dictionaries(
        {"action": st.sampled_from(["succeed", "fail", "advance", "retry", "pause", "wait"])},
        optional={k: values for k in OUTCOME_KEYS[1:]},
    ).map(encoded),
)


@fuzz(300)
@given(outcome_docs)
def test_outcome_json(raw: bytes) -> None:
    tried("parse_outcome")
    try:
        out = parse_outcome(raw, "outcome.json")
    except InvalidOutcome:
        return
    assert isinstance(out, Outcome)


#: outcome.line as a runner may leave it: a document with its newline, without one (cut
#: short), with more than one line, or any bytes at all
line_docs = st.one_of(
    outcome_docs.map(lambda raw: raw + b"\n"),
    outcome_docs,
    st.tuples(outcome_docs, outcome_docs).map(lambda two: two[0] + b"\n" + two[1] + b"\n"),
    st.binary(max_size=200),
)


@fuzz(300)
@example(b'{"action":"succeed"}\n', "none")
@example(b'{"action":"succeed"}', "none")
@example(b'{"action":"wait","step":"two"}\n', "none")
@example(b'{"action":"succeed"}\n', "ready")
@example(b'{"action":"succeed"}\n', "duplicate")
@example(b"\x00\n", "none")
@given(line_docs, st.sampled_from(["none", "ready", "duplicate"]))
def test_outcome_line(scratch: str, raw: bytes, beside: str) -> None:
    """Any bytes in outcome.line, alone or beside a second publication: read_outcome
    returns an outcome or raises InvalidOutcome, and accepts only one whole line that is
    not a wait, read as parse_outcome reads it."""
    tried("read_outcome + outcome.line")
    scratch = os.path.join(scratch, "line")  # not the attempt of the children.jsonl tests
    os.makedirs(scratch, exist_ok=True)
    for name in ("outcome.line", "outcome.duplicate"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(scratch, name))
    shutil.rmtree(os.path.join(scratch, "outcome.ready"), ignore_errors=True)
    with open(os.path.join(scratch, "outcome.line"), "wb") as fh:
        fh.write(raw)
    if beside == "ready":
        os.mkdir(os.path.join(scratch, "outcome.ready"))
        with open(os.path.join(scratch, "outcome.ready", "outcome.json"), "wb") as fh:
            fh.write(b'{"action":"succeed"}\n')
    elif beside == "duplicate":
        with open(os.path.join(scratch, "outcome.duplicate"), "wb") as fh:
            fh.write(b"succeed\n")
    try:
        out = read_outcome(scratch)
    except TornOutcome as e:
        # torn: cut short (no final newline) or holding a hole of NUL bytes
        assert beside == "none" and (not raw.endswith(b"\n") or b"\0" in raw), e.render()
        return
    except InvalidOutcome as e:
        if beside != "none":
            assert "more than one outcome" in e.render()
        return
    assert beside == "none"
    assert out is not None and out.action is not Action.WAIT
    assert raw.endswith(b"\n") and raw.count(b"\n") == 1
    assert out == parse_outcome(raw, "outcome.line")


CHILD_KEYS = ["label", "tag", "step", "params", "priority", "program"]
#: tag and step as the grammar has them: strings (null is accepted for a tag only)
strings = st.text(max_size=12) | st.sampled_from(["main", "../x", "a/b", ""])


def child_lines(
    tag: st.SearchStrategy[Any], step: st.SearchStrategy[Any]
) -> st.SearchStrategy[bytes]:
    line = st.one_of(
        st.binary(max_size=60).filter(lambda b: b"\n" not in b and b"\r" not in b),
        values.map(encoded),
        st.fixed_dictionaries(
            {"label": st.text(max_size=10) | st.sampled_from(["a", "b", "../x"])},
            optional={
                "tag": tag,
                "step": step,
                "params": values,
                "priority": values,
                "program": values,
            },
        ).map(encoded),
    )
    return st.lists(line, max_size=6).map(lambda lines: b"\n".join(lines) + b"\n")


def _read_children(tmp: str, data: bytes) -> None:
    ready = os.path.join(tmp, "outcome.ready")
    shutil.rmtree(ready, ignore_errors=True)
    os.mkdir(ready)
    with open(os.path.join(ready, "outcome.json"), "wb") as fh:
        fh.write(b'{"action":"wait","step":"two","join":"all_done"}')
    with open(os.path.join(ready, "children.jsonl"), "wb") as fh:
        fh.write(data)
    try:
        out = read_outcome(tmp)
    except InvalidOutcome:
        return
    assert out is not None and out.children
    assert len({c.label for c in out.children}) == len(out.children)


@pytest.fixture(scope="module")
def scratch() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="fuzz-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@fuzz(200)
@given(child_lines(st.none() | strings, strings))
def test_children_jsonl(scratch: str, data: bytes) -> None:
    tried("read_outcome + children.jsonl")
    _read_children(scratch, data)


@fuzz(50)
@example(b'{"label":"a","step":null}\n')
@given(child_lines(values, values))
def test_children_jsonl_with_members_of_any_type(scratch: str, data: bytes) -> None:
    tried("read_outcome + children.jsonl (any types)")
    _read_children(scratch, data)


# -- names ----------------------------------------------------------------------------------

canonical_markers = st.builds(
    Marker,
    key=st.from_regex(names.KEY_RE, fullmatch=True),
    priority=st.integers(0, 999),
    generation=st.integers(0, 36**13 - 1),
    ref=st.builds(
        RecordRef,
        st.from_regex(names.WRITER_RE, fullmatch=True),
        st.integers(0, 36**13 - 1),
        st.integers(0, 36**13 - 1),
    ),
    not_before=st.integers(0, 36**13 - 1),
    service=st.just("") | st.from_regex(r"[0-9a-z]{1,16}", fullmatch=True),
)


def _mangle(pair: tuple[str, int, str]) -> str:
    name, at, text = pair
    at = at % (len(name) + 1)
    return name[:at] + text + name[at + 1 :]


marker_names = st.one_of(
    st.text(max_size=120),
    st.from_regex(names.MARKER_RE, fullmatch=True),
    canonical_markers.map(lambda m: m.name),
    st.tuples(
        canonical_markers.map(lambda m: m.name), st.integers(0, 200), st.text(max_size=3)
    ).map(_mangle),
)


@fuzz(300)
@given(marker_names)
def test_marker_names(name: str) -> None:
    tried("Marker.from_name")
    try:
        m = Marker.from_name(name)
    except InvalidName:
        assert Marker.parse_or_none(name) is None
        return
    assert Marker.parse_or_none(name) == m
    assert m.job_id in name and names.ID_RE.fullmatch(m.job_id)


@fuzz(200)
@given(canonical_markers)
def test_a_marker_name_round_trips(m: Marker) -> None:
    tried("Marker.name round trip")
    assert Marker.from_name(m.name) == m


def _zero_not_before(name: str) -> bool:
    return ".t0." in name


@fuzz(100)
@given(st.from_regex(names.MARKER_RE, fullmatch=True).filter(lambda n: not _zero_not_before(n)))
def test_every_marker_name_of_the_grammar_round_trips(name: str) -> None:
    """A name of the grammar is the one spelling of its marker: every rename of the job
    builds its source path from the parsed marker, so any other spelling would be missed."""
    tried("Marker.from_name round trip (grammar)")
    assert Marker.from_name(name).name == name


def test_a_zero_not_before_is_not_a_second_spelling() -> None:
    tried("Marker.from_name round trip (grammar)")
    name = "0123456789abcdef0123456789abcdef.p500.g0.t0.w-0-0"
    m = Marker.parse_or_none(name)
    assert m is None or m.name == name


NON_CANONICAL = [
    "0123456789abcdef0123456789abcdef.p500.g00.w-0-0",
    "0123456789abcdef0123456789abcdef.p500.g01.w-0-0",
    "0123456789abcdef0123456789abcdef.p500.g1.t0a.w-0-0",
    "0123456789abcdef0123456789abcdef.p500.g1.w-00-0",
    "0123456789abcdef0123456789abcdef.p500.g1.w-0-01",
    "0123456789abcdef0123456789abcdef.p500.gA.w-0-0",
]


@pytest.mark.parametrize("name", NON_CANONICAL)
def test_a_number_spelled_with_leading_zeros_is_not_of_the_grammar(name: str) -> None:
    """One spelling per number (canonical base36): a marker renamed by hand to `g00` is
    not generation 0 but a stranger, reported and never moved."""
    tried("Marker.from_name (non-canonical)")
    assert Marker.parse_or_none(name) is None
    with pytest.raises(InvalidName):
        Marker.from_name(name)


@fuzz(200)
@given(
    st.one_of(
        st.text(max_size=60),
        st.from_regex(names.REF_RE, fullmatch=True),
        st.tuples(
            st.from_regex(names.REF_RE, fullmatch=True), st.integers(0, 60), st.text(max_size=2)
        ).map(_mangle),
    )
)
def test_record_refs(text: str) -> None:
    tried("RecordRef.parse")
    try:
        ref = RecordRef.parse(text)
    except InvalidName:
        return
    assert ref.writer == text.split("-")[0]


# -- workspace format and heartbeats ------------------------------------------------------

FORMAT_KEYS = ["format", "version", "workspace_id", "created", "policy"]
POLICY_KEYS = [f.name for f in dataclasses.fields(Policy)]
format_docs = st.one_of(
    documents(FORMAT_KEYS),
    st.fixed_dictionaries(
        {
            "format": st.just("httk-flow"),
            "version": st.just(1) | values,
            "workspace_id": st.text(max_size=8) | values,
            "created": st.floats(0, 2e9) | values,
        },
        optional={"policy": structured(POLICY_KEYS) | values},
    ).map(encoded),
)


@fuzz(250)
@given(format_docs)
def test_workspace_format(raw: bytes) -> None:
    tried("WorkspaceFormat.from_json")
    try:
        fmt = WorkspaceFormat.from_json(raw, "format.json")
    except WorkspaceError:
        return
    assert fmt.policy.lease > 0
    assert WorkspaceFormat.from_json(fmt.to_json(), "again") == fmt


HEARTBEAT_KEYS = [f.name for f in dataclasses.fields(ManagerInfo) if f.name != "extra"]
VALID_HEARTBEAT = json.loads(ManagerInfo("m1", "h", 1, 0.0).to_json())


@fuzz(250)
@given(documents(HEARTBEAT_KEYS, VALID_HEARTBEAT))
def test_heartbeat(raw: bytes) -> None:
    tried("ManagerInfo.from_json")
    try:
        info = ManagerInfo.from_json(raw, "heartbeat.json")
    except FlowError:
        return
    assert isinstance(info.serves(None, ()), bool)


# -- journal segments -----------------------------------------------------------------------

segments = st.one_of(
    st.binary(max_size=400),
    st.lists(values.map(encoded) | st.binary(max_size=40), max_size=8).map(
        lambda ls: b"\n".join(ls)
    ),
    st.lists(structured(["job", "key", "to", "gen", "prev"]).map(encoded), max_size=6).map(
        lambda ls: b"\n".join(ls) + b"\n"
    ),
)


def _segment(tmp: str, data: bytes) -> tuple[str, str]:
    journal = os.path.join(tmp, "journal")
    shutil.rmtree(journal, ignore_errors=True)
    os.makedirs(os.path.join(journal, "w"))
    path = os.path.join(journal, "w", "0.jsonl")
    with open(path, "wb") as fh:
        fh.write(data)
    return journal, path


@fuzz(250)
@given(segments, st.integers(0, 2**62) | st.integers(0, 500), st.integers(0, 2))
def test_journal_read(scratch: str, data: bytes, offset: int, segment: int) -> None:
    tried("JournalReader.read/chain")
    journal, _ = _segment(scratch, data)
    reader = JournalReader(journal)
    try:
        frame = reader.read(RecordRef("w", segment, offset))
        assert isinstance(frame, dict)
        for f in reader.chain_json(RecordRef("w", segment, offset), limit=20):
            assert isinstance(f, dict)
    except (CorruptRecord, InvalidName):
        pass
    finally:
        reader.close()


@fuzz(30)
@example(b"{}\n", 36**13 - 1)
@given(segments, st.integers(2**63 - 4096, 36**13 - 1))
def test_journal_read_near_2_63(scratch: str, data: bytes, offset: int) -> None:
    tried("JournalReader.read (offsets near 2**63)")
    journal, _ = _segment(scratch, data)
    reader = JournalReader(journal)
    try:
        reader.read(RecordRef("w", 0, offset))
    except CorruptRecord:
        pass
    finally:
        reader.close()


@fuzz(200)
@given(segments)
def test_iter_segment_agrees_with_the_reader(scratch: str, data: bytes) -> None:
    """Where iter_segment sees a frame, the reader returns the same frame, or refuses it
    as corrupt because a member has the wrong type (frames are typed at the boundary)."""
    tried("iter_segment")
    journal, path = _segment(scratch, data)
    reader = JournalReader(journal)
    try:
        last = -1
        for off, frame in iter_segment(path):
            assert off > last
            last = off
            if frame is None:
                continue
            if check_frame(frame) is None:
                assert reader.read(RecordRef("w", 0, off)) == frame
            else:
                with pytest.raises(CorruptRecord):
                    reader.read(RecordRef("w", 0, off))
    finally:
        reader.close()


def test_a_frame_every_reader_refuses_is_unreadable_to_fsck_too(scratch: str) -> None:
    tried("iter_segment")
    _, path = _segment(scratch, b'{"job":"x","gen":"seven"}\n')
    assert list(iter_segment(path)) == [(0, None)]


# -- bulk submission ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def submitter() -> Iterator[tuple[Submitter, str]]:
    d = tempfile.mkdtemp(prefix="fuzz-ws-")
    prog = os.path.join(d, "run.sh")
    with open(prog, "w") as fh:
        fh.write("#!/bin/sh\nexit 0\n")
    os.chmod(prog, 0o755)
    ws = Workspace.create(os.path.join(d, "ws"))
    yield Submitter(ws), prog
    ws.close()
    shutil.rmtree(d, ignore_errors=True)


LINE_KEYS = sorted(bulk.LINE_KEYS)
bulk_lines = st.lists(
    st.one_of(
        st.binary(max_size=60).filter(lambda b: b"\n" not in b),
        values.map(encoded),
        structured(LINE_KEYS).map(encoded),
        structured(["name", "tag", "placement", "time", "priority", "params"]).map(encoded),
    ),
    max_size=5,
)


@fuzz(150)
@given(bulk_lines)
def test_bulk_jsonl(submitter: tuple[Submitter, str], lines: list[bytes]) -> None:
    tried("bulk.jsonl_requests + Submitter.build")
    sub, prog = submitter
    base = SubmitRequest(program=prog)
    try:
        for req in bulk.jsonl_requests([line + b"\n" for line in lines], base, "jobs.jsonl"):
            # the program and the inputs are files of the submitting user: not fuzzed here
            sub.build(dataclasses.replace(req, program=prog, inputs=[]))
    except UsageError as e:
        assert "jobs.jsonl:" in e.render() or e.obj is not None


# -- operator request files ----------------------------------------------------------------

file_names = st.text(
    st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=40,
).filter(lambda n: n not in (".", "..") and len(n.encode()) < 250)
REQUEST_KEYS = ["op", "job", "key", "placement", "gen", "nonce", "t", "by", "priority"]
VALID_REQUEST = {
    "op": "pause",
    "job": JOB_ID,
    "key": f"t--{JOB_ID}",
    "placement": "jobs/01",
    "gen": 3,
    "nonce": "0badc0de",
    "t": 1.5,
    "by": "cli",
}
#: the name VALID_REQUEST must be filed under (its body has to agree with its name)
VALID_REQUEST_NAME = f"pause.{JOB_ID}.g3.0badc0de"


@pytest.fixture(scope="module")
def request_ws() -> Iterator[Workspace]:
    d = tempfile.mkdtemp(prefix="fuzz-requests-")
    ws = Workspace.create(os.path.join(d, "ws"))
    yield ws
    ws.close()
    shutil.rmtree(d, ignore_errors=True)


@fuzz(100)
@given(
    st.lists(
        st.tuples(
            file_names | st.just(VALID_REQUEST_NAME),
            documents(REQUEST_KEYS, VALID_REQUEST),
            st.sampled_from(["file", "file", "dir", "link"]),
        ),
        max_size=6,
        unique_by=lambda t: t[0],
    )
)
def test_request_files_of_any_name_and_content(
    request_ws: Workspace, entries: list[tuple[str, bytes, str]]
) -> None:
    """`flow requests` reads whatever lies where requests are read: it never fails, never
    follows a link, and lists each entry (a hidden one is a file being written) either as
    a request whose body agrees with its name, or as invalid with a reason."""
    tried("flow requests (request files)", max(1, len(entries)))
    d = Path(requests.new_dir(request_ws))
    shutil.rmtree(d.parent, ignore_errors=True)
    d.mkdir(parents=True)
    outside = d.parent / "outside-target"
    outside.write_bytes(orjson_dumps(VALID_REQUEST))
    for name, body, kind in entries:
        if kind == "dir":
            (d / name).mkdir()
        elif kind == "link":
            (d / name).symlink_to(outside)
        else:
            (d / name).write_bytes(body)
    r = CliRunner().invoke(cli, ["-w", request_ws.root, "requests", "--json"])
    assert r.exit_code == 0, r.output
    rows = {row["name"]: row for row in json.loads(r.output)["requests"]}
    for name, _, kind in entries:
        if name.startswith("."):
            assert name not in rows
            continue
        row = rows[name]
        if row["status"] == "invalid":
            assert row["reason"], row
        else:
            assert kind == "file" and row["job"] == name.split(".")[1], (row, kind)
    assert outside.read_bytes() == orjson_dumps(VALID_REQUEST)


def orjson_dumps(v: Any) -> bytes:
    return json.dumps(v, sort_keys=True).encode()
