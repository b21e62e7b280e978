"""Durable bulk submission commits in groups (protocol.md §6): a batch's payloads are
flushed together before any of them is published, and its markers together before the
submission returns. Proved on the system calls of a real `flow submit` under strace, with
syncfs(2) and with the per-file fallback."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from httk_flow.protocol.submit import BATCH
from httk_flow.protocol.workspace import Workspace

STRACE = shutil.which("strace")
JOBS = 2 * BATCH + 76  # three batches, the last one short
_STAGED = re.compile(r"/\.flow/tmp/job-([0-9a-f]{32})\.[^/\"]*")
_CALL = re.compile(r"^(\w+)\((.*)\)\s+=\s+(-?\d+)")


@dataclass
class Trace:
    """What one traced submission did, as (position, call) facts per job."""

    calls: list[tuple[str, str, int]] = field(default_factory=list)
    #: job id -> position of the creation of its job.json, of its payload's rename, of
    #: its birth marker's rename out of the payload
    written: dict[str, int] = field(default_factory=dict)
    published: dict[str, int] = field(default_factory=dict)
    registered: dict[str, int] = field(default_factory=dict)
    #: job id -> its payload's staging directory and its directory once published
    staged: dict[str, str] = field(default_factory=dict)
    final: dict[str, str] = field(default_factory=dict)
    #: positions of each syncfs; path -> positions of the fsyncs of that path
    syncfs: list[int] = field(default_factory=list)
    fsyncs: dict[str, list[int]] = field(default_factory=dict)


def _parse(lines: list[str]) -> Trace:
    t = Trace()
    fds: dict[int, str] = {}
    for line in lines:
        m = _CALL.match(line)
        if m is None:
            continue
        name, args, ret = m.group(1), m.group(2), int(m.group(3))
        at = len(t.calls)
        t.calls.append((name, args, ret))
        paths = re.findall(r'"([^"]*)"', args)
        if name == "openat" and ret >= 0 and paths:
            fds[ret] = paths[0]
            staged = _STAGED.search(paths[0])
            if staged and paths[0].endswith("/job.json") and "O_CREAT" in args:
                t.written[staged.group(1)] = at
        elif name == "rename" and len(paths) == 2:
            staged = _STAGED.search(paths[0])
            if staged:
                t.published[staged.group(1)] = at
                t.staged[staged.group(1)], t.final[staged.group(1)] = paths
            base = os.path.basename(paths[0])
            if base.startswith(".birth."):
                t.registered[base.split(".")[2]] = at
        elif name == "syncfs" and ret == 0:
            t.syncfs.append(at)
        elif name == "fsync" and ret == 0:
            fd = int(args.split(",")[0])
            t.fsyncs.setdefault(fds.get(fd, "?"), []).append(at)
    return t


def _submit_traced(tmp_path: Path, **env: str) -> tuple[Workspace, Trace]:
    if STRACE is None:
        if os.environ.get("CI") == "true":
            pytest.fail("strace is not installed (CI must have it)")
        pytest.skip("strace is not installed")
    root = str(tmp_path / "ws")
    Workspace.create(root, durable=True).close()
    log = tmp_path / "trace"
    calls = "openat,rename,fsync,syncfs"
    done = subprocess.run(
        [STRACE, "-qq", "-e", "signal=none", "-e", f"trace={calls}", "-o", str(log),
         sys.executable, "-m", "httk_flow", "--workspace", root,
         "submit", "--array", f"1-{JOBS}", "/bin/true"],
        capture_output=True, text=True, timeout=300, env={**os.environ, **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split()) == JOBS
    ws = Workspace.open(root)
    trace = _parse(log.read_text().splitlines())
    assert len(trace.written) == len(trace.published) == len(trace.registered) == JOBS
    return ws, trace


def _between(points: list[int], lo: int, hi: int) -> bool:
    return any(lo < p < hi for p in points)


def test_a_durable_batch_is_flushed_twice_by_syncfs_and_never_file_by_file(
    tmp_path: Path,
) -> None:
    ws, t = _submit_traced(tmp_path)
    end = len(t.calls)
    for job, wrote in t.written.items():
        # its payload whole on disk before it is published, its marker before return
        assert _between(t.syncfs, wrote, t.published[job]), job
        assert _between(t.syncfs, t.registered[job], end), job
    batches = -(-JOBS // BATCH)
    assert len(t.syncfs) == 2 * batches
    # what is left is per batch (the journal append, the batch record), not per job
    per_file = sum(len(v) for v in t.fsyncs.values())
    assert per_file <= 4 * batches + 8, sorted(t.fsyncs)
    assert not any(p.endswith("/job.json") for p in t.fsyncs)
    ws.close()


def test_without_syncfs_every_file_and_directory_is_fsynced_in_the_same_order(
    tmp_path: Path,
) -> None:
    ws, t = _submit_traced(tmp_path, HTTK_FLOW_NO_SYNCFS="1")
    assert t.syncfs == []
    end = len(t.calls)

    def synced(path: str, lo: int, hi: int) -> bool:
        return _between(t.fsyncs.get(path, []), lo, hi)

    for job, wrote in t.written.items():
        tmp, published = t.staged[job], t.published[job]
        # job.json and the payload's entry of its birth marker, before the payload moves
        assert synced(f"{tmp}/job.json", wrote, published), job
        assert synced(tmp, wrote, published), job
        # the birth marker's move out of the payload, before the submission returns
        assert synced(t.final[job], t.registered[job], end), job
    # and the state directories the markers went to
    last = max(t.registered.values())
    assert any(_between(v, last, end) for p, v in t.fsyncs.items() if "/state/submitted" in p)
    ws.close()
