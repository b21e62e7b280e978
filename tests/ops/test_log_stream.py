"""`flow init --logs stream`: at its commit an attempt's output is appended to its
manager's log segments and its files removed, so every finished job is three inodes
(its directory, job.json, its marker) whatever it printed; `flow logs` reads it back as
before, a crash at any point of the commit loses no output, a damaged record is an error
naming the attempt, and `flow gc` collects segments as it collects attempts."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import orjson
from click.testing import CliRunner
from manager.support import Managers, fsck_report, write_program

from httk_flow.cli.main import cli
from httk_flow.protocol import logstream

from .support import Flow, patch_policy
from .test_tidy import inodes

PRINTS = r"""#!/usr/bin/env bash
source "$FLOW_BASH_API"
flow_steps main
step_main() {
    printf 'line one\nno newline at the end, and a byte \001 '
    printf 'to stderr\n' >&2
    flow_succeed
}
flow_main "$@"
"""
STDOUT = "line one\nno newline at the end, and a byte \x01 "

#: fails its first attempt (printing "first"), succeeds its second (printing "second")
RETRIED = """#!/bin/sh
if [ "$FLOW_ATTEMPT" = 1 ]; then echo first; exit 3; fi
echo second
"""

#: prints more than a log record holds: its output stays a file beside job.json
LOUD = f"""#!/bin/sh
head -c {logstream.MAX_STREAMED + 1} /dev/zero | tr '\\0' x
"""


def streaming(flow: Flow) -> Flow:
    patch_policy(flow.root, logs="stream")
    return flow


def segments(root: str) -> list[Path]:
    return sorted(Path(root, ".flow", "logs").glob("*/*.log"))


def test_init_writes_the_policy_and_refuses_what_contradicts_it(
    runner: CliRunner, tmp_path: Path
) -> None:
    r = runner.invoke(cli, ["init", "--json", "--logs", "stream", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    assert orjson.loads(r.stdout)["logs"] == "stream"
    fmt = orjson.loads((tmp_path / "a" / ".flow" / "format.json").read_bytes())
    assert fmt["policy"]["logs"] == "stream"
    # the default is not written: a workspace stays shareable with older managers
    runner.invoke(cli, ["init", str(tmp_path / "b")])
    assert (
        "logs"
        not in orjson.loads((tmp_path / "b" / ".flow" / "format.json").read_bytes())["policy"]
    )
    r = runner.invoke(
        cli, ["init", "--logs", "stream", "--keep-attempt-files", str(tmp_path / "c")]
    )
    assert r.exit_code == 2
    assert r.output.startswith("flow: error: --keep-attempt-files: keeps every file")
    assert not (tmp_path / "c" / ".flow").exists()
    r = runner.invoke(cli, ["init", "--logs", "pipes", str(tmp_path / "d")])
    assert r.exit_code == 2 and "'pipes' is not one of 'files', 'stream'" in r.output


def test_every_finished_job_is_three_inodes_and_flow_logs_reads_its_output(
    flow: Flow, scripts: Path, managers: Managers
) -> None:
    streaming(flow)
    jobs = [flow.submit(write_program(scripts, "prints.sh", PRINTS)) for _ in range(3)]
    quiet = flow.submit("true")
    assert managers.run(flow.root) == 0
    for job in jobs:
        assert flow.state(job["key"]) == "succeeded"
        assert inodes(flow.job_dir(job)) == [".", "job.json"], job
        assert flow.ok("logs", job["key"]) == STDOUT
        assert flow.ok("logs", "--stderr", job["key"]) == "to stderr\n"
        assert flow.ok("logs", "--follow", job["key"]) == STDOUT
        [final] = [t for t in flow.history(job["key"]) if t["to"] == "succeeded"]
        assert set(final["logs"]) == {"stdout", "stderr"}  # where the final frame says it is
        assert final["from"] == "running"  # a direct commit: the one frame names the records
    assert inodes(flow.job_dir(quiet)) == [".", "job.json"]
    assert flow.ok("logs", quiet["key"]) == ""
    # one manager, one segment: two records per job that printed
    [seg] = segments(flow.root)
    heads = list(logstream.iter_headers(str(seg)))
    assert len(heads) == 6 and all(h is not None for h in heads)
    assert fsck_report(flow.root)["clean"]


def test_each_attempt_reads_back_its_own_output(
    flow: Flow, scripts: Path, managers: Managers
) -> None:
    streaming(flow)
    job = flow.submit("--retries", "1", write_program(scripts, "retried.sh", RETRIED))
    assert managers.run(flow.root) == 0
    assert flow.state(job["key"]) == "succeeded"
    assert flow.ok("logs", "--attempt", "1", job["key"]) == "first\n"
    assert flow.ok("logs", "--attempt", "2", job["key"]) == "second\n"
    assert flow.ok("logs", job["key"]) == "second\n"
    assert inodes(flow.job_dir(job)) == [".", "job.json"]


def test_output_larger_than_a_record_stays_a_file(
    flow: Flow, scripts: Path, managers: Managers
) -> None:
    streaming(flow)
    job = flow.submit(write_program(scripts, "loud.sh", LOUD))
    assert managers.run(flow.root) == 0
    assert inodes(flow.job_dir(job)) == [".", "a0001.stdout", "job.json"]
    assert flow.ok("logs", job["key"]) == "x" * (logstream.MAX_STREAMED + 1)


def test_a_damaged_record_is_an_error_naming_the_attempt_never_other_output(
    flow: Flow, scripts: Path, managers: Managers
) -> None:
    streaming(flow)
    a = flow.submit(write_program(scripts, "prints.sh", PRINTS))
    b = flow.submit(write_program(scripts, "prints2.sh", PRINTS.replace("line one", "other")))
    assert managers.run(flow.root) == 0
    [seg] = segments(flow.root)
    data = seg.read_bytes()
    # a's records name a's id; make them name b's: a reader must not hand out b's output
    seg.write_bytes(data.replace(a["id"].encode(), b["id"].encode()))
    r = flow("logs", a["key"])
    assert r.exit_code == 2
    assert r.output == (
        f"flow: error: attempt a0001 of job {a['key']}: has no readable stdout any more: the "
        f"log record its commit wrote is gone or damaged; `flow show {a['key']}` still tells "
        "how it ended\n"
    )
    # fsck finds it too, for both streams, and nothing of b
    lost = [p for p in fsck_report(flow.root)["problems"] if p["kind"] == "lost_output"]
    assert [p["object"] for p in lost] == [f"attempt a0001 of job {a['key']}"] * 2
    assert "gone or damaged" in lost[0]["message"]
    seg.write_bytes(data[: len(data) - 3])  # a torn tail: the last record is cut
    assert list(logstream.iter_headers(str(seg)))[-1] is None
    assert flow.ok("logs", a["key"]) == STDOUT  # whole records still read


def test_a_manager_killed_in_a_streaming_commit_loses_no_output(
    flow: Flow, scripts: Path, managers: Managers
) -> None:
    streaming(flow)
    prog = write_program(scripts, "prints.sh", PRINTS)
    # a success is committed directly (its records appended first); the retried job's
    # first attempt, a failure, in two renames with the tidy between
    for point in ("commit.after_direct", "commit.after_tidy", "commit.after_final"):
        direct = point == "commit.after_direct"
        if direct:
            job = flow.submit(prog)
        else:
            job = flow.submit("--retries", "1", write_program(scripts, "retried.sh", RETRIED))
        first = managers.start(flow.root, workers=1, env={"FLOW_CRASH_AT": f"{point}:1"})
        assert first.wait(60) == -signal.SIGKILL, point
        assert managers.run(flow.root, workers=1) == 0
        assert flow.state(job["key"]) == "succeeded", point
        commits = [t for t in flow.history(job["key"]) if t["to"] == "succeeded"]
        assert len(commits) == 1, point
        if direct:
            assert flow.ok("logs", job["key"]) == STDOUT, point
            assert flow.ok("logs", "--stderr", job["key"]) == "to stderr\n", point
        else:
            assert flow.ok("logs", "--attempt", "1", job["key"]) == "first\n", point
            assert flow.ok("logs", job["key"]) == "second\n", point
    assert fsck_report(flow.root)["clean"]


def test_gc_collects_a_segment_once_it_holds_only_earlier_attempts(
    flow: Flow, scripts: Path, managers: Managers
) -> None:
    streaming(flow)
    flag = scripts / "failed-once"
    once = f"#!/bin/sh\nif [ ! -e {flag} ]; then : >{flag}; echo first; exit 3; fi\necho second\n"
    job = flow.submit("--retries", "0", write_program(scripts, "once.sh", once))
    assert managers.run(flow.root) == 1  # attempt 1 fails: its output in this manager's segment
    flow.ok("resume", job["key"])
    assert managers.run(flow.root) == 0  # attempt 2, by another manager, in another segment
    first, second = sorted(segments(flow.root), key=lambda p: p.stat().st_mtime)
    old = time.time() - 8 * 86400  # older than the 7 days attempts are kept
    for seg in (first, second):
        os.utime(seg, (old, old))
    report = flow.json("gc")
    assert [i["kind"] for i in report["collected"]] == ["log_segment"]
    assert report["collected"][0]["path"] == str(first)
    assert not first.exists() and second.exists()
    assert flow.ok("logs", job["key"]) == "second\n"
    r = flow("logs", "--attempt", "1", job["key"])
    assert r.exit_code == 2 and "gone or damaged" in r.output
