"""Submission: payload assembled in .flow/tmp and published by rename, then the marker.

A crash at any point leaves either a whole job (payload, frame, marker) or nothing a
reader counts as a job: the marker is created last, and only ever once.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import orjson

from httk_flow.errors import UsageError
from httk_flow.protocol import layout, names
from httk_flow.protocol.after import After, DependencySets
from httk_flow.protocol.bundles import DEFAULT_BUNDLE_MAX
from httk_flow.protocol.crash import crash_point
from httk_flow.protocol.frames import Body, Frame, Snapshot
from httk_flow.protocol.fsio import GroupSync, fs, fsync_dir, write_file
from httk_flow.protocol.groups import GroupRegistry
from httk_flow.protocol.inputs import DEFAULT_INPUT_MAX, check_inputs, copy_inputs
from httk_flow.protocol.jobspec import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETRIES,
    MAX_LIMIT_FACTOR,
    MAX_SECONDS,
    JobSpec,
    ParamValue,
    ParentRef,
    Program,
    WorkdirMode,
    check_params,
    duration_words,
)
from httk_flow.protocol.names import BIRTH_PREFIX, Marker
from httk_flow.protocol.programs import ProgramStore
from httk_flow.protocol.resources import DEFAULT_REQUEST, Request
from httk_flow.protocol.services import ServiceClass, ServiceRegistry
from httk_flow.protocol.staging import staging_name
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace

#: jobs published per journal write and marker burst
BATCH = 512


@dataclass
class SubmitRequest:
    """What a user (or a parent's outcome) asks for; validated into a JobSpec."""

    program: str | Program
    args: list[str] = field(default_factory=list)
    #: a directory stored with the program, which runs inside the copy (--bundle)
    bundle: str | None = None
    #: the most bytes the bundle may hold (--bundle-max)
    bundle_max: int = DEFAULT_BUNDLE_MAX
    #: run the program where it is, its digest checked before each launch (--in-place)
    in_place: bool = False
    name: str = ""
    tag: str | None = None
    step: str = "main"
    params: dict[str, ParamValue] = field(default_factory=dict)
    priority: int = names.DEFAULT_PRIORITY
    placement: str | None = None
    pool: str | None = None
    requires: list[str] = field(default_factory=list)
    #: what each attempt holds while it runs (checked when built: Request.build)
    resources: Request = DEFAULT_REQUEST
    time: float | None = None
    #: seconds an attempt may run before it is stopped (None: no limit)
    time_limit: float | None = None
    #: the limit (and `time`) grows by this after each attempt stopped at its limit
    time_limit_factor: float = 1.0
    retries: int = DEFAULT_RETRIES
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    workdir: WorkdirMode = "persistent"
    require_outcome: bool = False
    inputs: list[str] = field(default_factory=list)
    #: the most bytes the inputs may copy into the job (--input-max)
    input_max: int = DEFAULT_INPUT_MAX
    array_index: int | None = None
    parent: ParentRef | None = None
    job_id: str | None = None
    #: where the request came from (FILE:LINE), named in its errors
    origin: str | None = None
    #: the dependency sets it waits for (made before submission: ops/depend.py)
    after: tuple[After, ...] = ()
    #: the job's group (its digest goes into every marker); None: none
    group: str | None = None
    #: registration moves the job to paused instead of ready
    hold: bool = False

    def but(self, **changes: object) -> SubmitRequest:
        """A copy with `changes` (bulk submission makes one per job: a shallow copy of
        the fields, not the field-by-field rebuild of dataclasses.replace)."""
        new = object.__new__(SubmitRequest)
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        return new

    def shape(self) -> dict[str, object]:
        """The fields array members share, all but the index and the id, copied (a list
        or dict changed after validation must not compare equal to what was validated)."""
        d = dict(self.__dict__)
        d["args"], d["requires"], d["inputs"] = (tuple(self.args), tuple(self.requires),
                                                 tuple(self.inputs))  # fmt: skip
        d["params"] = dict(self.params)
        del d["array_index"], d["job_id"]
        return d


@dataclass(frozen=True)
class _Checked:
    """What the last fully validated request resolved to: a request of the same shape
    (an array member, a batch line like the last) differs only in its index and id."""

    shape: dict[str, object]
    program: Program
    params: dict[str, ParamValue]
    placement: str | None


class Submitter:
    """Publishes jobs into one workspace, in batches."""

    def __init__(self, ws: Workspace, *, actor: str = "submit") -> None:
        self.ws = ws
        self.actor = actor
        self.store = ProgramStore(ws)
        self.services = ServiceRegistry(ws)
        self.groups = GroupRegistry(ws)
        #: job.json bytes of built specs, written at publication (serialized once)
        self._raw: dict[str, bytes] = {}
        #: the last request validated in full and whose job.json was parsed back: array
        #: members differ from it only in their index and id, which cannot make a request
        #: invalid nor job.json unreadable
        self._checked: _Checked | None = None
        #: ids of the last batch's jobs an idempotent publish found published already
        #: (a resumed bulk submission counts them as in before it)
        self.found: set[str] = set()
        #: the last service class published and its id
        self._last_service: tuple[tuple[object, ...], str] | None = None
        #: users' placements found to be the workspace's own directories, none a job's
        self._placed: set[str] = set()

    def build(self, req: SubmitRequest) -> JobSpec:
        """Validate a request into a JobSpec (no file is written)."""
        try:
            return self._build(req)
        except UsageError as e:
            if req.origin is None:
                raise
            raise UsageError(e.render(), obj=req.origin, hint=None) from None

    def _build(self, req: SubmitRequest) -> JobSpec:
        shape = req.shape()
        checked = self._checked
        fresh = checked is None or shape != checked.shape
        if fresh:
            checked = self._validate(req, shape)
        assert checked is not None
        job_id = req.job_id or names.new_id()
        spec = JobSpec(
            id=job_id,
            key=names.make_key(job_id, req.tag),
            tag=req.tag,
            name=req.name,
            program=checked.program,
            args=tuple(req.args),
            step=req.step,
            params=dict(checked.params),
            priority=req.priority,
            placement=checked.placement or names.default_placement(job_id),
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
            time_limit=req.time_limit,
            time_limit_factor=float(req.time_limit_factor),
            resources=req.resources,
            after=req.after,
            group=req.group,
            hold=req.hold,
        )
        try:
            raw = spec.to_json()
        except orjson.JSONEncodeError as e:
            raise UsageError(
                f"cannot be written as job.json ({e})", obj=f"job {spec.key}"
            ) from None
        if fresh:
            # what submit accepts, register must accept: refuse now what job.json refuses
            self._checked = None
            JobSpec.from_json(raw, f"job {spec.key}")
            self._checked = checked
        if len(self._raw) > 4 * BATCH:
            self._raw.clear()  # built but never published (validation passes)
        self._raw[spec.id] = raw
        return spec

    def _validate(self, req: SubmitRequest, shape: dict[str, object]) -> _Checked:
        """Every check of a request but those of its id; what they resolved to."""
        program = (
            req.program
            if isinstance(req.program, Program)
            else self.store.resolve(
                req.program, bundle=req.bundle, bundle_max=req.bundle_max, in_place=req.in_place
            )
        )
        if req.tag is not None:
            names.check_tag(req.tag)
        if req.group is not None:
            self.groups.check(req.group)  # a digest collision is refused before anything
        names.check_ident(req.step, "step name")
        names.check_priority(req.priority)
        if req.pool is not None:
            names.check_label(req.pool, "pool")
        for cap in req.requires:
            names.check_label(cap, "capability")
        if not 0 <= req.retries <= 1000:
            raise UsageError("must be from 0 to 1000", obj=f"--retries {req.retries}")
        if not 1 <= req.max_attempts <= 100_000:
            raise UsageError("must be from 1 to 100000", obj=f"--max-attempts {req.max_attempts}")
        _check_times(req)
        if req.inputs:
            check_inputs(req.inputs, req.input_max)
        try:
            params = check_params(req.params)
        except Exception as e:  # _Bad carries the sentence
            raise UsageError(str(e), obj="params") from None
        if not req.placement:
            placement = None  # each job's own, from its id
        elif req.parent is None:
            placement = names.check_parent_placement(req.placement)
            if placement not in self._placed:
                self.ws.check_room(placement, f"placement {req.placement!r}")
                if len(self._placed) >= 4096:
                    self._placed.clear()  # a bulk submission of many placements
                self._placed.add(placement)
        else:
            placement = names.check_placement(req.placement)
        return _Checked(shape, program, params, placement)

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
        yield from self.publish(
            ((self.build(req), req) for req in requests), progress=progress, idempotent=idempotent
        )

    def publish(
        self,
        built: Iterable[tuple[JobSpec, SubmitRequest]],
        *,
        progress: Callable[[int], None] | None = None,
        idempotent: bool = False,
    ) -> Iterator[JobSpec]:
        """Publish requests already built into specs, in batches (see submit)."""
        batch: list[tuple[JobSpec, SubmitRequest]] = []
        for pair in built:
            batch.append(pair)
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
        """Payloads, then one journal write, then each marker born inside its payload and
        moved out by one rename (protocol.md §6): a registrant that wakes from a freeze,
        or two that race, can never give one job two markers."""
        ws = self.ws
        # durable: nothing is synced file by file; the batch is flushed in two group
        # commits, its payloads before any is published and its markers before return
        sync = GroupSync(ws.root) if ws.policy.durable else None
        staged: list[tuple[JobSpec, str, str | None]] = []  # (spec, its dir, tmp or None)
        self.found = set()
        try:
            for spec, req in batch:
                final = ws.job_dir(spec.placement, spec.key)
                if idempotent and fs.exists(final):
                    self.found.add(spec.id)
                    staged.append((spec, final, None))  # completed below: no payload
                    continue
                staged.append((spec, final, self._stage(spec, req, sync)))
            self._list_dependents(s for s, _, tmp in staged if tmp is not None)
            frames = [_submission_frame(s, self.actor) for s, _, tmp in staged if tmp is not None]
            refs = iter(ws.writer.append_many(frames) if frames else [])
            crash_point("submit.after_journal")
            # (spec, its dir, tmp payload, its birth marker's name; None: look in the dir)
            births: list[tuple[JobSpec, str, str | None, str | None]] = []
            for spec, final, tmp in staged:
                born = None
                if tmp is not None:
                    marker = Marker(
                        spec.key, spec.priority, 0, next(refs),
                        service=self._service(spec), group_digest=self._group(spec),
                    )  # fmt: skip
                    born = BIRTH_PREFIX + marker.name
                    write_file(f"{tmp}/{born}", b"", durable=False)
                    if sync is not None:
                        sync.dir(tmp)
                births.append((spec, final, tmp, born))
            if sync is not None:
                sync.flush()  # every payload whole on disk before any is published
            for i, (spec, final, tmp, _born) in enumerate(births):
                if tmp is not None:
                    parent = os.path.dirname(final)
                    ws.ensure_dir(parent)
                    try:
                        fs.rename(tmp, final)
                    except OSError:
                        if not idempotent or not fs.exists(final):
                            raise
                        shutil.rmtree(tmp, ignore_errors=True)  # another registrant's won
                        births[i] = (spec, final, tmp, None)  # its birth marker is not ours
                    if sync is not None:
                        sync.dir(parent)
                    crash_point("submit.after_payload")
        except BaseException:
            for _, _, tmp in staged:
                if tmp is not None and os.path.isdir(tmp):
                    shutil.rmtree(tmp, ignore_errors=True)
            raise
        for spec, final, _, born in births:
            moved = move_birth(ws, spec.placement, spec.key, born, job_dir=final, sync=sync)
            if moved is not None and sync is not None:
                sync.dir(moved)
        if sync is not None:
            sync.flush()  # the whole batch registered on disk before it is reported
        yield from (s for s, _ in batch)

    def _service(self, spec: JobSpec) -> str:
        """The job's service class id, published once per class (the last one is kept:
        a batch's jobs mostly share theirs)."""
        key = (spec.pool, spec.requires, spec.resources)
        if self._last_service is None or self._last_service[0] != key:
            sid = self.services.publish(ServiceClass(spec.pool, spec.requires, spec.resources))
            self._last_service = (key, sid)
        return self._last_service[1]

    def _group(self, spec: JobSpec) -> str:
        # the registry names the group before any marker carries its digest
        return self.groups.publish(spec.group, by=self.actor) if spec.group else ""

    def _list_dependents(self, specs: Iterable[JobSpec]) -> None:
        """Each set lists its dependents before they are published (one append per set and
        batch), so whoever decides the set finds every one of them (protocol.md §14)."""
        by_set: dict[str, list[tuple[str, str]]] = {}
        for spec in specs:
            for a in spec.after:
                by_set.setdefault(a.set, []).append((spec.key, spec.placement))
        if by_set:
            sets = DependencySets(self.ws)
            for set_id, jobs in by_set.items():
                sets.add_dependents(set_id, jobs)

    def _stage(self, spec: JobSpec, req: SubmitRequest, sync: GroupSync | None) -> str:
        """The job's payload assembled under .flow/tmp (a name of its own: a submitter
        killed mid-payload leaves its tmp behind for a replay to meet)."""
        tmp = f"{self.ws.tmp}/{staging_name(spec.id)}"
        os.mkdir(tmp)
        try:
            raw = self._raw.pop(spec.id, None) or spec.to_json()
            job_file = layout.job_file(tmp)
            write_file(job_file, raw, durable=False)
            if sync is not None:
                sync.file(job_file)
            if req.inputs:
                files = layout.files_dir(tmp)
                copy_inputs(req.inputs, files, req.input_max)
                if sync is not None:
                    sync.tree(files)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return tmp


def move_birth(
    ws: Workspace,
    placement: str,
    key: str,
    born: str | None = None,
    *,
    job_dir: str | None = None,
    sync: GroupSync | None = None,
) -> str | None:
    """Move the job's birth marker (if still in its payload) into submitted/; returns the
    state directory it went to. `born`: its name when the caller made the payload (no
    listing needed); None: whoever made it, one listing finds it. No birth marker: the job
    is published already. Only one rename of the birth marker succeeds, so a job completed
    twice (a bulk submission resumed, `flow fsck --repair`) keeps one marker. `sync`: the
    batch's group commit, which then makes it durable (else a durable workspace's fsync)."""
    job_dir = job_dir or ws.job_dir(placement, key)
    born = born or _birth_marker(job_dir)
    if born is None:
        return None
    d = ws.state_dir(State.SUBMITTED, placement)
    src, dst = f"{job_dir}/{born}", f"{d}/{born[len(BIRTH_PREFIX) :]}"
    ws.ensure_dir(d)
    try:
        fs.rename(src, dst)
    except FileNotFoundError:
        if os.path.isdir(d):
            return None  # another registrant moved it out first: still one marker
        ws.forget_dir(d)  # the state directory was retired meanwhile: make it again
        ws.ensure_dir(d)
        try:
            fs.rename(src, dst)
        except FileNotFoundError:
            return None
    if sync is not None:
        sync.dir(job_dir)
    elif ws.policy.durable:
        fsync_dir(job_dir)
    return d


def _check_times(req: SubmitRequest) -> None:
    """The time request, the limit and its factor, as `flow submit` names them."""
    for what, v in (("--time", req.time), ("--time-limit", req.time_limit)):
        if v is not None and not 0 < v < MAX_SECONDS:
            raise UsageError("must be a positive duration of less than ten years", obj=what)
    f = req.time_limit_factor
    if not 1 <= f <= MAX_LIMIT_FACTOR:  # also NaN
        raise UsageError(
            f"must be a number from 1 to {MAX_LIMIT_FACTOR:g}",
            obj=f"--time-limit-factor {f}",
            hint="1 keeps the limit; 2 doubles it after each attempt stopped at it",
        )
    if f != 1 and req.time_limit is None:
        raise UsageError(
            "grows a time limit, and the job has none",
            obj=f"--time-limit-factor {f:g}",
            hint="give --time-limit too",
        )
    if req.time_limit is not None and req.time is not None and req.time_limit < req.time:
        raise UsageError(
            f"is shorter than the time request --time {duration_words(req.time)}: the job "
            "would be stopped before it is expected to finish",
            obj=f"--time-limit {duration_words(req.time_limit)}",
            hint="give a limit of at least the request (the request is what a manager fits "
            "into its remaining time; the limit is when the attempt is stopped)",
        )


def _birth_marker(job_dir: str) -> str | None:
    """The name of the birth marker inside a payload, if it has not been moved out yet."""
    try:
        names = [e.name for e in fs.scandir(job_dir)]
    except FileNotFoundError:
        return None
    return next((n for n in names if n.startswith(BIRTH_PREFIX)), None)


def _submission_frame(s: JobSpec, actor: str) -> dict[str, object]:
    return Frame(
        job=s.id,
        key=s.key,
        placement=s.placement,
        source=None,
        to=State.SUBMITTED,
        gen=0,
        prev=None,
        t=s.created,
        by=actor,
        body=Body(Snapshot(step=s.step)),
    ).to_json()
