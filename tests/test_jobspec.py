"""jobspec: job.json parsed once, at the boundary, into a frozen JobSpec."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from httk_flow.errors import FlowError, InvalidJob
from httk_flow.protocol import names
from httk_flow.protocol.jobspec import _KNOWN, JOB_FORMAT, MAX_JOB_JSON, JobSpec, ParentRef, Program

WHERE = "job.json"

hex_ids = st.from_regex(names.ID_RE, fullmatch=True)
tags = st.from_regex(names.TAG_RE, fullmatch=True)
idents = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True)
labels = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,15}", fullmatch=True)
placements = st.lists(
    st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.+=@,-]{0,12}", fullmatch=True), min_size=1, max_size=4
).map("/".join)
no_nul = st.text(max_size=20).filter(lambda s: "\0" not in s)
i64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
finite = st.floats(allow_nan=False, allow_infinity=False)
param_values = no_nul | i64 | finite | st.booleans()
programs = st.builds(
    lambda d, n: Program(digest=d, name=n),
    st.from_regex(r"[0-9a-f]{64}", fullmatch=True),
    st.text(max_size=20),
) | st.from_regex(r"[A-Za-z0-9_.+-]{1,20}", fullmatch=True).map(
    lambda c: Program(command=c, name=c)
)
json_values = st.recursive(
    st.none() | st.booleans() | i64 | finite | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=6,
)


@st.composite
def parents(draw: st.DrawFn) -> ParentRef:
    pid = draw(hex_ids)
    return ParentRef(
        id=pid,
        key=names.make_key(pid, draw(st.none() | tags)),
        placement=draw(placements),
        activation=draw(i64),
        label=draw(labels),
    )


@st.composite
def specs(draw: st.DrawFn) -> JobSpec:
    job_id = draw(hex_ids)
    tag = draw(st.none() | tags)
    return JobSpec(
        id=job_id,
        key=names.make_key(job_id, tag),
        tag=tag,
        name=draw(st.text(max_size=256)),
        program=draw(programs),
        args=tuple(draw(st.lists(no_nul, max_size=5))),
        step=draw(idents),
        params=draw(st.dictionaries(idents, param_values, max_size=5)),
        priority=draw(st.integers(min_value=0, max_value=999)),
        placement=draw(placements),
        pool=draw(st.none() | labels),
        requires=tuple(draw(st.lists(labels, max_size=3))),
        time=draw(st.none() | st.floats(min_value=0.001, max_value=3e8)),
        retries=draw(st.integers(min_value=0, max_value=1000)),
        max_attempts=draw(st.integers(min_value=1, max_value=100_000)),
        workdir=draw(st.sampled_from(["persistent", "isolated"])),
        require_outcome=draw(st.booleans()),
        parent=draw(st.none() | parents()),
        array_index=draw(st.none() | i64),
        created=draw(st.floats(min_value=0, max_value=4e9)),
        extra=draw(
            st.dictionaries(st.text(max_size=10).filter(lambda k: k not in _KNOWN), json_values)
        ),
    )


def _minimal(**changes: object) -> dict[str, object]:
    job_id = "0123456789abcdef0123456789abcdef"
    doc: dict[str, object] = {
        "id": job_id,
        "key": job_id,
        "program": {"command": "true"},
        "placement": "jobs/012",
    }
    doc.update(changes)
    return doc


@given(specs())
def test_a_job_spec_round_trips_through_job_json(spec: JobSpec) -> None:
    raw = spec.to_json()
    assert len(raw) <= MAX_JOB_JSON
    back = JobSpec.from_json(raw, WHERE)
    assert back == spec
    assert back.to_json() == raw


def test_a_minimal_job_json_takes_the_documented_defaults() -> None:
    spec = JobSpec.from_json(orjson.dumps(_minimal()), WHERE)
    assert spec.step == "main"
    assert spec.priority == names.DEFAULT_PRIORITY
    assert spec.retries == 2
    assert spec.workdir == "persistent"
    assert spec.tag is None and spec.parent is None and spec.time is None
    assert spec.program == Program(command="true", name="true")
    assert orjson.loads(spec.to_json())["format"] == JOB_FORMAT


def test_unknown_members_are_kept_for_newer_writers() -> None:
    spec = JobSpec.from_json(orjson.dumps(_minimal(note={"by": "me"})), WHERE)
    assert spec.extra == {"note": {"by": "me"}}
    assert orjson.loads(spec.to_json())["note"] == {"by": "me"}


@pytest.mark.parametrize(
    "changes",
    [
        {"format": "httk-flow/job/2"},
        {"id": "XYZ"},
        {"key": "other--0123456789abcdef0123456789abcdef"},
        {"tag": "bad tag"},
        {"program": {"command": "/bin/sh"}},
        {"program": {"digest": "abc"}},
        {"program": "true"},
        {"args": ["a\0b"]},
        {"args": "not a list"},
        {"step": "1st"},
        {"params": {"bad-key": 1}},
        {"params": {"k": [1]}},
        {"priority": 1000},
        {"priority": True},
        {"placement": "../escape"},
        {"placement": "/abs"},
        {"pool": "bad pool"},
        {"requires": ["ok", 3]},
        {"time": 0},
        {"time": -1},
        {"retries": -1},
        {"max_attempts": 0},
        {"workdir": "tmp"},
        {"require_outcome": "yes"},
        {"parent": {"id": "0" * 32, "key": "1" * 32}},
        {"name": "n" * 257},
        {"created": "yesterday"},
    ],
    ids=repr,
)
def test_a_member_that_does_not_validate_is_refused_naming_the_file(
    changes: dict[str, object],
) -> None:
    with pytest.raises(InvalidJob) as info:
        JobSpec.from_json(orjson.dumps(_minimal(**changes)), "/ws/jobs/012/x/job.json")
    assert "/ws/jobs/012/x/job.json" in str(info.value)


@pytest.mark.parametrize("missing", ["id", "key", "program", "placement"])
def test_a_required_member_that_is_missing_is_refused(missing: str) -> None:
    doc = _minimal()
    del doc[missing]
    with pytest.raises(InvalidJob):
        JobSpec.from_json(orjson.dumps(doc), WHERE)


def test_an_oversized_job_json_is_refused_before_parsing() -> None:
    with pytest.raises(InvalidJob):
        JobSpec.from_json(b" " * (MAX_JOB_JSON + 1), WHERE)


@given(st.binary(max_size=400))
def test_random_bytes_as_job_json_only_raise_flow_errors(raw: bytes) -> None:
    try:
        JobSpec.from_json(raw, WHERE)
    except FlowError:
        pass


@settings(max_examples=60)
@given(specs(), st.sampled_from(sorted(_KNOWN)), json_values)
def test_a_valid_job_json_with_one_member_replaced_by_garbage_only_raises_flow_errors(
    spec: JobSpec, member: str, value: object
) -> None:
    doc = spec.to_dict()
    doc[member] = value
    try:
        back = JobSpec.from_json(orjson.dumps(doc), WHERE)
    except FlowError:
        return
    assert back.id == spec.id or member == "id"


@settings(max_examples=60)
@given(
    specs(),
    st.sampled_from(["program", "parent"]),
    st.sampled_from(["id", "key", "placement", "activation", "label", "digest", "command", "name"]),
    json_values,
)
def test_garbage_inside_nested_members_only_raises_flow_errors(
    spec: JobSpec, member: str, inner: str, value: object
) -> None:
    doc = spec.to_dict()
    nested = doc[member] if isinstance(doc[member], dict) else {}
    doc[member] = {**nested, inner: value}
    try:
        JobSpec.from_json(orjson.dumps(doc), WHERE)
    except FlowError:
        pass
