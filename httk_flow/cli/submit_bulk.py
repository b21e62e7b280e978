"""`flow submit --from` / `--array`: a resumable batch, its Ctrl-C, and its output.

The first SIGINT or SIGTERM lets the publish batch in flight finish, then stops with one
line saying how far it got and how to finish; a second one stops at once (what it leaves
is completed by the next run or `flow fsck --repair`).
"""

from __future__ import annotations

import dataclasses
import signal
import sys
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from types import FrameType
from typing import IO, Any

from httk_flow.cli.app import App
from httk_flow.errors import UsageError
from httk_flow.ops.batch import BatchPlan, BulkResult, plan_array, plan_jsonl, run_batch
from httk_flow.ops.depend import BatchSets
from httk_flow.protocol.jobspec import JobSpec
from httk_flow.protocol.submit import SubmitRequest, Submitter

#: past this many jobs a terminal gets a summary line instead of every id
SHOW_IDS = 20
#: past this many jobs a terminal gets a progress bar
BAR_FROM = 1000
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupts:
    """SIGINT/SIGTERM while it is installed: before `defer()`, stop at once
    (KeyboardInterrupt); after, the first is only noted (`signum`), a second stops at once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._deferring = False
        self._old: dict[int, Any] = {}

    def __enter__(self) -> Interrupts:
        try:
            for s in _SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        except ValueError:
            pass  # not the main thread (embedded): the default handling stays
        return self

    def __exit__(self, *exc: object) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)

    def defer(self) -> None:
        self._deferring = True

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or signal.SIGINT)  # as the shell reports a signal

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        first = self.signum is None
        if first:
            self.signum = signum
        if not (first and self._deferring):
            raise KeyboardInterrupt


def submit_bulk(
    app: App,
    submitter: Submitter,
    base: SubmitRequest,
    *,
    from_file: str | None,
    array: str | None,
    batch_id: str | None,
    as_json: bool,
    group: str | None = None,
) -> None:
    """Plan the batch (every line validated, nothing published), then publish what of it
    is not in yet; render the outcome, or the interruption (exit 128 + the signal)."""
    with ExitStack() as stack:
        intr = stack.enter_context(Interrupts())
        try:
            plan, lines_after = _plan(stack, submitter, base, from_file, array, batch_id)
            if base.after or lines_after:
                plan = _with_sets(plan, BatchSets(app.ws, plan.key, actor="submit"))
            # a batch is one group: named after the batch unless --group names it, so a
            # re-run that completes it adds to the same group
            group = group or plan.key
            plan = _in_group(plan, group)
        except KeyboardInterrupt:
            app.echo("flow: interrupted before any job was submitted", err=True)
            raise SystemExit(intr.exit_code) from None
        intr.defer()
        jobs: list[dict[str, str]] = []
        result = _publish(app, submitter, plan, jobs.append, stop=lambda: intr.signum is not None)
    if as_json:
        app.json(
            {
                "jobs": jobs,
                "group": group,
                "batch": result.batch,
                "already": result.already,
                "submitted": result.submitted,
                "complete": result.complete,
            }
        )
    if not result.complete:
        again = " again" if result.aborted else ""
        app.echo(
            f"flow: interrupted{again}: {result.done:,} of {result.total:,} jobs submitted "
            f"(batch {result.batch}); run the same command again to submit the rest",
            err=True,
        )
        if jobs and not as_json and not app.is_terminal:
            app.echo("\n".join(j["id"] for j in jobs))  # a pipe still gets what went in
        raise SystemExit(intr.exit_code)
    if as_json:
        return
    if result.already:
        app.echo(_resumed(result, plan), err=True)
    if len(jobs) > SHOW_IDS and app.is_terminal:
        app.echo(
            f"submitted {len(jobs):,} jobs to {app.ws.root} as group {group}; see them with "
            f"`flow status --group {group}`"
        )
    elif jobs:
        app.echo("\n".join(j["id"] for j in jobs))
        if app.is_terminal:
            app.echo(f"group {group}")  # ids alone when captured


def _in_group(plan: BatchPlan, group: str) -> BatchPlan:
    """Every job of the batch in `group`, but for lines that name their own."""
    make = plan.make
    return dataclasses.replace(plan, make=lambda: (r.but(group=r.group or group) for r in make()))


def _with_sets(plan: BatchPlan, sets: BatchSets) -> BatchPlan:
    """The plan's requests waiting for the batch's dependency sets instead of the
    placeholders its digest was taken over (--after, a line's `after`). Every set is made
    before the first job is published, so a selector that names no job submits nothing."""
    reals = {r.after: sets.real(r.after) for r in plan.make()}
    if not reals:
        return plan
    make = plan.make
    return dataclasses.replace(plan, make=lambda: (r.but(after=reals[r.after]) for r in make()))


def _resumed(result: BulkResult, plan: BatchPlan) -> str:
    """What a run of a batch found in already says."""
    if not result.submitted:
        again = "give another --batch-id" if plan.given else "give --batch-id"
        return (
            f"batch {result.batch}: all {result.total:,} jobs were submitted already; "
            f"nothing new ({again} to submit again)"
        )
    return (
        f"batch {result.batch}: {result.already:,} of {result.total:,} were in already; "
        f"{result.submitted:,} submitted now"
    )


def _plan(
    stack: ExitStack,
    submitter: Submitter,
    base: SubmitRequest,
    from_file: str | None,
    array: str | None,
    batch_id: str | None,
) -> tuple[BatchPlan, bool]:
    """The plan, and whether a line may name dependencies of its own (its text holds
    "after": a byte search, so a batch without any costs no second parse)."""
    if array is not None:
        return plan_array(submitter, base, array, batch_id), False
    assert from_file is not None
    read: Callable[[], Iterable[bytes]]
    if from_file == "-":
        lines = sys.stdin.buffer.read().splitlines(keepends=True)
        read, where = (lambda: lines), "<stdin>"
    else:
        fh: IO[bytes] = stack.enter_context(_open(from_file))

        def read() -> Iterable[bytes]:
            fh.seek(0)
            return fh

        where = from_file
    plan = plan_jsonl(submitter, read, base, where, batch_id)
    return plan, any(b'"after"' in line for line in read())


def _publish(
    app: App,
    submitter: Submitter,
    plan: BatchPlan,
    add: Callable[[dict[str, str]], None],
    *,
    stop: Callable[[], bool],
) -> BulkResult:
    def on_job(spec: JobSpec) -> None:
        add({"id": spec.id, "key": spec.key, "placement": spec.placement})

    if plan.total > BAR_FROM and app.is_terminal:
        from rich.progress import Progress

        with Progress(console=app.console(stderr=True), transient=True) as bar:
            task = bar.add_task("submitting", total=plan.total)
            return run_batch(
                app.ws,
                submitter,
                plan,
                on_job=on_job,
                progress=lambda n: bar.advance(task, n),
                stop=stop,
            )
    return run_batch(app.ws, submitter, plan, on_job=on_job, stop=stop)


def _open(path: str) -> IO[bytes]:
    try:
        return open(path, "rb")
    except OSError as e:
        raise UsageError(f"cannot be read ({e.strerror})", obj=f"--from {path!r}") from e
