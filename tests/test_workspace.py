"""workspace: creating, opening and finding a workspace; its format and policy."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from httk_flow.errors import FlowError, UsageError, WorkspaceError
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import FORMAT_VERSION, Policy, Workspace, WorkspaceFormat

WHERE = "format.json"


def _format_path(root: str | Path) -> str:
    return os.path.join(root, ".flow", "format.json")


def _rewrite_format(root: str | Path, **changes: object) -> None:
    path = _format_path(root)
    with open(path, "rb") as fh:
        data = orjson.loads(fh.read())
    for k, v in changes.items():
        if v is None:
            data.pop(k, None)
        else:
            data[k] = v
    with open(path, "wb") as fh:
        fh.write(orjson.dumps(data))


def test_create_lays_out_every_state_directory_and_the_format_file(tmp_path: Path) -> None:
    ws = Workspace.create(str(tmp_path / "new"), durable=True, lease=12)
    for kind in State:
        assert os.path.isdir(ws.state_dir(kind))
    for d in (ws.tmp, ws.programs, ws.managers, ws.requests, ws.journal_dir):
        assert os.path.isdir(d)
    # a new workspace keeps the ready jobs of each class apart (protocol revision 8)
    assert ws.policy == Policy(lease=12.0, durable=True, class_dirs=True)
    reopened = Workspace.open(ws.root)
    assert reopened.format == ws.format
    assert len(ws.format.workspace_id) == 32


def test_create_on_an_existing_workspace_needs_exist_ok(tmp_path: Path) -> None:
    first = Workspace.create(str(tmp_path))
    with pytest.raises(UsageError) as info:
        Workspace.create(str(tmp_path))
    assert "--exist-ok" in str(info.value)
    again = Workspace.create(str(tmp_path), exist_ok=True, durable=True)
    assert again.format == first.format  # the existing policy wins, nothing is rewritten


@pytest.mark.parametrize("lease", [0, -5])
def test_create_refuses_a_non_positive_lease(tmp_path: Path, lease: float) -> None:
    with pytest.raises(UsageError):
        Workspace.create(str(tmp_path), lease=lease)


def test_open_refuses_a_directory_that_is_not_a_workspace(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceError) as info:
        Workspace.open(str(tmp_path))
    assert "flow init" in str(info.value)


def test_find_prefers_the_explicit_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = Workspace.create(str(tmp_path / "a"))
    b = Workspace.create(str(tmp_path / "b"))
    monkeypatch.setenv("FLOW_WORKSPACE", b.root)
    assert Workspace.find(a.root, start=b.root).root == a.root


def test_find_uses_flow_workspace_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = Workspace.create(str(tmp_path / "a"))
    b = Workspace.create(str(tmp_path / "b"))
    monkeypatch.setenv("FLOW_WORKSPACE", b.root)
    assert Workspace.find(start=a.root).root == b.root


def test_find_walks_up_to_the_nearest_ancestor_holding_flow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outer = Workspace.create(str(tmp_path / "outer"))
    inner = Workspace.create(str(tmp_path / "outer" / "x" / "inner"))
    deep = tmp_path / "outer" / "x" / "inner" / "jobs" / "abc"
    deep.mkdir(parents=True)
    assert Workspace.find(start=str(deep)).root == inner.root
    assert Workspace.find(start=str(tmp_path / "outer" / "x")).root == outer.root
    monkeypatch.chdir(deep)
    assert Workspace.find().root == inner.root


def test_find_without_a_workspace_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceError) as info:
        Workspace.find(start=str(tmp_path))
    text = str(info.value)
    assert "-w" in text and "FLOW_WORKSPACE" in text and "flow init" in text


@pytest.mark.parametrize("version", [0, 2, "1", None])
def test_an_unknown_format_version_is_refused(tmp_path: Path, version: object) -> None:
    Workspace.create(str(tmp_path))
    _rewrite_format(tmp_path, version=version)
    with pytest.raises(WorkspaceError) as info:
        Workspace.open(str(tmp_path))
    assert "version" in str(info.value)


def test_a_foreign_format_file_is_refused(tmp_path: Path) -> None:
    Workspace.create(str(tmp_path))
    _rewrite_format(tmp_path, format="something-else")
    with pytest.raises(WorkspaceError):
        Workspace.open(str(tmp_path))


def test_an_unknown_policy_key_is_refused(tmp_path: Path) -> None:
    ws = Workspace.create(str(tmp_path))
    policy = {**orjson.loads(orjson.dumps(ws.format.policy.__dict__)), "warp_drive": True}
    _rewrite_format(tmp_path, policy=policy)
    with pytest.raises(WorkspaceError) as info:
        Workspace.open(str(tmp_path))
    assert "warp_drive" in str(info.value)


def test_absent_policy_keys_read_as_their_defaults(tmp_path: Path) -> None:
    Workspace.create(str(tmp_path), durable=True, lease=10)
    _rewrite_format(tmp_path, policy={"lease": 10})
    assert Workspace.open(str(tmp_path)).policy == Policy(lease=10.0)
    _rewrite_format(tmp_path, policy=None)
    assert Workspace.open(str(tmp_path)).policy == Policy()


@pytest.mark.parametrize(
    "policy",
    [
        {"lease": "30"},
        {"lease": True},
        {"durable": 1},
        {"segment_bytes": 1.5},
        {"lease": 0},
        {"segment_bytes": 100},
        [],
    ],
)
def test_policy_values_of_the_wrong_type_or_range_are_refused(
    tmp_path: Path, policy: object
) -> None:
    Workspace.create(str(tmp_path))
    _rewrite_format(tmp_path, policy=policy)
    with pytest.raises(WorkspaceError):
        Workspace.open(str(tmp_path))


def test_an_integer_where_a_float_is_expected_is_accepted(tmp_path: Path) -> None:
    Workspace.create(str(tmp_path))
    _rewrite_format(tmp_path, policy={"takeover_factor": 3})
    assert Workspace.open(str(tmp_path)).policy.takeover_factor == 3.0


def test_the_format_round_trips_through_json() -> None:
    fmt = WorkspaceFormat("f" * 32, 1234.5, Policy(lease=7.0, segment_bytes=8192))
    assert WorkspaceFormat.from_json(fmt.to_json(), WHERE) == fmt
    assert orjson.loads(fmt.to_json())["version"] == FORMAT_VERSION


@given(st.binary(max_size=300))
def test_random_bytes_as_a_format_file_only_raise_flow_errors(raw: bytes) -> None:
    try:
        WorkspaceFormat.from_json(raw, WHERE)
    except FlowError:
        pass


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)
policy_keys = st.sampled_from([*Policy.__dataclass_fields__, "other"])


@given(
    st.dictionaries(
        st.sampled_from(["format", "version", "workspace_id", "created", "policy"]), json_values
    ),
    st.dictionaries(policy_keys, json_values),
    st.booleans(),
)
def test_structured_garbage_as_a_format_file_only_raises_flow_errors(
    top: dict[str, object], policy: dict[str, object], plausible: bool
) -> None:
    doc: dict[str, object] = (
        {"format": "httk-flow", "version": 1, "workspace_id": "x", "created": 1.0, "policy": policy}
        if plausible
        else {}
    )
    doc.update(top)
    try:
        fmt = WorkspaceFormat.from_json(orjson.dumps(doc), WHERE)
    except FlowError:
        return
    assert fmt.policy.lease > 0
    assert fmt.policy.segment_bytes >= 4096


# -- the state-directory check (a planted symlink must not lead markers out) ------------


@pytest.mark.parametrize("level", ["kind", "placement", "shard"])
def test_a_state_directory_leading_out_of_the_tree_is_refused_at_any_level(
    tmp_path: Path, level: str
) -> None:
    ws = Workspace.create(str(tmp_path / "ws"))
    outside = tmp_path / "outside"
    (outside / "jobs" / "ab").mkdir(parents=True)
    kind = Path(ws.state_dir(State.SUCCEEDED))
    shard = kind / "jobs" / "ab"
    planted = {"kind": kind, "placement": kind / "jobs", "shard": shard}[level]
    if planted.exists():
        os.rmdir(planted)
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.symlink_to(
        {"kind": outside, "placement": outside / "jobs", "shard": outside / "jobs" / "ab"}[level]
    )
    with pytest.raises(FlowError, match="leads out of the workspace's state tree"):
        ws.check_state_dir(str(shard))
    # a fresh look (another process) refuses it too; nothing was cached as safe
    with pytest.raises(FlowError, match="leads out"):
        Workspace.open(ws.root).check_state_dir(str(shard))


def test_a_link_that_stays_inside_the_state_tree_is_accepted(tmp_path: Path) -> None:
    ws = Workspace.create(str(tmp_path / "ws"))
    real = Path(ws.state_dir(State.READY)) / "jobs" / "cd"
    real.mkdir(parents=True)
    link = Path(ws.state_dir(State.SUCCEEDED)) / "jobs" / "cd"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(real)
    ws.check_state_dir(str(link))


def test_a_plain_shard_costs_one_lstat_once_its_parents_are_known(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = Workspace.create(str(tmp_path / "ws"))
    base = Path(ws.state_dir(State.RUNNING)) / "jobs"
    for shard in ("00", "01", "02"):
        (base / shard).mkdir(parents=True)
    ws.check_state_dir(str(base / "00"))  # the kind and placement directories, once
    seen: list[str] = []
    real_lstat = os.lstat

    def counting(path: str, *a: object, **k: object) -> os.stat_result:
        seen.append(str(path))
        return real_lstat(path, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "lstat", counting)
    ws.check_state_dir(str(base / "01"))
    ws.check_state_dir(str(base / "02"))
    ws.check_state_dir(str(base / "01"))  # remembered: no call at all
    assert seen == [str(base / "01"), str(base / "02")]


def test_a_directory_someone_else_made_is_resolved_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = Workspace.create(str(tmp_path / "ws"))
    shard = Path(ws.state_dir(State.RUNNING)) / "jobs" / "0a"
    shard.mkdir(parents=True)
    ws.check_state_dir(str(shard))
    resolved: list[str] = []
    real = os.path.realpath
    monkeypatch.setattr(os.path, "realpath", lambda p: resolved.append(p) or real(p))
    ws.check_state_dir(str(shard), again=True)
    assert resolved == [str(shard)]
