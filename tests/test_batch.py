"""Batches (protocol.md §6): derived job ids, the batch record, the digest that names a
batch, and the staging names that tell whether their submitter still lives."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from httk_flow.errors import FlowError, UsageError
from httk_flow.ops.batch import batch_key, plan_array, plan_jsonl, run_batch
from httk_flow.protocol import layout, staging
from httk_flow.protocol.batch import (
    BatchRecord,
    batch_job_id,
    new_record,
    read_record,
    write_record,
)
from httk_flow.protocol.jobspec import JobSpec
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.workspace import Workspace


def test_batch_job_ids_are_uuid5_of_the_batch_and_the_index() -> None:
    ns = uuid.UUID("1e55e1f5-4c35-480d-a98f-ffdf168a26c8")  # as docs/protocol.md says
    assert batch_job_id("b-0123456789ab", 7) == uuid.uuid5(ns, "b-0123456789ab/7").hex
    ids = {batch_job_id(k, i) for k in ("a", "b") for i in range(1000)}
    assert len(ids) == 2000


def test_a_record_reads_back_and_absent_members_read_as_defaults(ws: Workspace) -> None:
    assert read_record(ws, "b1") is None
    rec = dataclasses.replace(new_record("b1", "d" * 64, 20), submitted=512)
    write_record(ws, rec)
    assert read_record(ws, "b1") == rec
    assert os.listdir(ws.tmp) == []
    path = layout.batch_file(ws.root, "old")
    Path(path).write_bytes(b'{"batch": "old", "digest": "x", "total": 3}')
    assert read_record(ws, "old") == BatchRecord("old", "x", 3)


@pytest.mark.parametrize(
    "body",
    [b"{", b'{"batch": "b"}', b'{"batch": "b", "digest": "x", "total": true}', b"[]"],
)
def test_an_unreadable_record_is_an_error_naming_the_file(ws: Workspace, body: bytes) -> None:
    path = layout.batch_file(ws.root, "b")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Path(path).write_bytes(body)
    with pytest.raises(FlowError) as e:
        read_record(ws, "b")
    assert e.value.obj == path and "is not a readable batch record" in e.value.message


def _deck(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "deck.jsonl"
    p.write_text(text)
    return p


def _plan(sub: Submitter, deck: Path, base: SubmitRequest, given: str | None = None) -> str:
    return plan_jsonl(sub, lambda: deck.open("rb"), base, str(deck), given).key


def test_the_key_follows_the_input_and_every_option_that_shapes_the_jobs(
    ws: Workspace, tmp_path: Path
) -> None:
    sub = Submitter(ws)
    prog = tmp_path / "run.sh"
    prog.write_text("#!/bin/sh\ntrue\n")
    prog.chmod(0o755)
    deck = _deck(tmp_path, '{"tag": "a"}\n{"tag": "b"}\n')
    base = SubmitRequest(program=str(prog))
    key = _plan(sub, deck, base)
    assert key.startswith("b-") and len(key) == 14
    assert _plan(Submitter(ws), deck, base) == key  # the same command: the same batch
    assert _plan(sub, deck, dataclasses.replace(base, priority=900)) != key
    assert _plan(sub, deck, dataclasses.replace(base, args=["x"])) != key
    assert _plan(sub, deck, dataclasses.replace(base, time=60.0)) != key
    prog.write_text("#!/bin/sh\necho edited\n")  # the program is its content, not its path
    assert _plan(Submitter(ws), deck, base) != key
    assert _plan(sub, deck, base, "mine") == "mine" == batch_key("0" * 64, "mine")
    with pytest.raises(UsageError):
        batch_key("0" * 64, "-bad")
    arr = plan_array(sub, SubmitRequest(program="true"), "1-10")
    assert arr.total == 10 and arr.key != plan_array(sub, SubmitRequest(program="true"), "1-9").key


def test_a_line_that_does_not_validate_leaves_no_record(ws: Workspace, tmp_path: Path) -> None:
    deck = _deck(tmp_path, '{"tag": "a"}\n{"tag": "no good"}\n')
    with pytest.raises(UsageError):
        _plan(Submitter(ws), deck, SubmitRequest(program="true"), "mine")
    assert not os.path.exists(layout.batches_dir(ws.root))


def test_a_rerun_finds_the_jobs_a_lost_record_did_not_count(ws: Workspace, tmp_path: Path) -> None:
    """Payloads of the batch's ids are found in whatever the record says: a record behind
    (a kill between a publish and its record) never makes a job twice."""
    sub = Submitter(ws)
    deck = _deck(tmp_path, "".join(f'{{"params": {{"i": {i}}}}}\n' for i in range(600)))
    plan = plan_jsonl(sub, lambda: deck.open("rb"), SubmitRequest(program="true"), "d")
    got: list[JobSpec] = []
    first = run_batch(ws, sub, plan, on_job=got.append)
    assert (first.already, first.submitted, first.complete) == (0, 600, True)
    assert [j.id for j in got] == [batch_job_id(plan.key, i) for i in range(600)]
    os.unlink(layout.batch_file(ws.root, plan.key))
    again = run_batch(ws, Submitter(ws), plan, on_job=got.append)
    assert (again.already, again.submitted, again.complete, len(got)) == (600, 0, True, 600)


def test_staging_names_say_who_made_them(tmp_path: Path) -> None:
    name = staging.staging_name("ab" * 16)
    st = staging.parse_staging(name)
    assert st is not None and (st.job_id, st.pid) == ("ab" * 16, os.getpid())
    assert st.host == socket.gethostname()[:64] and not staging.maker_gone(st)
    assert not staging.removable(name, 10.0)  # its maker lives
    assert staging.removable(name, staging.STAGING_GRACE)
    # a maker that exited is gone at once; one on another host only by age
    child = subprocess.run(
        [sys.executable, "-c", "from httk_flow.protocol import staging as s; "
         "print(s.staging_name('cd' * 16))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    dead = child.stdout.strip()
    assert staging.removable(dead, 0.0)
    elsewhere = dead.rsplit("@", 1)[0] + "@another-host"
    assert not staging.removable(elsewhere, 10.0) and staging.removable(elsewhere, 4000.0)
    old_form = f"job-{'ef' * 16}.0123abcd"
    parsed = staging.parse_staging(old_form)
    assert parsed is not None and parsed.pid is None
    assert not staging.removable(old_form, 10.0) and staging.removable(old_form, 4000.0)
    assert staging.parse_staging("prog-abc-12") is None


def test_sweep_removes_only_staging_dirs_no_live_submitter_owns(
    ws: Workspace, tmp_path: Path
) -> None:
    child = subprocess.run(
        [sys.executable, "-c", "from httk_flow.protocol import staging as s; "
         "print(s.staging_name('cd' * 16))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    dead, live = child.stdout.strip(), staging.staging_name("ab" * 16)
    for n in (dead, live, ".batch.json.1.abcd"):
        os.mkdir(os.path.join(ws.tmp, n))
    assert staging.sweep(ws.tmp, time.time()) == [os.path.join(ws.tmp, dead)]
    assert sorted(os.listdir(ws.tmp)) == sorted([live, ".batch.json.1.abcd"])
