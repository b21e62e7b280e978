"""names: the grammar of every name that becomes a path."""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from httk_flow.errors import InvalidName
from httk_flow.protocol import names
from httk_flow.protocol.names import (
    MAX_PLACEMENT_DEPTH,
    MAX_PLACEMENT_LEN,
    JobKey,
    Marker,
    RecordRef,
    check_parent_placement,
    check_placement,
    from36,
    to36,
)

B36_MAX = 36**13 - 1  # the grammar allows 13 base-36 digits

job_ids = st.from_regex(names.ID_RE, fullmatch=True)
tags = st.from_regex(names.TAG_RE, fullmatch=True)
writers = st.from_regex(names.WRITER_RE, fullmatch=True)
b36_ints = st.integers(min_value=0, max_value=B36_MAX)
refs = st.builds(RecordRef, writers, b36_ints, b36_ints)
keys = st.builds(names.make_key, job_ids, st.none() | tags)
markers = st.builds(
    Marker,
    key=keys,
    priority=st.integers(min_value=0, max_value=names.MAX_PRIORITY),
    generation=b36_ints,
    ref=refs,
    not_before=st.just(0) | st.integers(min_value=1, max_value=B36_MAX),
    service=st.just("") | st.from_regex(r"[0-9a-z]{1,16}", fullmatch=True),
)
components = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.+=@,-]{0,30}", fullmatch=True)
placements = st.lists(components, min_size=1, max_size=MAX_PLACEMENT_DEPTH).map("/".join)


@given(st.integers(min_value=0))
def test_base36_round_trips_every_non_negative_integer(n: int) -> None:
    text = to36(n)
    assert from36(text) == n
    assert text == text.lower()
    assert text == "0" or not text.startswith("0")


def test_base36_spells_the_numbers_around_each_digit_boundary() -> None:
    for k in range(1, 14):
        for n in (36**k - 1, 36**k, 36**k + 1, 2 * 36**k):
            assert int(to36(n), 36) == n and not to36(n).startswith("0")
    assert [to36(n) for n in (0, 9, 10, 35, 36, 1295, 1296)] == [
        "0",
        "9",
        "a",
        "z",
        "10",
        "zz",
        "100",
    ]


def test_base36_refuses_negative_numbers() -> None:
    with pytest.raises(ValueError):
        to36(-1)


@given(markers)
def test_a_marker_name_round_trips_through_parse_and_format(marker: Marker) -> None:
    name = marker.name
    assert "/" not in name and "\0" not in name
    assert len(name.encode()) <= 255
    parsed = Marker.from_name(name)
    assert parsed == marker
    assert parsed.name == name
    # the parsed ref keeps the text it was read from: the one its fields spell
    assert (
        str(parsed.ref)
        == str(RecordRef(marker.ref.writer, marker.ref.segment, marker.ref.offset))
        == str(marker.ref)
    )
    assert Marker.parse_or_none(name) == marker


@given(job_ids, st.none() | tags)
def test_a_marker_knows_the_job_id_and_tag_inside_its_key(job_id: str, tag: str | None) -> None:
    marker = Marker(names.make_key(job_id, tag), 500, 0, RecordRef("w", 0, 0))
    assert marker.job_id == job_id
    assert marker.tag == tag
    assert JobKey.parse(marker.key) == JobKey(job_id, tag)
    assert str(JobKey(job_id, tag)) == marker.key


@given(markers, refs)
def test_a_successor_is_one_generation_on_and_keeps_key_and_priority(
    marker: Marker, ref: RecordRef
) -> None:
    assume(marker.generation < B36_MAX)
    nxt = marker.successor(ref)
    assert (nxt.key, nxt.priority, nxt.generation, nxt.ref) == (
        marker.key,
        marker.priority,
        marker.generation + 1,
        ref,
    )
    assert nxt.not_before == 0
    assert nxt.service == marker.service
    assert marker.successor(ref, priority=7, not_before=99).priority == 7


def _mutations(name: str) -> list[str]:
    """Names that differ from a valid marker name in a way the grammar must refuse."""
    key, rest = name.split(".p", 1)
    prio, rest = rest[:3], rest[3:]
    return [
        "",
        name + ".",
        name + "/x",
        "x/" + name,
        name + "\0",
        " " + name,
        name.upper() if name != name.upper() else name + "!",  # upper-case hex or base 36
        f"{key}.p{prio[:2]}{rest}",  # two-digit priority
        f"{key}.p{prio}0{rest}",  # four-digit priority
        f"{key}{rest}",  # no priority field
        f"{key[:-1]}.p{prio}{rest}",  # 31 hex digits of id
        f"{key}g.p{prio}{rest}",  # a non-hex digit in the id
        name.rsplit(".", 1)[0],  # no record reference
        name.replace(".g", ".G", 1),
        "." + name,
        name + ".tmp",
    ]


@given(markers, st.data())
def test_names_not_of_the_grammar_are_refused(marker: Marker, data: st.DataObject) -> None:
    bad = data.draw(st.sampled_from(_mutations(marker.name)))
    with pytest.raises(InvalidName):
        Marker.from_name(bad)
    assert Marker.parse_or_none(bad) is None


@given(st.text(max_size=80))
def test_arbitrary_text_is_a_marker_only_if_it_round_trips(text: str) -> None:
    try:
        marker = Marker.from_name(text)
    except InvalidName:
        assert Marker.parse_or_none(text) is None
        return
    # the only accepted spelling that is not canonical is an explicit ".t0"
    assert marker.name == text or ".t0." in text


@pytest.mark.parametrize(
    "text",
    ["", "w-1", "W-1-2", "w-1-2-3", "w--1", "-1-2", "a" * 25 + "-1-2", "w-" + "1" * 14 + "-0"],
)
def test_record_refs_not_of_the_grammar_are_refused(text: str) -> None:
    with pytest.raises(InvalidName):
        RecordRef.parse(text)


@given(refs)
def test_a_record_ref_round_trips_and_orders_by_writer_segment_offset(ref: RecordRef) -> None:
    assert RecordRef.parse(str(ref)) == ref
    assert ref < RecordRef(ref.writer, ref.segment, ref.offset + 1)


@given(placements)
def test_valid_placements_are_accepted_unchanged(placement: str) -> None:
    assume(len(placement) <= MAX_PLACEMENT_LEN)
    assert check_placement(placement) == placement
    assert check_placement(placement + "/") == placement


@st.composite
def bad_placements(draw: st.DrawFn) -> str:
    parts = draw(st.lists(components, min_size=1, max_size=5))
    i = draw(st.integers(min_value=0, max_value=len(parts)))
    kind = draw(
        st.sampled_from(
            ["dotdot", "dot", "absolute", "nul", "flow", "hidden", "long", "deep", "empty", "huge"]
        )
    )
    if kind == "dotdot":
        parts.insert(i, "..")
    elif kind == "dot":
        parts.insert(i, ".")
    elif kind == "absolute":
        return "/" + "/".join(parts)
    elif kind == "nul":
        text = "/".join(parts)
        j = draw(st.integers(min_value=0, max_value=len(text)))
        return text[:j] + "\0" + text[j:]
    elif kind == "flow":
        parts.insert(i, ".flow")
    elif kind == "hidden":
        parts.insert(i, "." + draw(components))
    elif kind == "long":
        parts.insert(i, "a" * draw(st.integers(min_value=129, max_value=300)))
    elif kind == "deep":
        parts = ["d"] * (MAX_PLACEMENT_DEPTH + 1 + len(parts))
    elif kind == "empty":
        parts.append("x")  # an empty component strictly inside: "a//b"
        parts.insert(draw(st.integers(min_value=1, max_value=len(parts) - 1)), "")
    elif kind == "huge":
        parts = ["b" * 100] * 6
    return "/".join(parts)


@given(bad_placements())
def test_placements_that_could_escape_or_hide_are_refused(placement: str) -> None:
    with pytest.raises(InvalidName):
        check_placement(placement)


@pytest.mark.parametrize(
    "placement",
    [
        "",
        "/",
        "..",
        "../x",
        "a/../b",
        "/abs",
        "a/./b",
        ".flow",
        ".flow/state",
        "a/.flow",
        "a//b",
        "-dash",
        "sp ace",
        "a\\b",
        "a\0b",
        "a\nb",
        "é",
    ],
)
def test_named_hostile_placements_are_refused(placement: str) -> None:
    with pytest.raises(InvalidName):
        check_placement(placement)


KEY = "ab" * 16


@pytest.mark.parametrize(
    "inner", ["run", "files", "attempts", "a0001", "a12345", f"run/{KEY}", "files/x"]
)
@pytest.mark.parametrize("key", [KEY, f"si-relax--{KEY}"])
def test_a_submitted_placement_never_lies_in_a_jobs_own_entries(key: str, inner: str) -> None:
    with pytest.raises(InvalidName, match=f"lies inside the {inner.split('/')[0]}/ of job {key}"):
        check_parent_placement(f"jobs/ab/{key}/{inner}")


@pytest.mark.parametrize(
    "placement",
    [f"jobs/ab/{KEY}", f"jobs/ab/{KEY}/{KEY}", "runs/a0001", "a0001/run", f"x/{KEY}x/run", "run"],
)
def test_a_submitted_placement_beside_or_as_a_job_is_taken(placement: str) -> None:
    assert check_parent_placement(placement) == placement


def test_default_placement_shards_by_the_first_three_hex_digits() -> None:
    job_id = names.new_id()
    assert names.default_placement(job_id) == f"jobs/{job_id[:2]}"
    assert check_placement(names.default_placement(job_id))


@pytest.mark.parametrize("value", [-1, 1000, 10**6])
def test_priorities_outside_0_to_999_are_refused(value: int) -> None:
    with pytest.raises(InvalidName):
        names.check_priority(value)


@given(st.text(max_size=70))
def test_tags_idents_and_labels_accept_exactly_their_grammar(text: str) -> None:
    for check, regex in (
        (names.check_tag, names.TAG_RE),
        (lambda v: names.check_ident(v, "step name"), names.IDENT_RE),
        (names.check_label, names.LABEL_RE),
    ):
        if regex.fullmatch(text):
            assert check(text) == text
        else:
            with pytest.raises(InvalidName):
                check(text)


#: MARKER_RE as it was written before the key tried its untagged form first and the
#: optional fields became `(?:...|)`: the language and the groups must be the same
_MARKER_BEFORE = re.compile(
    r"(?P<key>(?:[A-Za-z0-9][A-Za-z0-9_+-]{0,63}--)?[0-9a-f]{32})\.p(?P<prio>[0-9]{3})"
    r"\.g(?P<gen>(?:0|[1-9a-z][0-9a-z]{0,12}))(?:\.t(?P<nb>[1-9a-z][0-9a-z]{0,12}))?"
    r"(?:\.c(?P<cls>[0-9a-z]{1,16}))?(?:\.s(?P<grp>[0-9a-z]{8}))?(?P<aft>\.a)?"
    r"\.(?P<ref>[a-z0-9]{1,24}-(?:0|[1-9a-z][0-9a-z]{0,12})-(?:0|[1-9a-z][0-9a-z]{0,12}))"
)
#: valid tags a careless pattern gets wrong: ending in '-', holding '--', all hex digits
_ODD_TAGS = ["a-", "x--y", "a--", "Z_+-", "0" * 32, "f" * 64, "deadbeef"]
_grammar_names = st.one_of(
    st.from_regex(names.MARKER_RE, fullmatch=True),
    st.from_regex(_MARKER_BEFORE, fullmatch=True),
    st.builds(
        lambda m, tag, g, a: (
            dataclasses.replace(m, key=names.make_key(m.job_id, tag), group_digest=g, after=a).name
        ),
        markers,
        st.none() | st.sampled_from(_ODD_TAGS),
        st.just("") | st.from_regex(r"[0-9a-z]{8}", fullmatch=True),
        st.booleans(),
    ),
)
_any_names = st.one_of(
    _grammar_names,
    st.tuples(_grammar_names, _grammar_names).map("\n".join),
    _grammar_names.map(lambda n: n + "\n"),
    st.builds(
        lambda n, i, t: n[: i % (len(n) + 1)] + t + n[i % (len(n) + 1) + 1 :],
        _grammar_names,
        st.integers(0, 200),
        st.text(max_size=3),
    ),
    st.text(max_size=60),
)


@given(_any_names)
def test_the_marker_grammar_is_the_one_it_was(name: str) -> None:
    before, now = _MARKER_BEFORE.fullmatch(name), names.MARKER_RE.fullmatch(name)
    assert (before is None) == (now is None)
    if before is not None and now is not None:
        assert before.groupdict() == now.groupdict()


#: what a directory can hold: no empty name, none with "/" or NUL
_file_names = _any_names.filter(lambda n: n != "" and "/" not in n and "\0" not in n)


@given(st.lists(_file_names, min_size=1, max_size=20))
def test_one_search_finds_the_markers_one_match_per_name_finds(given_names: list[str]) -> None:
    """What each marker_scan finds in SCAN_SEP + the names joined by it + SCAN_SEP, and
    what it leaves, name by name (a newline in a name forges nothing)."""
    sep = names.SCAN_SEP
    text = sep + sep.join(given_names) + sep
    found = [m for n in given_names if (m := names.MARKER_RE.fullmatch(n)) is not None]
    rest = "".join(sep + n for n in given_names if names.MARKER_RE.fullmatch(n) is None)
    assert names.marker_scan().subn("", text) == (rest + sep, len(found))
    assert names.marker_scan("nb_cls").findall(text) == [
        (f".t{m['nb']}" if m["nb"] else "") + (f".c{m['cls']}" if m["cls"] else "") for m in found
    ]
    for fields in set(names.marker_scan("nb_cls").findall(text)):
        assert names.NB_CLS_RE.fullmatch(fields) is not None
    assert names.marker_scan("aft").findall(text) == [m["aft"] or "" for m in found]
    assert names.marker_scan("key").findall(text) == [m["key"] for m in found]


def test_a_scan_refuses_a_group_the_grammar_does_not_have() -> None:
    with pytest.raises(ValueError):
        names.marker_scan("no such group")
