"""CLI tests: whole outputs in plain mode, JSON shapes, exit codes and error sentences."""

from __future__ import annotations

import os
import re
from pathlib import Path

import orjson
from click.testing import CliRunner
from helpers import STATE_NAMES

from httk_flow.cli.main import cli


def flow(runner: CliRunner, *args: str) -> tuple[int, str]:
    r = runner.invoke(cli, list(args), catch_exceptions=False)
    return r.exit_code, r.output


def test_init_prints_one_line_naming_the_workspace(runner: CliRunner, tmp_path: Path) -> None:
    code, out = flow(runner, "init", str(tmp_path / "w"))
    assert (code, out) == (0, f"workspace {tmp_path / 'w'} (non-durable, lease 30s)\n")


def test_init_twice_is_refused_unless_exist_ok(runner: CliRunner, ws: str) -> None:
    r = runner.invoke(cli, ["init", ws])
    assert r.exit_code == 2
    assert r.output == (
        f"flow: error: {ws}: is already a workspace; pass --exist-ok to accept that\n"
    )
    assert runner.invoke(cli, ["init", ws, "--exist-ok"]).exit_code == 0


def test_submit_json_has_the_contract_shape(runner: CliRunner, ws: str) -> None:
    code, out = flow(runner, "-w", ws, "submit", "--json", "--tag", "t1", "true")
    assert code == 0
    doc = orjson.loads(out)
    assert list(doc) == ["jobs", "group"] and len(doc["jobs"]) == 1
    assert re.fullmatch(r"sub-\d{8}-\d{6}-[0-9a-f]{4}", doc["group"])
    job = doc["jobs"][0]
    assert set(job) == {"id", "key", "placement"}
    assert job["key"] == f"t1--{job['id']}" and job["placement"] == f"jobs/{job['id'][:2]}"


def test_workspace_option_is_accepted_after_the_command(runner: CliRunner, ws: str) -> None:
    code, out = flow(runner, "submit", "-w", ws, "true")
    assert code == 0 and re.fullmatch(r"[0-9a-f]{32}\n", out)


def test_array_submission_prints_one_id_per_job(runner: CliRunner, ws: str) -> None:
    code, out = flow(runner, "-w", ws, "submit", "--array", "1-9:2", "true")
    assert code == 0 and len(out.split()) == 5


def test_list_json_rows_have_the_contract_keys(runner: CliRunner, ws: str) -> None:
    flow(runner, "-w", ws, "submit", "--tag", "a", "--priority", "7", "true")
    code, out = flow(runner, "-w", ws, "list", "--json")
    rows = orjson.loads(out)["jobs"]
    assert code == 0 and len(rows) == 1
    assert set(rows[0]) == {
        "id",
        "key",
        "tag",
        "group",
        "state",
        "step",
        "priority",
        "attempts",
        "placement",
        "limit",
        "elapsed",
        "start",
        "end",
        "failure",
        "interrupted",
        "after",
    }
    assert rows[0]["after"] is False
    assert (rows[0]["tag"], rows[0]["state"], rows[0]["priority"]) == ("a", "submitted", 7)
    assert (rows[0]["limit"], rows[0]["elapsed"]) == (None, None)
    assert (rows[0]["start"], rows[0]["end"], rows[0]["failure"]) == (None, None, None)


def test_list_plain_output_is_a_stable_table(runner: CliRunner, ws: str) -> None:
    _, out = flow(runner, "-w", ws, "submit", "--tag", "a", "true")
    jid = out.strip()
    _, out = flow(runner, "-w", ws, "list")
    assert out == (
        "ID            TAG  STATE      STEP  PRIO  ATTEMPTS  ELAPSED  LIMIT  PLACEMENT\n"
        f"{jid[:12]}  a    submitted  main  500   0         -        -      jobs/{jid[:2]}\n"
    )


def test_status_json_counts_every_state_kind(runner: CliRunner, ws: str) -> None:
    flow(runner, "-w", ws, "submit", "--array", "1-3", "true")
    code, out = flow(runner, "-w", ws, "status", "--json")
    doc = orjson.loads(out)
    assert code == 0
    assert doc["workspace"] == os.path.abspath(ws) and doc["total"] == 3
    assert list(doc["counts"]) == STATE_NAMES and doc["counts"]["submitted"] == 3
    assert doc["managers"] == [] and isinstance(doc["blocked"], list)


def test_status_plain_names_what_blocks_the_queue(runner: CliRunner, ws: str) -> None:
    flow(runner, "-w", ws, "submit", "--pool", "gpu", "true")
    _, out = flow(runner, "-w", ws, "status")
    assert out.splitlines()[0] == f"workspace {os.path.abspath(ws)}: 1 jobs"
    assert "managers: 0 live" in out


def test_show_json_includes_the_contract_fields(runner: CliRunner, ws: str) -> None:
    _, out = flow(runner, "-w", ws, "submit", "--tag", "x", "--param", "k=v", "true")
    code, out = flow(runner, "-w", ws, "show", "x", "--json")
    doc = orjson.loads(out)
    assert code == 0
    assert {"id", "key", "state", "step", "generation", "attempts"} <= set(doc)
    assert doc["state"] == "submitted" and doc["attempts"] == []
    assert doc["definition"]["params"] == {"k": "v"}


def test_history_lists_every_transition_oldest_first(runner: CliRunner, ws: str) -> None:
    flow(runner, "-w", ws, "submit", "--tag", "h", "true")
    code, out = flow(runner, "-w", ws, "history", "h", "--json")
    frames = orjson.loads(out)["transitions"]
    assert code == 0 and [f["to"] for f in frames] == ["submitted"]


def test_an_unknown_job_is_one_clear_sentence_with_exit_2(runner: CliRunner, ws: str) -> None:
    r = runner.invoke(cli, ["-w", ws, "show", "nosuchtag"])
    assert r.exit_code == 2
    assert r.output == (
        "flow: error: job 'nosuchtag': matches no job; see the jobs with `flow list`\n"
    )


def test_a_bad_param_is_refused_naming_the_flag(runner: CliRunner, ws: str) -> None:
    r = runner.invoke(cli, ["-w", ws, "submit", "--param", "novalue", "true"])
    assert r.exit_code == 2
    assert r.output == "flow: error: --param 'novalue': must be KEY=VALUE\n"


def test_a_bad_placement_is_refused_before_anything_is_written(runner: CliRunner, ws: str) -> None:
    r = runner.invoke(cli, ["-w", ws, "submit", "--placement", "../escape", "true"])
    assert r.exit_code == 2 and r.output.startswith("flow: error: placement '../escape'")
    assert not os.path.exists(os.path.join(os.path.dirname(ws), "escape"))


def test_a_bad_jsonl_line_names_file_and_line_and_submits_nothing(
    runner: CliRunner, ws: str, tmp_path: Path
) -> None:
    f = tmp_path / "jobs.jsonl"
    f.write_text('{"tag": "ok1"}\n{"tag": "bad tag"}\n')
    r = runner.invoke(cli, ["-w", ws, "submit", "--from", str(f), "true"])
    assert r.exit_code == 2 and f"{f}:2" in r.output
    _, out = flow(runner, "-w", ws, "list", "--json")
    assert orjson.loads(out)["jobs"] == []


def test_jsonl_submission_applies_each_line(runner: CliRunner, ws: str, tmp_path: Path) -> None:
    f = tmp_path / "jobs.jsonl"
    f.write_text('{"tag": "a", "priority": 9, "params": {"n": 1}}\n\n{"tag": "b", "time": "2m"}\n')
    code, out = flow(runner, "-w", ws, "submit", "--from", str(f), "--json", "true")
    assert code == 0 and len(orjson.loads(out)["jobs"]) == 2
    _, out = flow(runner, "-w", ws, "show", "b", "--json")
    assert orjson.loads(out)["definition"]["time"] == 120.0


def test_no_workspace_found_says_how_to_make_one(runner: CliRunner, tmp_path: Path) -> None:
    os.chdir(tmp_path)
    r = runner.invoke(cli, ["status"])
    assert r.exit_code == 2
    assert "create one with `flow init`" in r.output


def test_cancel_of_a_queued_job_needs_no_manager(runner: CliRunner, ws: str) -> None:
    _, out = flow(runner, "-w", ws, "submit", "--tag", "c", "true")
    code, out = flow(runner, "-w", ws, "cancel", "c", "--reason", "not needed")
    assert code == 0 and out.endswith(": submitted -> cancelled\n")
    _, out = flow(runner, "-w", ws, "wait", "--timeout", "5")
    assert out == "1/1 done: 0 succeeded, 0 failed, 1 cancelled\n"


def test_lock_and_unlock_round_trip(runner: CliRunner, ws: str) -> None:
    code, out = flow(runner, "-w", ws, "lock", "--reason", "upgrade")
    assert code == 0 and out.startswith("maintenance lock taken")
    assert runner.invoke(cli, ["-w", ws, "lock"]).exit_code == 2
    assert flow(runner, "-w", ws, "unlock") == (0, "maintenance lock released\n")
