"""Bulk submission records and the job ids of a batch (docs/protocol.md §6).

A batch is one `flow submit --from` or `--array`: a batch id, and the digest of its
input and options. Its jobs' ids are derived from (batch id, index), so a re-run
recreates the same ids and publishing them again completes rather than duplicates.
`.flow/batches/<batch>.json` says how far the batch got.
"""

from __future__ import annotations

import getpass
import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any

import orjson

from httk_flow.errors import FlowError, UsageError
from httk_flow.protocol import layout, names
from httk_flow.protocol.fsio import atomic_write
from httk_flow.protocol.workspace import Workspace

#: the namespace of batch job ids: uuid5(NS, "<batch id>/<index>") (protocol.md §6)
BATCH_NS = uuid.UUID("1e55e1f5-4c35-480d-a98f-ffdf168a26c8")


def batch_job_id(batch: str, index: int) -> str:
    """The id of job `index` (0-based, in input order) of batch `batch`."""
    return uuid.uuid5(BATCH_NS, f"{batch}/{index}").hex


def check_batch_id(key: str) -> str:
    """A batch id is of the tag grammar (protocol.md §2)."""
    if not names.TAG_RE.fullmatch(key):
        raise UsageError(
            "a batch id is 1-64 characters of letters, digits, '_', '+' and '-', "
            "starting with a letter or digit",
            obj=f"--batch-id {key!r}",
        )
    return key


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """How far one batch got: written when it starts, after each published batch of
    jobs, and marked complete at the end."""

    batch: str
    #: sha256 (hex) of the batch's input and every option that shapes its jobs
    digest: str
    total: int
    #: jobs 0 .. submitted-1 are published (at least: a later one may be too)
    submitted: int = 0
    complete: bool = False
    created: float = 0.0
    by: str = ""

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "batch": self.batch,
                "digest": self.digest,
                "total": self.total,
                "submitted": self.submitted,
                "complete": self.complete,
                "created": self.created,
                "by": self.by,
            }
        )

    @staticmethod
    def from_json(raw: bytes, path: str) -> BatchRecord:
        """Parse a record; absent members read as their defaults (older writers)."""
        try:
            d: Any = orjson.loads(raw)
            rec = BatchRecord(
                batch=_typed(d["batch"], str),
                digest=_typed(d["digest"], str),
                total=_typed(d["total"], int),
                submitted=_typed(d.get("submitted", 0), int),
                complete=_typed(d.get("complete", False), bool),
                created=float(_typed(d.get("created", 0.0), (int, float))),
                by=_typed(d.get("by", ""), str),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise FlowError(
                f"is not a readable batch record ({e})",
                obj=path,
                hint="remove it to start the batch anew (its jobs already in are kept, and "
                "the same command completes them)",
            ) from None
        return rec


def _typed(v: Any, t: type | tuple[type, ...]) -> Any:
    # bool is an int: a count or a time must not be true/false, and a flag must be one
    if not isinstance(v, t) or (t is not bool and isinstance(v, bool)):
        raise TypeError(f"a member has the wrong type: {v!r}")
    return v


def read_record(ws: Workspace, batch: str) -> BatchRecord | None:
    """The record of `batch`, or None when the batch never started here."""
    path = layout.batch_file(ws.root, batch)
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        return None
    return BatchRecord.from_json(raw, path)


def write_record(ws: Workspace, rec: BatchRecord) -> None:
    """Publish the record (a temporary in .flow/tmp, then a rename over the old one)."""
    os.makedirs(layout.batches_dir(ws.root), exist_ok=True)
    atomic_write(
        layout.batch_file(ws.root, rec.batch),
        rec.to_json(),
        durable=ws.policy.durable,
        tmp_dir=ws.tmp,
    )


def new_record(batch: str, digest: str, total: int) -> BatchRecord:
    """The record of a batch that starts now, by this user on this host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return BatchRecord(
        batch=batch,
        digest=digest,
        total=total,
        created=round(time.time(), 3),
        by=f"{user}@{socket.gethostname()}",
    )
