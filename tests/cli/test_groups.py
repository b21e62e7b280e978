"""Groups, holds and steering before registration, through real `flow` processes and
real managers: a submission's group, `flow groups`, `status --by group`, `submit --hold`
and `flow release`, pause and priority of submitted jobs, a campaign's children."""

from __future__ import annotations

import datetime as dt
import os
import re
from pathlib import Path
from typing import Any

import orjson
from manager.support import FAMILY, Managers, flow, make_workspace, write_script

from httk_flow.protocol.durations import format_duration
from httk_flow.protocol.names import group_digest


def _ok(root: str, *args: str) -> str:
    r = flow("-w", root, *args)
    assert r.returncode == 0, f"flow {' '.join(args)} -> {r.returncode}:\n{r.stdout}{r.stderr}"
    return r.stdout


def _json(root: str, *args: str) -> Any:
    return orjson.loads(_ok(root, args[0], "--json", *args[1:]))


def _keys(doc: dict[str, Any]) -> list[str]:
    return sorted(j["key"] for j in doc["jobs"])


def _run(managers: Managers, root: str) -> None:
    managers.run(root, workers=2)  # exits 4 when held jobs are left: what is checked after


def test_each_submission_is_a_group_of_its_own_named_in_its_output(tmp_path: Path) -> None:
    root = make_workspace(tmp_path / "ws")
    one = _json(root, "submit", "true")
    arr = _json(root, "submit", "--array", "1-3", "true")
    named = _json(root, "submit", "--group", "camp", "--tag", "t", "true")
    assert re.fullmatch(r"sub-\d{8}-\d{6}-[0-9a-f]{4}", one["group"]), one
    # a batch is one group, named after its batch id (a re-run adds to the same group)
    assert arr["group"] == arr["batch"] and re.fullmatch(r"b-[0-9a-f]{12}", arr["group"])
    assert one["group"] != arr["group"] and named["group"] == "camp"
    shown = _json(root, "show", named["jobs"][0]["key"])
    assert (shown["group"], shown["definition"]["group"]) == ("camp", "camp")
    # captured output stays one id a line: the group is said to a person at a terminal
    r = flow("-w", root, "submit", "--group", "camp", "true")
    assert re.fullmatch(r"[0-9a-f]{32}\n", r.stdout) and r.stderr == ""
    groups = {g["group"]: g for g in _json(root, "groups")["groups"]}
    assert {g: v["jobs"] for g, v in groups.items()} == {
        one["group"]: 1,
        arr["group"]: 3,
        "camp": 2,
    }
    assert groups["camp"]["digest"] == group_digest("camp")
    assert groups["camp"]["states"] == {"submitted": 2}
    assert (groups["camp"]["first_end"], groups["camp"]["last_end"]) == (None, None)


def test_flow_groups_and_status_by_group_count_each_group(
    tmp_path: Path, managers: Managers
) -> None:
    root = make_workspace(tmp_path / "ws")
    _ok(root, "submit", "--group", "ok", "--array", "1-2", "true")
    _ok(root, "submit", "--group", "bad", "--retries", "0", "false")
    _run(managers, root)
    _ok(root, "submit", "--group", "later", "true")
    doc = {g["group"]: g for g in _json(root, "groups")["groups"]}
    assert doc["ok"]["states"] == {"succeeded": 2} and doc["bad"]["states"] == {"failed": 1}
    assert doc["ok"]["first_end"] <= doc["ok"]["last_end"]
    assert doc["ok"]["created"] <= doc["ok"]["first_end"]

    def row(g: str, counts: str, span: str) -> str:
        created = dt.datetime.fromtimestamp(doc[g]["created"]).strftime("%Y-%m-%d %H:%M:%S")
        return f"{g:<5}  {counts}  {created}  {span}".rstrip()

    def span(g: str) -> str:
        return format_duration(doc[g]["last_end"] - doc[g]["created"])

    out = _ok(root, "groups").splitlines()
    assert out[0].split() == [
        "GROUP",
        "JOBS",
        "SUBMITTED",
        "SUCCEEDED",
        "FAILED",
        "CREATED",
        "SPAN",
    ]
    assert out[1:3] == [
        row("ok", "2     0          2          0     ", span("ok")),
        row("bad", "1     0          0          1     ", span("bad")),
    ]
    later = re.escape(row("later", "1     1          0          0     ", ""))
    assert re.fullmatch(later + r"  running for \S+", out[3]), out[3]

    assert _ok(root, "status", "--by", "group") == (
        f"workspace {root}: 4 jobs\n"
        "STATE      JOBS\n"
        "submitted  1\n"
        "ready      0\n"
        "running    0\n"
        "succeeded  2\n"
        "failed     1\n"
        "GROUP  SUBMITTED  SUCCEEDED  FAILED\n"
        "bad    0          0          1\n"
        "later  1          0          0\n"
        "ok     0          2          0\n"
        "managers: 0 live\n"
        "blocked: 1 job: no live manager to register submissions; start one with `flow serve` "
        "or `flow run`\n"
    )
    counts = _json(root, "status", "--group", "ok")["counts"]
    assert {s: n for s, n in counts.items() if n} == {"succeeded": 2}
    by = _json(root, "status", "--by", "group", "--group", "bad", "--group", "later")["groups"]
    assert by == {"bad": {"failed": 1}, "later": {"submitted": 1}}


def test_a_held_submission_waits_for_release_then_runs(tmp_path: Path, managers: Managers) -> None:
    root = make_workspace(tmp_path / "ws")
    held = _json(root, "submit", "--hold", "--group", "h", "--array", "1-2", "true")
    free = _json(root, "submit", "--group", "free", "true")
    _run(managers, root)
    rows = {j["key"]: j["state"] for j in _json(root, "list")["jobs"]}
    assert rows == {
        **dict.fromkeys(_keys(held), "paused"),
        **dict.fromkeys(_keys(free), "succeeded"),
    }
    r = flow("-w", root, "wait", "--group", "h", "--timeout", "0.5")
    assert (
        r.returncode == 3
        and r.stdout == "0/2 done: 0 succeeded, 0 failed, 0 cancelled (timed out)\n"
    )

    out = _ok(root, "release", "--group", "h", "--group", "free", "--yes")
    assert sorted(out.splitlines()) == sorted(
        [f"{k}: paused -> ready" for k in _keys(held)]
        + [f"{k}: succeeded -> succeeded (skipped: not paused)" for k in _keys(free)]
    )
    again = _json(root, "release", "--group", "h")
    assert again["errors"] == [] and sorted(again["jobs"], key=lambda j: j["key"]) == [
        {
            "id": k[-32:],
            "key": k,
            "from": "ready",
            "to": "ready",
            "note": "skipped: not paused",
            "skipped": True,
        }
        for k in _keys(held)
    ]
    _run(managers, root)
    r = flow("-w", root, "wait", "--group", "h")
    assert (r.returncode, r.stdout) == (0, "2/2 done: 2 succeeded, 0 failed, 0 cancelled\n")


def test_submitted_jobs_are_paused_and_reprioritised_before_any_manager(
    tmp_path: Path, managers: Managers
) -> None:
    root = make_workspace(tmp_path / "ws")
    p = _json(root, "submit", "--group", "p", "--tag", "pz", "true")["jobs"][0]
    q = _json(root, "submit", "--group", "q", "--tag", "qz", "true")["jobs"][0]
    assert _ok(root, "pause", "--group", "p", "--yes") == f"{p['key']}: submitted -> paused\n"
    out = _ok(root, "priority", "--tag", "qz", "--yes", "9")
    assert out == f"{q['key']}: submitted -> submitted (priority 9)\n"
    out = _ok(root, "priority", "pz", "12")
    assert out == f"{p['key']}: paused -> paused (priority 12)\n"
    _run(managers, root)
    rows = {j["tag"]: (j["state"], j["priority"]) for j in _json(root, "list")["jobs"]}
    assert rows == {"pz": ("paused", 12), "qz": ("succeeded", 9)}
    assert _ok(root, "resume", "--group", "p", "--yes") == f"{p['key']}: paused -> ready\n"


def test_a_submitted_job_registration_would_fail_is_left_to_registration(
    tmp_path: Path, managers: Managers
) -> None:
    root = make_workspace(tmp_path / "ws")
    job = _json(root, "submit", "--tag", "broken", "true")["jobs"][0]
    spec = Path(root) / job["placement"] / job["key"] / "job.json"
    os.chmod(spec, 0o644)
    spec.write_bytes(b"{}")
    r = flow("-w", root, "pause", "broken")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.startswith(
        f"flow: error: job {job['key']}: is left for registration, which fails it: "
    )
    assert _json(root, "show", "broken")["state"] == "submitted"
    _run(managers, root)
    shown = _json(root, "show", "broken")
    assert (shown["state"], shown["failure"]["code"]) == ("failed", "protocol_error")


def test_a_campaign_s_children_are_in_its_group(tmp_path: Path, managers: Managers) -> None:
    root = make_workspace(tmp_path / "ws")
    script = write_script(tmp_path / "scripts", "family.sh", FAMILY)
    _ok(root, "submit", "--group", "fam", "--param", "kids=3", script)
    _ok(root, "submit", "--group", "other", "true")
    _run(managers, root)
    rows = _json(root, "list", "--group", "fam")["jobs"]
    assert sorted((j["tag"] or "-", j["group"]) for j in rows) == [
        ("-", "fam"),
        ("kid", "fam"),
        ("kid", "fam"),
        ("kid", "fam"),
    ]
    r = flow("-w", root, "wait", "--group", "fam")
    assert (r.returncode, r.stdout) == (0, "4/4 done: 4 succeeded, 0 failed, 0 cancelled\n")
    assert {g["group"]: g["jobs"] for g in _json(root, "groups")["groups"]} == {
        "fam": 4,
        "other": 1,
    }


def test_a_digest_collision_is_refused_with_nothing_submitted(tmp_path: Path) -> None:
    root = make_workspace(tmp_path / "ws")
    d = group_digest("mine")
    (Path(root) / ".flow" / "groups").mkdir()
    body = {"name": "theirs", "digest": d, "created": 1.0, "by": "x"}
    (Path(root) / ".flow" / "groups" / f"{d}.json").write_bytes(orjson.dumps(body))
    r = flow("-w", root, "submit", "--group", "mine", "true")
    assert (r.returncode, r.stdout, r.stderr) == (
        2,
        "",
        f"flow: error: group 'mine': has the same digest {d} as the existing group 'theirs'; "
        "choose another group name\n",
    )
    assert _json(root, "list")["jobs"] == []
    r = flow("-w", root, "submit", "--group", "bad name", "true")
    assert r.returncode == 2 and "a group name is 1-64 characters" in r.stderr
