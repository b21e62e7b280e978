"""submit: payload published by rename, then the frame, then the marker, once."""

from __future__ import annotations

import math
import os
from pathlib import Path

import orjson
import pytest
from helpers import markers_in
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from httk_flow.errors import FlowError, InvalidName, UsageError
from httk_flow.protocol import names
from httk_flow.protocol.jobs import load_spec
from httk_flow.protocol.jobspec import JobSpec, Program
from httk_flow.protocol.names import Marker
from httk_flow.protocol.states import State
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.transition import locate_key
from httk_flow.protocol.workspace import Workspace


def test_a_submitted_job_is_a_directory_with_its_definition(
    ws: Workspace, submitter: Submitter, program: str
) -> None:
    [spec] = submitter.submit(
        [
            SubmitRequest(
                program=program,
                args=["--n", "3"],
                name="first",
                tag="run1",
                params={"n": 3, "mode": "fast"},
                placement="campaign/a",
                priority=42,
            )
        ]
    )
    job_dir = ws.job_dir("campaign/a", spec.key)
    assert job_dir == os.path.join(ws.root, "campaign", "a", f"run1--{spec.id}")
    assert os.listdir(job_dir) == ["job.json"]
    with open(os.path.join(job_dir, "job.json"), "rb") as fh:
        on_disk = JobSpec.from_json(fh.read(), "job.json")
    assert on_disk == spec
    assert load_spec(ws, "campaign/a", spec.key) == spec
    assert (spec.tag, spec.priority, spec.args, spec.params) == (
        "run1",
        42,
        ("--n", "3"),
        {"n": 3, "mode": "fast"},
    )


def test_the_marker_lies_under_submitted_and_points_at_a_generation_zero_frame(
    ws: Workspace, submitter: Submitter
) -> None:
    [spec] = submitter.submit([SubmitRequest(program="true", placement="p/q", priority=7)])
    [rel] = markers_in(ws, State.SUBMITTED)
    placement, name = rel.rsplit("/", 1)
    assert placement == "p/q"
    marker = Marker.from_name(name)
    assert (marker.key, marker.priority, marker.generation) == (spec.key, 7, 0)
    assert os.path.getsize(os.path.join(ws.state_dir(State.SUBMITTED), rel)) == 0
    frame = ws.reader.read(marker.ref)
    assert frame["to"] == "submitted" and frame["prev"] is None and frame["gen"] == 0
    assert (frame["job"], frame["key"], frame["placement"]) == (spec.id, spec.key, "p/q")
    assert frame["by"] == "test-submit"
    for kind in State:
        if kind is not State.SUBMITTED:
            assert markers_in(ws, kind) == []


def test_the_default_placement_shards_by_job_id(ws: Workspace, submitter: Submitter) -> None:
    specs = list(submitter.submit([SubmitRequest(program="true") for _ in range(40)]))
    for spec in specs:
        assert spec.placement == f"jobs/{spec.id[:2]}"
        assert os.path.isdir(os.path.join(ws.root, "jobs", spec.id[:2], spec.key))
        assert locate_key(ws, spec.placement, spec.key) is not None
    assert len(markers_in(ws, State.SUBMITTED)) == 40


def test_a_program_file_is_stored_once_by_digest_for_many_jobs(
    ws: Workspace, submitter: Submitter, program: str, tmp_path: Path
) -> None:
    specs = list(submitter.submit([SubmitRequest(program=program) for _ in range(25)]))
    # another submitter (another CLI call) with a copy of the same bytes
    copy = tmp_path / "copy.sh"
    copy.write_bytes(Path(program).read_bytes())
    copy.chmod(0o755)
    specs += Submitter(ws).submit([SubmitRequest(program=str(copy))])
    digests = {s.program.digest for s in specs}
    assert len(digests) == 1
    [digest] = digests
    assert digest is not None and len(digest) == 64
    assert os.listdir(ws.programs) == [digest]
    stored = ws.program_path(digest)
    assert Path(stored).read_bytes() == Path(program).read_bytes()
    assert os.access(stored, os.X_OK)
    assert {s.program.name for s in specs} == {"run.sh", "copy.sh"}


def test_a_command_on_path_is_referenced_not_stored(ws: Workspace, submitter: Submitter) -> None:
    [spec] = submitter.submit([SubmitRequest(program="true")])
    assert spec.program == Program(command="true", name="true")
    assert os.listdir(ws.programs) == []


@pytest.mark.parametrize("program", ["no-such-command-anywhere", "./missing.sh", ""])
def test_a_program_that_is_neither_a_file_nor_a_command_is_refused(
    submitter: Submitter, program: str
) -> None:
    with pytest.raises(UsageError):
        submitter.build(SubmitRequest(program=program))


def test_a_program_file_that_is_not_executable_is_refused(
    submitter: Submitter, tmp_path: Path
) -> None:
    path = tmp_path / "plain.sh"
    path.write_text("echo\n")
    path.chmod(0o644)
    with pytest.raises(UsageError) as info:
        submitter.build(SubmitRequest(program=str(path)))
    assert "chmod +x" in str(info.value)


def test_inputs_are_copied_into_the_jobs_files_directory(
    ws: Workspace, submitter: Submitter, tmp_path: Path
) -> None:
    data = tmp_path / "data.txt"
    data.write_text("42\n")
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "leaf").write_text("leaf")
    [spec] = submitter.submit([SubmitRequest(program="true", inputs=[str(data), str(tree)])])
    files = Path(ws.job_dir(spec.placement, spec.key)) / "files"
    assert sorted(os.listdir(files)) == ["data.txt", "tree"]
    assert (files / "data.txt").read_text() == "42\n"
    assert (files / "tree" / "sub" / "leaf").read_text() == "leaf"
    data.write_text("changed later")
    assert (files / "data.txt").read_text() == "42\n"


def test_an_input_that_does_not_exist_is_refused(submitter: Submitter, tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        submitter.build(SubmitRequest(program="true", inputs=[str(tmp_path / "nope")]))


@pytest.mark.parametrize(
    "changes",
    [
        {"tag": "bad tag"},
        {"tag": "-lead"},
        {"tag": "x" * 65},
        {"placement": "../outside"},
        {"placement": "/abs/path"},
        {"placement": ".flow/state"},
        {"placement": "a/../../b"},
        {"placement": "a\0b"},
        {"priority": -1},
        {"priority": 1000},
        {"step": "not-an-ident"},
        {"pool": "bad pool"},
        {"requires": ["ok", "not ok"]},
        {"params": {"bad-key": 1}},
        {"params": {"k": [1, 2]}},
        {"retries": -1},
        {"max_attempts": 0},
        {"time": 0},
    ],
    ids=repr,
)
def test_a_bad_request_is_refused_with_a_usage_error_before_anything_is_written(
    ws: Workspace, submitter: Submitter, changes: dict[str, object]
) -> None:
    with pytest.raises(UsageError):
        list(submitter.submit([SubmitRequest(program="true", **changes)]))  # type: ignore[arg-type]
    assert markers_in(ws, State.SUBMITTED) == []
    assert os.listdir(ws.tmp) == []
    assert sorted(os.listdir(ws.root)) == [".flow"]


def test_bad_tags_placements_and_priorities_are_invalid_names(submitter: Submitter) -> None:
    for req in (
        SubmitRequest(program="true", tag="a b"),
        SubmitRequest(program="true", placement=".."),
        SubmitRequest(program="true", priority=5000),
    ):
        with pytest.raises(InvalidName):
            submitter.build(req)


@pytest.mark.parametrize(
    "changes",
    [
        {"name": "n" * 300},
        {"args": ["a\0b"]},
        {"retries": 5000},
        {"max_attempts": 10**7},
        {"params": {"x": math.nan}},
        {"params": {"x": 2**70}},
        {"array_index": 2**70},
        {"time": math.inf},
        {"time": math.nan},
    ],
    ids=repr,
)
def test_what_job_json_would_refuse_is_refused_at_submission(
    ws: Workspace, submitter: Submitter, changes: dict[str, object]
) -> None:
    # otherwise the job is accepted now and fails with protocol_error when registered
    with pytest.raises(UsageError):
        list(submitter.submit([SubmitRequest(program="true", **changes)]))  # type: ignore[arg-type]
    assert markers_in(ws, State.SUBMITTED) == []


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.text(max_size=300),
    args=st.lists(st.text(max_size=5), max_size=3),
    retries=st.integers(min_value=-2, max_value=2000),
    max_attempts=st.integers(min_value=-2, max_value=200_000),
    time=st.none() | st.floats(),
    params=st.dictionaries(
        st.from_regex(names.IDENT_RE, fullmatch=True),
        st.text(max_size=5) | st.integers() | st.floats() | st.booleans(),
        max_size=3,
    ),
    array_index=st.none() | st.integers(),
)
def test_every_definition_submission_accepts_is_one_job_json_accepts(
    submitter: Submitter,
    name: str,
    args: list[str],
    retries: int,
    max_attempts: int,
    time: float | None,
    params: dict[str, str | int | float | bool],
    array_index: int | None,
) -> None:
    req = SubmitRequest(
        program="true",
        name=name,
        args=args,
        retries=retries,
        max_attempts=max_attempts,
        time=time,
        params=params,
        array_index=array_index,
    )
    try:
        spec = submitter.build(req)
    except UsageError:
        return
    assert JobSpec.from_json(spec.to_json(), "job.json") == spec


def test_an_idempotent_resubmit_with_the_same_job_id_creates_no_duplicate(
    ws: Workspace, submitter: Submitter
) -> None:
    job_id = names.new_id()
    req = SubmitRequest(program="true", job_id=job_id, tag="child", placement="kids")
    [first] = submitter.submit([req])
    for _ in range(3):
        [again] = submitter.submit([req], idempotent=True)
        assert again.key == first.key
    assert markers_in(ws, State.SUBMITTED) != []
    assert len(markers_in(ws, State.SUBMITTED)) == 1
    assert os.listdir(os.path.join(ws.root, "kids")) == [first.key]
    assert load_spec(ws, "kids", first.key) == first  # the first definition is kept


def test_an_idempotent_resubmit_completes_a_payload_whose_marker_was_not_moved_out(
    ws: Workspace, submitter: Submitter
) -> None:
    job_id = names.new_id()
    req = SubmitRequest(program="true", job_id=job_id, placement="kids")
    [spec] = submitter.submit([req])
    # a crash between payload and marker: the payload is published, its marker still
    # born inside it (protocol.md §6)
    handle = locate_key(ws, spec.placement, spec.key)
    assert handle is not None
    job_dir = ws.job_dir(spec.placement, spec.key)
    os.rename(handle.path(ws), os.path.join(job_dir, names.BIRTH_PREFIX + handle.marker.name))
    list(submitter.submit([req], idempotent=True))
    assert not [n for n in os.listdir(job_dir) if n.startswith(names.BIRTH_PREFIX)]
    again = locate_key(ws, spec.placement, spec.key)
    assert again is not None and again.state is State.SUBMITTED
    assert ws.reader.read(again.marker.ref)["job"] == job_id
    assert len(markers_in(ws, State.SUBMITTED)) == 1


def test_an_idempotent_resubmit_after_a_crash_mid_payload_publishes_the_job(
    ws: Workspace, submitter: Submitter
) -> None:
    job_id = names.new_id()
    # a submitter killed while assembling the payload left its temporary directory
    leftover = os.path.join(ws.tmp, f"job-{job_id}")
    os.mkdir(leftover)
    with open(os.path.join(leftover, "job.json"), "wb") as fh:
        fh.write(b'{"id": "')
    [spec] = submitter.submit(
        [SubmitRequest(program="true", job_id=job_id, placement="kids")], idempotent=True
    )
    handle = locate_key(ws, "kids", spec.key)
    assert handle is not None
    assert load_spec(ws, "kids", spec.key) == spec


def test_a_plain_resubmit_of_an_existing_job_id_does_not_overwrite_it(
    ws: Workspace, submitter: Submitter
) -> None:
    job_id = names.new_id()
    [first] = submitter.submit([SubmitRequest(program="true", job_id=job_id, placement="k")])
    with pytest.raises((FlowError, OSError)):
        list(
            submitter.submit(
                [SubmitRequest(program="true", job_id=job_id, placement="k", name="second")]
            )
        )
    assert load_spec(ws, "k", first.key) == first
    assert len(markers_in(ws, State.SUBMITTED)) == 1
    assert os.listdir(ws.tmp) == []


def test_a_large_submission_is_published_in_batches_with_progress(
    ws: Workspace, submitter: Submitter
) -> None:
    seen: list[int] = []
    specs = list(
        submitter.submit(
            (SubmitRequest(program="true", placement="bulk") for _ in range(1100)),
            progress=seen.append,
        )
    )
    assert seen == [512, 512, 76]
    assert len({s.id for s in specs}) == 1100
    assert len(markers_in(ws, State.SUBMITTED)) == 1100
    assert len(os.listdir(os.path.join(ws.root, "bulk"))) == 1100


def test_the_journal_frame_of_each_job_reads_back_after_reopening(
    ws: Workspace, submitter: Submitter
) -> None:
    specs = list(submitter.submit([SubmitRequest(program="true", step="prep") for _ in range(5)]))
    other = Workspace.open(ws.root)
    for spec in specs:
        handle = locate_key(other, spec.placement, spec.key)
        assert handle is not None
        frame = other.reader.read(handle.marker.ref)
        assert (frame["job"], frame["step"], frame["act"]) == (spec.id, "prep", 1)
    raw = Path(ws.job_dir(specs[0].placement, specs[0].key), "job.json").read_bytes()
    assert orjson.loads(raw)["step"] == "prep"


def test_two_inputs_with_the_same_file_name_are_refused_rather_than_overwritten(
    ws: Workspace, submitter: Submitter, tmp_path: Path
) -> None:
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "data.txt").write_text(d)
    with pytest.raises(UsageError) as info:
        list(
            submitter.submit(
                [
                    SubmitRequest(
                        program="true",
                        inputs=[str(tmp_path / "a" / "data.txt"), str(tmp_path / "b" / "data.txt")],
                    )
                ]
            )
        )
    assert "data.txt" in str(info.value)
    assert markers_in(ws, State.SUBMITTED) == []
    assert os.listdir(ws.tmp) == []


@pytest.mark.parametrize("given", [".", "..", "/"])
def test_an_input_without_a_file_name_is_refused(
    submitter: Submitter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    with pytest.raises(UsageError):
        submitter.build(SubmitRequest(program="true", inputs=[given]))


def test_a_request_like_the_last_is_checked_again_when_anything_but_its_id_differs(
    submitter: Submitter,
) -> None:
    """Array members reuse the last request's checks; a request of another shape (or
    the same object changed in place after it was built) is checked in full."""
    req = SubmitRequest("/bin/true", params={"x": "fine"}, args=["a"])
    for i in range(3):
        submitter.build(req.but(array_index=i))
    req.params["x"] = "bad\0"  # the very dict the last build saw
    with pytest.raises(UsageError, match="NUL"):
        submitter.build(req.but(array_index=3))
    req.params["x"] = "fine"
    with pytest.raises(InvalidName):
        submitter.build(req.but(array_index=4, pool="no such/pool"))
    with pytest.raises(UsageError):
        submitter.build(req.but(array_index=5, retries=-1))
    spec = submitter.build(req.but(array_index=6, job_id="0" * 32))
    assert (spec.id, spec.array_index, spec.params) == ("0" * 32, 6, {"x": "fine"})
    assert spec.placement == names.default_placement("0" * 32)
