"""Resumable bulk submission: `flow submit --from` / `--array` as one batch.

A batch has an id (`--batch-id`, or `b-` and 12 hex digits of its digest) and a digest of
its input and of every option that shapes its jobs. Its jobs' ids derive from (batch,
index), its record says how far it got, and publishing is idempotent: an interrupted
batch is completed by running the same command again, and a complete one answers
"nothing new" from its record alone (docs/protocol.md §6).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from httk_flow.errors import UsageError
from httk_flow.ops.bulk import array_requests, jsonl_lines, jsonl_requests, parse_array
from httk_flow.protocol import staging
from httk_flow.protocol.batch import (
    batch_job_id,
    check_batch_id,
    new_record,
    read_record,
    write_record,
)
from httk_flow.protocol.jobspec import JobSpec, Program
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.workspace import Workspace

#: bumped when what the digest covers changes (an old batch then reads as another input)
_DIGEST_FORMAT = b"httk-flow/batch/1\n"
#: request fields that are not options shaping the jobs: the program is digested by what
#: it resolves to, the rest is per job or not the user's
_NOT_OPTIONS = frozenset({"program", "origin", "job_id", "array_index", "parent"})


@dataclass(frozen=True)
class BatchPlan:
    """A validated bulk submission, before anything is published."""

    key: str
    #: sha256 (hex) of the input and the options
    digest: str
    total: int
    #: the key came from --batch-id (else from the digest)
    given: bool
    #: the batch's requests in input order (each call starts again from the first)
    make: Callable[[], Iterator[SubmitRequest]]


def batch_key(digest: str, given: str | None = None) -> str:
    """The batch id: `given` (checked against the tag grammar) or `b-` + 12 hex digits of
    the digest. Known before publishing starts (a caller may name a group after it)."""
    return check_batch_id(given) if given is not None else "b-" + digest[:12]


def plan_jsonl(
    submitter: Submitter,
    read: Callable[[], Iterable[bytes]],
    base: SubmitRequest,
    where: str,
    given: str | None = None,
) -> BatchPlan:
    """Validate every line of a JSONL input (`read` yields its raw lines, from the start
    at every call) and digest its bytes, the options and each job's resolved program."""
    h = hashlib.sha256(_DIGEST_FORMAT + b"from\n" + _options(base))

    def hashed(lines: Iterable[bytes]) -> Iterator[bytes]:
        for raw in lines:
            h.update(len(raw).to_bytes(8, "little") + raw)
            yield raw

    total = 0
    bad: list[UsageError] = []  # the first BAD_LINES_SHOWN
    nbad = 0
    for item in jsonl_lines(hashed(read()), base, where):
        if not isinstance(item, UsageError):
            try:
                program = submitter.build(item).program
            except UsageError as e:
                item = e
        if isinstance(item, UsageError):
            nbad += 1
            if nbad <= BAD_LINES_SHOWN:
                bad.append(item)
            continue
        # a program named by path is digested by content: an edited script is a new batch
        h.update(b"\0" + _program_word(program))
        total += 1
    if nbad:
        raise _every_bad_line(where, bad, nbad)
    digest = h.hexdigest()
    return BatchPlan(
        batch_key(digest, given), digest, total, given is not None,
        lambda: jsonl_requests(read(), base, where),
    )  # fmt: skip


#: the bad lines of a --from file that its error lists (it counts them all)
BAD_LINES_SHOWN = 20


def _every_bad_line(where: str, shown: list[UsageError], count: int) -> UsageError:
    """One bad line's own error; for several, one error listing them (`shown`, the first
    of `count`), so that a file is fixed in one pass, not one run per line."""
    if count == 1:
        return shown[0]
    lines = "".join(f"\n  {e.render()}" for e in shown)
    if count > len(shown):
        lines += f"\n  ... and {count - len(shown):,} more"
    return UsageError(
        f"{count:,} lines are not valid jobs; nothing was submitted:{lines}", obj=where
    )


def plan_array(
    submitter: Submitter, base: SubmitRequest, spec: str, given: str | None = None
) -> BatchPlan:
    """Validate an --array submission (its members differ only in their index, so the
    first one stands for all) and digest the indices and the options."""
    indices = parse_array(spec)
    first = next(array_requests(base, indices))
    program = submitter.build(first).program
    shape = [[r.start, r.stop, r.step] for r in indices]
    h = hashlib.sha256(_DIGEST_FORMAT + b"array\n" + _options(base))
    h.update(orjson.dumps(shape) + b"\0" + _program_word(program))
    digest = h.hexdigest()
    return BatchPlan(
        batch_key(digest, given), digest, sum(len(r) for r in indices), given is not None,
        lambda: array_requests(base, indices),
    )  # fmt: skip


def _options(base: SubmitRequest) -> bytes:
    """Every option of the command line that shapes the jobs, canonically (a field a
    later version adds is covered without being named here)."""
    d = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    for k in _NOT_OPTIONS:
        d.pop(k, None)
    d["inputs"] = [os.path.abspath(p) for p in base.inputs]  # what they name, from here
    return orjson.dumps(d, option=orjson.OPT_SORT_KEYS, default=_plain) + b"\n"


def _plain(v: Any) -> Any:
    if isinstance(v, set | frozenset):
        return sorted(map(str, v))
    return repr(v)


def _program_word(p: Program) -> bytes:
    return orjson.dumps(p.to_json(), option=orjson.OPT_SORT_KEYS)


# -- publishing ----------------------------------------------------------------------


@dataclass(frozen=True)
class BulkResult:
    """What a run of a batch did. `already + submitted` jobs of `total` are in."""

    batch: str
    total: int
    #: jobs found in before this run (its record, or their payloads)
    already: int
    #: jobs this run published
    submitted: int
    complete: bool
    #: stopped inside a publish (a second interrupt): the counts are those before it,
    #: and what it left is completed by the next run or `flow fsck --repair`
    aborted: bool = False

    @property
    def done(self) -> int:
        return self.already + self.submitted


class _Stop(Exception):
    """Raised from the per-batch callback: the batch just published is whole."""


def run_batch(
    ws: Workspace,
    submitter: Submitter,
    plan: BatchPlan,
    *,
    on_job: Callable[[JobSpec], None],
    progress: Callable[[int], None] | None = None,
    stop: Callable[[], bool] = lambda: False,
) -> BulkResult:
    """Publish what of the batch is not in yet, 512 jobs at a time; `on_job` gets each job
    published now. `stop` is asked after each publish batch: true ends the run there.

    Raises UsageError when the batch id was used for another input or other options.
    """
    rec = read_record(ws, plan.key)
    if rec is not None and rec.digest != plan.digest:
        what = "this --batch-id" if plan.given else "this batch id"
        raise UsageError(
            f"was submitted from another input or with other options ({rec.total:,} jobs, "
            f"{_when(rec.created)}, by {rec.by or 'unknown'})",
            obj=f"batch {plan.key}",
            hint=f"give another --batch-id to submit this as a new batch; {what} is "
            "resumed only by the very command that started it",
        )
    if rec is not None and rec.complete:
        return BulkResult(plan.key, plan.total, plan.total, 0, True)  # O(1): no scan
    if rec is None:
        rec = new_record(plan.key, plan.digest, plan.total)
        write_record(ws, rec)
    else:
        # a kill -9 leaves staging directories its pid and host name as gone
        staging.sweep(ws.tmp, time.time())
    skip = min(rec.submitted, plan.total)
    counts = {"found": 0, "new": 0, "through": skip}

    def after_batch(n: int) -> None:
        counts["through"] += n
        write_record(ws, dataclasses.replace(rec, submitted=counts["through"]))
        if progress is not None:
            progress(n)
        if stop() and counts["through"] < plan.total:  # after the last one, nothing is left
            raise _Stop

    if progress is not None and skip:
        progress(skip)
    reqs = (
        req.but(job_id=batch_job_id(plan.key, i))
        for i, req in enumerate(itertools.islice(plan.make(), skip, None), skip)
    )
    aborted = stopped = False
    try:
        for spec in submitter.submit(reqs, progress=after_batch, idempotent=True):
            if spec.id in submitter.found:
                counts["found"] += 1
            else:
                counts["new"] += 1
                on_job(spec)
    except _Stop:
        stopped = True
    except KeyboardInterrupt:
        aborted = True  # inside a publish: only what the next run completes is left
    complete = not (stopped or aborted)
    if complete:
        write_record(ws, dataclasses.replace(rec, submitted=plan.total, complete=True))
    # jobs are counted once their batch is whole: an abort's partial one is the next run's
    return BulkResult(
        plan.key, plan.total, skip + counts["found"], counts["new"], complete, aborted
    )


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "at an unknown time"
