"""Groups in the protocol: the marker's `.s<digest>` field, the registry under
.flow/groups, job.json's group and hold, and registration of a held job."""

from __future__ import annotations

import os
import re
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from httk_flow.errors import UsageError
from httk_flow.protocol import layout
from httk_flow.protocol.groups import GroupRegistry, default_group
from httk_flow.protocol.jobs import load_spec, register
from httk_flow.protocol.jobspec import JobSpec
from httk_flow.protocol.names import Marker, RecordRef, group_digest
from httk_flow.protocol.states import State
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.transition import JobHandle
from httk_flow.protocol.workspace import Workspace

_B36 = "0123456789abcdefghijklmnopqrstuvwxyz"
digests = st.text(_B36, min_size=8, max_size=8)
keys = st.from_regex(r"(?:[A-Za-z0-9][A-Za-z0-9_+-]{0,10}--)?[0-9a-f]{32}", fullmatch=True)


@given(
    key=keys,
    prio=st.integers(0, 999),
    gen=st.integers(0, 36**6),
    nb=st.integers(0, 36**6),
    service=st.one_of(st.just(""), st.text(_B36, min_size=1, max_size=16)),
    group=st.one_of(st.just(""), digests),
)
def test_a_marker_name_round_trips_with_and_without_a_group(
    key: str, prio: int, gen: int, nb: int, service: str, group: str
) -> None:
    m = Marker(key, prio, gen, RecordRef("w1", 3, 99), nb, service, group)
    back = Marker.from_name(m.name)
    assert back == m and back.name == m.name
    assert (".s" + group in m.name) == bool(group)
    nxt = m.successor(RecordRef("w2", 0, 7), priority=7)
    assert (nxt.group_digest, nxt.service, nxt.generation) == (group, service, gen + 1)


def test_an_old_marker_without_a_group_still_parses() -> None:
    old = "relax--" + "ab" * 16 + ".p500.g3.c1x2y3.w0-0-1f"
    m = Marker.from_name(old)
    assert (m.group_digest, m.service, m.generation, m.tag) == ("", "1x2y3", 3, "relax")
    assert m.name == old
    grouped = "ab" * 16 + ".p500.g0.sabcd1234.w0-0-0"
    assert Marker.from_name(grouped).group_digest == "abcd1234"
    # a digest is exactly 8 digits: any other length is not a marker of the grammar
    for bad in ("abc", "abcd12345"):
        assert Marker.parse_or_none("ab" * 16 + f".p500.g0.s{bad}.w0-0-0") is None


def test_the_digest_is_fixed_length_base36_and_the_default_group_names_a_moment() -> None:
    for name in ("a", "sub-20240101-000000-abcd", "x" * 64):
        d = group_digest(name)
        assert re.fullmatch(r"[0-9a-z]{8}", d) and d == group_digest(name)
    assert group_digest("a") != group_digest("b")
    assert re.fullmatch(r"sub-\d{8}-\d{6}-[0-9a-f]{4}", default_group())


def test_a_submission_publishes_the_registry_and_marks_every_job(
    ws: Workspace, program: str
) -> None:
    specs = list(
        Submitter(ws, actor="t").submit(
            [SubmitRequest(program=program, group="camp", array_index=i) for i in range(3)]
        )
    )
    rec = orjson.loads(Path(layout.group_file(ws.root, group_digest("camp"))).read_bytes())
    assert set(rec) == {"name", "digest", "created", "by"}
    assert (rec["name"], rec["digest"], rec["by"]) == ("camp", group_digest("camp"), "t")
    names = [n for _, _, files in os.walk(ws.state_dir(State.SUBMITTED)) for n in files]
    assert len(names) == 3 and all(f".s{group_digest('camp')}." in n for n in names)
    spec = load_spec(ws, specs[0].placement, specs[0].key)
    assert (spec.group, spec.hold) == ("camp", False)
    assert [r.name for r in GroupRegistry(ws).all()] == ["camp"]


def test_a_job_without_a_group_has_none_in_its_marker_or_job_json(
    ws: Workspace, program: str
) -> None:
    [spec] = Submitter(ws).submit([SubmitRequest(program=program)])
    raw = orjson.loads(Path(layout.job_file(ws.job_dir(spec.placement, spec.key))).read_bytes())
    assert "group" not in raw and "hold" not in raw
    [name] = [n for _, _, files in os.walk(ws.state_dir(State.SUBMITTED)) for n in files]
    assert Marker.from_name(name).group_digest == ""
    assert not os.path.exists(layout.groups_dir(ws.root))


def test_a_digest_collision_is_refused_before_anything_is_published(
    ws: Workspace, program: str
) -> None:
    # another name already registered under the digest "mine" would get
    os.makedirs(layout.groups_dir(ws.root))
    path = layout.group_file(ws.root, group_digest("mine"))
    body = {"name": "theirs", "digest": group_digest("mine"), "created": 1.0, "by": "x"}
    Path(path).write_bytes(orjson.dumps(body))
    with pytest.raises(UsageError) as e:
        list(Submitter(ws).submit([SubmitRequest(program=program, group="mine")]))
    assert e.value.render() == (
        f"group 'mine': has the same digest {group_digest('mine')} as the existing group "
        "'theirs'; choose another group name"
    )
    assert not any(files for _, _, files in os.walk(ws.state_dir(State.SUBMITTED)))
    assert orjson.loads(Path(path).read_bytes())["name"] == "theirs"


def test_a_bad_group_name_is_refused(ws: Workspace, program: str) -> None:
    with pytest.raises(UsageError, match="a group name is 1-64 characters"):
        Submitter(ws).build(SubmitRequest(program=program, group="no spaces"))


def test_job_json_reads_group_and_hold_and_old_ones_read_as_defaults() -> None:
    base = {
        "id": "ab" * 16,
        "key": "ab" * 16,
        "program": {"command": "true"},
        "placement": "jobs/ab",
    }
    old = JobSpec.from_dict(base, "old")
    assert (old.group, old.hold) == (None, False)
    new = JobSpec.from_dict({**base, "group": "g1", "hold": True}, "new")
    assert (new.group, new.hold) == ("g1", True)
    assert orjson.loads(new.to_json())["group"] == "g1"
    with pytest.raises(Exception, match="hold"):
        JobSpec.from_dict({**base, "hold": "yes"}, "bad")


def _submitted(ws: Workspace) -> JobHandle:
    [name] = [
        (os.path.relpath(d, ws.state_dir(State.SUBMITTED)), n)
        for d, _, files in os.walk(ws.state_dir(State.SUBMITTED))
        for n in files
    ]
    return JobHandle(State.SUBMITTED, name[0], Marker.from_name(name[1]))


def test_registration_moves_a_held_job_to_paused_keeping_its_group(
    ws: Workspace, program: str
) -> None:
    list(Submitter(ws).submit([SubmitRequest(program=program, group="h", hold=True)]))
    new = register(ws, _submitted(ws), actor="t")
    assert new.state is State.PAUSED and new.marker.group_digest == group_digest("h")
    assert ws.reader.frame(new.marker.ref).body.why == "held"


def test_registration_of_an_invalid_held_job_fails_it(ws: Workspace, program: str) -> None:
    [spec] = Submitter(ws).submit([SubmitRequest(program=program, hold=True)])
    path = layout.job_file(ws.job_dir(spec.placement, spec.key))
    os.chmod(path, 0o644)
    Path(path).write_bytes(b"{}")
    new = register(ws, _submitted(ws), actor="t")
    assert new.state is State.FAILED
