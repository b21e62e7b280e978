"""Submission: payload assembled in .flow/tmp and published by rename, then the marker.

A crash at any point leaves either a whole job (payload, frame, marker) or nothing a
reader counts as a job: the marker is created last, and only ever once.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import orjson

from httk_flow import names
from httk_flow.crash import crash_point
from httk_flow.errors import UsageError
from httk_flow.fsio import fs, fsync_dir, write_file
from httk_flow.jobspec import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETRIES,
    JobSpec,
    ParamValue,
    ParentRef,
    Program,
    WorkdirMode,
    check_params,
)
from httk_flow.names import Marker
from httk_flow.programs import ProgramStore
from httk_flow.services import ServiceClass, ServiceRegistry
from httk_flow.states import State
from httk_flow.transition import locate_key
from httk_flow.workspace import Workspace

#: jobs published per journal write and marker burst
BATCH = 512


@dataclass
class SubmitRequest:
    """What a user (or a parent's outcome) asks for; validated into a JobSpec."""

    program: str | Program
    args: list[str] = field(default_factory=list)
    name: str = ""
    tag: str | None = None
    step: str = "main"
    params: dict[str, ParamValue] = field(default_factory=dict)
    priority: int = names.DEFAULT_PRIORITY
    placement: str | None = None
    pool: str | None = None
    requires: list[str] = field(default_factory=list)
    time: float | None = None
    retries: int = DEFAULT_RETRIES
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    workdir: WorkdirMode = "persistent"
    require_outcome: bool = False
    inputs: list[str] = field(default_factory=list)
    array_index: int | None = None
    parent: ParentRef | None = None
    job_id: str | None = None
    #: where the request came from (FILE:LINE), named in its errors
    origin: str | None = None


class Submitter:
    """Publishes jobs into one workspace, in batches."""

    def __init__(self, ws: Workspace, *, actor: str = "submit") -> None:
        self.ws = ws
        self.actor = actor
        self.store = ProgramStore(ws)
        self.services = ServiceRegistry(ws)
        #: job.json bytes of built specs, written at publication (serialized once)
        self._raw: dict[str, bytes] = {}
        #: the last request whose job.json was parsed back: array members differ from it
        #: only in their index and id, which cannot make job.json unreadable
        self._checked: SubmitRequest | None = None

    def build(self, req: SubmitRequest) -> JobSpec:
        """Validate a request into a JobSpec (no file is written)."""
        try:
            return self._build(req)
        except UsageError as e:
            if req.origin is None:
                raise
            raise UsageError(e.render(), obj=req.origin, hint=None) from None

    def _build(self, req: SubmitRequest) -> JobSpec:
        program = (
            req.program if isinstance(req.program, Program) else self.store.resolve(req.program)
        )
        if req.tag is not None:
            names.check_tag(req.tag)
        names.check_ident(req.step, "step name")
        names.check_priority(req.priority)
        if req.pool is not None:
            names.check_label(req.pool, "pool")
        for cap in req.requires:
            names.check_label(cap, "capability")
        if req.retries < 0 or req.max_attempts < 1:
            raise UsageError("retries must be >= 0 and max attempts >= 1", obj="--retries")
        if req.time is not None and not 0 < req.time < math.inf:
            raise UsageError("must be a positive number of seconds", obj="--time")
        seen: set[str] = set()
        for p in req.inputs:
            if not os.path.exists(p):
                raise UsageError("does not exist", obj=f"input {p!r}")
            # every input lands in files/<its name>: two of one name would overwrite each other
            base = os.path.basename(os.path.normpath(p))
            if base in seen or base in ("", ".", ".."):
                raise UsageError(
                    f"would be copied to files/{base}, which another input already takes"
                    if base in seen
                    else "has no file name to copy it under",
                    obj=f"input {p!r}",
                    hint="rename it or put the inputs in one directory",
                )
            seen.add(base)
        try:
            params = check_params(req.params)
        except Exception as e:  # _Bad carries the sentence
            raise UsageError(str(e), obj="params") from None
        job_id = req.job_id or names.new_id()
        placement = (
            names.check_placement(req.placement)
            if req.placement
            else names.default_placement(job_id)
        )
        spec = JobSpec(
            id=job_id,
            key=names.make_key(job_id, req.tag),
            tag=req.tag,
            name=req.name,
            program=program,
            args=tuple(req.args),
            step=req.step,
            params=params,
            priority=req.priority,
            placement=placement,
            pool=req.pool,
            requires=tuple(req.requires),
            time=req.time,
            retries=req.retries,
            max_attempts=req.max_attempts,
            workdir=req.workdir,
            require_outcome=req.require_outcome,
            parent=req.parent,
            array_index=req.array_index,
            created=round(time.time(), 3),
        )
        try:
            raw = spec.to_json()
        except orjson.JSONEncodeError as e:
            raise UsageError(
                f"cannot be written as job.json ({e})", obj=f"job {spec.key}"
            ) from None
        # what submit accepts, register must accept: refuse now what job.json refuses later
        same = dataclasses.replace(req, array_index=None, job_id=None)
        if same != self._checked:
            JobSpec.from_json(raw, f"job {spec.key}")
            self._checked = same
        if len(self._raw) > 4 * BATCH:
            self._raw.clear()  # built but never published (validation passes)
        self._raw[spec.id] = raw
        return spec

    def submit(
        self,
        requests: Iterable[SubmitRequest],
        *,
        progress: Callable[[int], None] | None = None,
        idempotent: bool = False,
    ) -> Iterator[JobSpec]:
        """Publish every request; yields each JobSpec once its marker exists.

        With `idempotent`, a job whose payload or marker already exists (a replayed
        commit registering children) is completed rather than duplicated.
        """
        batch: list[tuple[JobSpec, SubmitRequest]] = []
        for req in requests:
            batch.append((self.build(req), req))
            if len(batch) >= BATCH:
                yield from self._publish(batch, idempotent)
                if progress:
                    progress(len(batch))
                batch = []
        if batch:
            yield from self._publish(batch, idempotent)
            if progress:
                progress(len(batch))

    def _publish(
        self, batch: list[tuple[JobSpec, SubmitRequest]], idempotent: bool
    ) -> Iterator[JobSpec]:
        ws, durable = self.ws, self.ws.policy.durable
        fresh: list[JobSpec] = []
        sync_dirs: set[str] = set()
        for spec, req in batch:
            final = ws.job_dir(spec.placement, spec.key)
            if idempotent and fs.exists(final):
                if locate_key(ws, spec.placement, spec.key) is None:
                    fresh.append(spec)
                continue
            # unique: a submitter killed mid-payload leaves its tmp behind for a replay to meet
            tmp = os.path.join(ws.tmp, f"job-{spec.id}.{os.urandom(4).hex()}")
            os.mkdir(tmp)
            try:
                raw = self._raw.pop(spec.id, None) or spec.to_json()
                write_file(os.path.join(tmp, "job.json"), raw, durable=durable)
                if req.inputs:
                    _copy_inputs(req.inputs, os.path.join(tmp, "files"))
                if durable:
                    fsync_dir(tmp)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            parent = os.path.dirname(final)
            ws.ensure_dir(parent)
            try:
                fs.rename(tmp, final)
            except OSError:
                if not idempotent or not fs.exists(final):
                    shutil.rmtree(tmp, ignore_errors=True)
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
            sync_dirs.add(parent)
            crash_point("submit.after_payload")
            fresh.append(spec)
        if durable:
            for d in sync_dirs:
                fsync_dir(d)
        frames = [
            {
                "job": s.id,
                "key": s.key,
                "placement": s.placement,
                "to": State.SUBMITTED.value,
                "gen": 0,
                "prev": None,
                "t": s.created,
                "by": self.actor,
                "step": s.step,
                "act": 1,
                "try": 0,
                "tries": 0,
            }
            for s in fresh
        ]
        refs = ws.writer.append_many(frames) if frames else []
        crash_point("submit.after_journal")
        marker_dirs: set[str] = set()
        for spec, ref in zip(fresh, refs, strict=True):
            service = self.services.publish(ServiceClass(spec.pool, spec.requires))
            marker = Marker(spec.key, spec.priority, 0, ref, service=service)
            d = ws.state_dir(State.SUBMITTED, spec.placement)
            ws.ensure_dir(d)
            write_file(os.path.join(d, marker.name), b"", durable=False)
            marker_dirs.add(d)
        if durable:
            for d in marker_dirs:
                fsync_dir(d)
        yield from (s for s, _ in batch)


def _copy_inputs(inputs: list[str], dest: str) -> None:
    os.mkdir(dest)
    for src in inputs:
        target = os.path.join(dest, os.path.basename(os.path.normpath(src)))
        if os.path.isdir(src):
            shutil.copytree(src, target, symlinks=True)
        else:
            shutil.copy2(src, target)
