"""An attempt's output files, read once or followed until the attempt ends."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import BinaryIO

from httk_flow.errors import UsageError
from httk_flow.ops.gc import DAY
from httk_flow.ops.lookup import view
from httk_flow.protocol import layout
from httk_flow.protocol.jobs import find_attempt_dir
from httk_flow.protocol.logstream import Streamed, read_record
from httk_flow.protocol.transition import JobHandle, locate_key
from httk_flow.protocol.workspace import Workspace


def attempt_dir(ws: Workspace, job: JobHandle, attempt: int | None) -> str:
    return _chosen(ws, job, attempt)[0]


def _chosen(ws: Workspace, job: JobHandle, attempt: int | None) -> tuple[str, int, bool]:
    """The attempt's directory and number, and whether `flow gc` may have collected it (an
    earlier attempt that ended longer ago than the workspace keeps attempts)."""
    adir, n, collectable, _ = _attempt(ws, job, attempt)
    return adir, n, collectable


def _attempt(ws: Workspace, job: JobHandle, attempt: int | None) -> tuple[str, int, bool, Streamed]:
    """_chosen, and where its commit streamed its output (policy `logs: stream`)."""
    attempts = view(ws, job).attempts
    if not attempts:
        raise UsageError("has not run yet", obj=f"job {job.key}", hint="see `flow show`")
    if attempt is None:
        chosen = attempts[-1]
    else:
        match = [a for a in attempts if a.record.n == attempt]
        if not match:
            raise UsageError(
                f"has no attempt {attempt} (it has 1-{len(attempts)})", obj=f"job {job.key}"
            )
        chosen = match[0]
    n = chosen.record.n
    horizon = time.time() - ws.policy.keep_attempts_days * DAY
    collectable = chosen is not attempts[-1] and (chosen.ended or 0.0) <= horizon
    # derived from the number, never taken from the frame: a frame cannot point us elsewhere
    adir = find_attempt_dir(ws.job_dir(job.placement, job.key), n)
    return adir, n, collectable, chosen.logs or ()


def first_attempt(
    ws: Workspace, job: JobHandle, *, interval: float = 0.3, on_wait: Callable[[], None]
) -> JobHandle:
    """Wait until the job has started an attempt (as `tail -F` waits for its file), and
    return where it is then; `on_wait` is called once, if it has to wait. A job that ends
    without ever running is an error."""
    waited = False
    while True:
        now = locate_key(ws, job.placement, job.key) or job
        if view(ws, now).attempts:
            return now
        if now.state.is_terminal:
            raise UsageError(
                f"ended {now.state.value} without running",
                obj=f"job {job.key}",
                hint="see `flow show`",
            )
        if not waited:
            on_wait()
            waited = True
        time.sleep(interval)


def read_log(
    ws: Workspace,
    job: JobHandle,
    *,
    stderr: bool = False,
    attempt: int | None = None,
    follow: bool = False,
    interval: float = 0.3,
    on_wait: Callable[[], None] = lambda: None,
) -> Iterator[bytes]:
    """Chunks of the attempt's stdout (or stderr); with follow, until the job leaves it
    (and, for a job that has not started, from its first attempt on)."""
    if follow and attempt is None:
        job = first_attempt(ws, job, interval=interval, on_wait=on_wait)
    adir, n, collectable, streamed = _attempt(ws, job, attempt)
    path = layout.stderr_file(adir) if stderr else layout.stdout_file(adir)
    # a tidied attempt's output lives beside job.json (protocol.md §10, Tidying)
    kept = layout.kept_output(ws.job_dir(job.placement, job.key), n, os.path.basename(path))
    while follow and not os.path.exists(path):
        # claimed, its directory made, the launcher not yet run: its files come next
        now = locate_key(ws, job.placement, job.key)
        if now is None or not now.state.is_active:
            break
        time.sleep(min(interval, 0.05))
    fh = _open_first(path, kept)
    if fh is None:
        name = os.path.basename(path)
        ref = next((r for s, r in streamed if s == name), None)
        if ref is not None:
            # its commit appended it to a log segment; the record names the job and attempt
            data = read_record(ws.root, ref, job.job_id, n, name)
            if data is None:
                raise UsageError(
                    f"has no readable {name} any more: the log record its commit wrote is "
                    "gone or damaged",
                    obj=f"attempt {layout.attempt_name(n)} of job {job.key}",
                    hint=f"`flow show {job.key}` still tells how it ended",
                )
            yield data
            return
        if os.path.isdir(adir) or not collectable:
            # it wrote nothing there (its commit removes an empty file, and then the
            # attempt's directory if nothing else was left in it)
            return
        said = "collected by `flow gc`"
        if not ws.policy.keep_attempt_files:
            said = f"it printed nothing, or they were {said}"
        raise UsageError(
            f"has no files any more ({said})",
            obj=f"attempt {os.path.basename(os.path.dirname(path))} of job {job.key}",
        )
    with fh:
        while True:
            chunk = fh.read(65536)
            if chunk:
                yield chunk
                continue
            if not follow:
                return
            now = locate_key(ws, job.placement, job.key)
            if now is None or not now.state.is_active:
                rest = fh.read()
                if rest:
                    yield rest
                return
            time.sleep(interval)


def _open_first(*paths: str) -> BinaryIO | None:
    """The first of `paths` that opens: the attempt's own file, or where tidying moved it
    (its commit may move it between two looks, never away from both)."""
    for path in paths:
        try:
            return open(path, "rb")
        except FileNotFoundError:
            continue
    return None
