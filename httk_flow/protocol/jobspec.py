"""job.json: the immutable definition of a job, parsed once into a frozen JobSpec."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from httk_flow.errors import FlowError, InvalidJob
from httk_flow.protocol import names
from httk_flow.protocol.after import After, afters_from_json
from httk_flow.protocol.resources import DEFAULT_REQUEST, Request

JOB_FORMAT = "httk-flow/job/1"
#: job.json larger than this is refused: a definition, not a data file
MAX_JOB_JSON = 1 << 20
MAX_ARGS = 4096
MAX_PARAMS = 1024
MAX_PARAM_VALUE = 64 * 1024
DEFAULT_RETRIES = 2
#: charged failures of a job over its whole life (across activations, until a resume)
DEFAULT_MAX_ATTEMPTS = 100
#: the longest time request or limit a job may give, and where a growing limit stops
MAX_SECONDS = 10 * 365 * 86400
#: the largest factor a time limit may grow by on each retry after it was reached
MAX_LIMIT_FACTOR = 100.0
ParamValue = str | int | float | bool
WorkdirMode = Literal["persistent", "isolated"]


@dataclass(frozen=True, slots=True)
class Program:
    """What an attempt executes (docs/protocol.md §7): a stored executable (`digest`), a
    command looked up on PATH, a file of a stored tree (`bundle`, `path` inside it), or a
    file run where it is (`in_place`: `path`, whose content must still have `digest`)."""

    digest: str | None = None
    command: str | None = None
    name: str = ""
    #: the absolute path the program was submitted from (None: not recorded)
    source: str | None = None
    #: the tree digest of a bundle: .flow/bundles/<bundle>/
    bundle: str | None = None
    #: in a bundle: the relative path inside it; in place: the absolute path
    path: str | None = None
    in_place: bool = False

    @property
    def stored(self) -> str | None:
        """The digest of its copy in the program store (None: it has none)."""
        return None if self.in_place or self.bundle else self.digest

    @property
    def ident(self) -> str:
        """One string naming what runs: equal for two jobs that run the same thing."""
        if self.bundle:
            return f"{self.bundle}/{self.path}"
        return self.digest or self.command or ""

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any]
        if self.bundle:
            d = {"bundle": self.bundle, "path": self.path or "", "name": self.name}
        elif self.in_place:
            d = {"path": self.path or "", "digest": self.digest, "in_place": True}
            d["name"] = self.name
        elif self.digest:
            d = {"digest": self.digest, "name": self.name}
        else:
            return {"command": self.command or ""}
        if self.source is not None:
            d["source"] = self.source
        return d


@dataclass(frozen=True, slots=True)
class ParentRef:
    """The job that spawned this one, and under which label in which activation."""

    id: str
    key: str
    placement: str
    activation: int
    label: str


@dataclass(frozen=True, slots=True)
class JobSpec:
    id: str
    key: str
    tag: str | None
    name: str
    program: Program
    args: tuple[str, ...]
    step: str
    params: dict[str, ParamValue]
    priority: int
    placement: str
    pool: str | None = None
    requires: tuple[str, ...] = ()
    time: float | None = None
    retries: int = DEFAULT_RETRIES
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    workdir: WorkdirMode = "persistent"
    require_outcome: bool = False
    parent: ParentRef | None = None
    array_index: int | None = None
    created: float = 0.0
    #: seconds an attempt may run before its process group is stopped (None: no limit)
    time_limit: float | None = None
    #: what the limit and the time request are multiplied by after each attempt of the
    #: activation that was stopped at its limit
    time_limit_factor: float = 1.0
    #: what each attempt holds while it runs (CPUs, GPUs, memory, site resources)
    resources: Request = DEFAULT_REQUEST
    #: the dependency sets it waits for before its first attempt (protocol.md §14)
    after: tuple[After, ...] = ()
    #: the job's group (its digest is in the marker); None: none
    group: str | None = None
    #: registration moves the job to paused, not ready (`flow submit --hold`)
    hold: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def time_limit_after(self, timeouts: int) -> float | None:
        """The limit of an attempt after `timeouts` attempts of its activation reached
        theirs (Snapshot.timeouts): time_limit × time_limit_factor ** timeouts."""
        return _grown(self.time_limit, self.time_limit_factor, timeouts)

    def time_request_after(self, timeouts: int) -> float | None:
        """The time request (`time`) a manager fits an attempt by, grown as the limit is."""
        return _grown(self.time, self.time_limit_factor, timeouts)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = dict(self.extra)
        d.update(
            format=JOB_FORMAT,
            id=self.id,
            key=self.key,
            tag=self.tag,
            name=self.name,
            program=self.program.to_json(),
            args=list(self.args),
            step=self.step,
            params=self.params,
            priority=self.priority,
            placement=self.placement,
            pool=self.pool,
            requires=list(self.requires),
            time=self.time,
            retries=self.retries,
            max_attempts=self.max_attempts,
            workdir=self.workdir,
            require_outcome=self.require_outcome,
            parent=None
            if self.parent is None
            else {
                "id": self.parent.id,
                "key": self.parent.key,
                "placement": self.parent.placement,
                "activation": self.parent.activation,
                "label": self.parent.label,
            },
            array_index=self.array_index,
            created=self.created,
        )
        if self.time_limit is not None:
            d.update(time_limit=self.time_limit, time_limit_factor=self.time_limit_factor)
        if not self.resources.is_default:
            d["resources"] = self.resources.to_json()
        if self.after:
            d["after"] = [a.to_json() for a in self.after]
        if self.group is not None:
            d["group"] = self.group
        if self.hold:
            d["hold"] = True
        return d

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2)

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> JobSpec:
        if len(raw) > MAX_JOB_JSON:
            raise InvalidJob(f"is larger than {MAX_JOB_JSON} bytes", obj=where)
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise InvalidJob(f"is not valid JSON ({e})", obj=where) from e
        return cls.from_dict(data, where)

    @classmethod
    def from_dict(cls, data: object, where: str) -> JobSpec:
        try:
            return _parse(data)
        except _Bad as e:
            raise InvalidJob(str(e), obj=where) from None
        except FlowError as e:
            raise InvalidJob(e.render(), obj=where) from None


def _is_digest(v: object) -> bool:
    return isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)


def parse_program(prog: dict[str, Any]) -> Program:
    """job.json's `program` in any of its shapes; members a shape does not know are ignored
    (old job.json files read as they always did)."""
    pname = prog.get("name", "")
    name = pname if isinstance(pname, str) else ""
    src = prog.get("source")
    source = src if isinstance(src, str) and os.path.isabs(src) and "\0" not in src else None
    path = prog.get("path")
    digest, command, bundle = prog.get("digest"), prog.get("command"), prog.get("bundle")
    if bundle is not None:
        if not _is_digest(bundle) or not isinstance(path, str) or not _inside(path):
            raise _Bad("member 'program' has a bad 'bundle' digest or 'path' inside it")
        return Program(bundle=bundle, path=path, name=name, source=source)
    if prog.get("in_place") is True:
        if not _is_digest(digest) or not isinstance(path, str) or not os.path.isabs(path):
            raise _Bad("member 'program' in place needs an absolute 'path' and its 'digest'")
        return Program(digest=digest, path=path, name=name, source=source, in_place=True)
    if _is_digest(digest):
        return Program(digest=digest, name=name, source=source)
    if isinstance(command, str) and command and "\0" not in command and "/" not in command:
        return Program(command=command, name=command)
    raise _Bad("member 'program' needs a 64-hex 'digest', a 'bundle' or a plain 'command' name")


def _inside(rel: str) -> bool:
    """A relative path that stays inside its tree: no empty, '.' or '..' component."""
    parts = rel.split("/")
    return bool(rel) and "\0" not in rel and all(p not in ("", ".", "..") for p in parts)


def _grown(seconds: float | None, factor: float, times: int) -> float | None:
    if seconds is None or times <= 0 or factor == 1.0:
        return seconds
    # in logarithms: a factor raised to a large count would overflow a float
    if math.log(seconds) + times * math.log(factor) >= math.log(MAX_SECONDS):
        return float(MAX_SECONDS)
    return float(seconds * factor**times)


def duration_words(seconds: float) -> str:
    """A duration as exactly as users write one: 2s, 1.5s, 15m, 1h30m, 2d."""
    if seconds != int(seconds) or seconds < 60:
        return f"{seconds:g}s"
    out, rest = "", int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            out += f"{rest // size}{unit}"
            rest %= size
    return out


class _Bad(Exception):
    pass


_KNOWN = frozenset(
    (
        "format id key tag name program args step params priority placement pool requires "
        "time retries max_attempts workdir require_outcome parent array_index created "
        "time_limit time_limit_factor resources after group hold"
    ).split()
)


def _get(d: dict[str, Any], k: str, typ: type | tuple[type, ...], default: Any = ...) -> Any:
    if k not in d or d[k] is None:
        if default is ...:
            raise _Bad(f"member {k!r} is missing")
        return default
    v = d[k]
    if isinstance(v, bool) and bool not in (typ if isinstance(typ, tuple) else (typ,)):
        raise _Bad(f"member {k!r} must be {_tname(typ)}, not a boolean")
    if not isinstance(v, typ):
        raise _Bad(f"member {k!r} must be {_tname(typ)}")
    return v


def _tname(typ: type | tuple[type, ...]) -> str:
    ts = typ if isinstance(typ, tuple) else (typ,)
    return " or ".join(
        {"str": "a string", "int": "an integer", "float": "a number"}.get(t.__name__, t.__name__)
        for t in ts
    )


def check_params(params: object) -> dict[str, ParamValue]:
    if not isinstance(params, dict):
        raise _Bad("member 'params' must be an object")
    if len(params) > MAX_PARAMS:
        raise _Bad(f"has more than {MAX_PARAMS} params")
    out: dict[str, ParamValue] = {}
    for k, v in params.items():
        names.check_ident(k, "parameter name")
        if not isinstance(v, str | int | float | bool):
            raise _Bad(f"param {k!r} must be a string, number or boolean")
        if isinstance(v, str) and (len(v) > MAX_PARAM_VALUE or "\0" in v):
            raise _Bad(f"param {k!r} is too long or contains a NUL byte")
        out[k] = v
    return out


def _parse(data: object) -> JobSpec:
    if not isinstance(data, dict):
        raise _Bad("is not a JSON object")
    fmt = data.get("format", JOB_FORMAT)
    if fmt != JOB_FORMAT:
        raise _Bad(f"has format {fmt!r}; this httk_flow reads {JOB_FORMAT}")
    job_id = _get(data, "id", str)
    if not names.ID_RE.fullmatch(job_id):
        raise _Bad("member 'id' must be 32 lower-case hex digits")
    tag = _get(data, "tag", str, None)
    if tag is not None:
        names.check_tag(tag)
    key = _get(data, "key", str)
    if key != names.make_key(job_id, tag):
        raise _Bad("member 'key' does not match its id and tag")
    program = parse_program(_get(data, "program", dict))
    args = _get(data, "args", list, [])
    if len(args) > MAX_ARGS or not all(isinstance(a, str) and "\0" not in a for a in args):
        raise _Bad("member 'args' must be a list of strings without NUL bytes")
    requires = _get(data, "requires", list, [])
    for r in requires:
        if not isinstance(r, str):
            raise _Bad("member 'requires' must be a list of strings")
        names.check_label(r, "capability")
    pool = _get(data, "pool", str, None)
    if pool is not None:
        names.check_label(pool, "pool")
    time_req = _get(data, "time", (int, float), None)
    if time_req is not None and not 0 < time_req < MAX_SECONDS:
        raise _Bad("member 'time' must be a positive number of seconds")
    time_limit = _get(data, "time_limit", (int, float), None)
    if time_limit is not None and not 0 < time_limit < MAX_SECONDS:
        raise _Bad("member 'time_limit' must be a positive number of seconds")
    factor = _get(data, "time_limit_factor", (int, float), 1.0)
    if not 1 <= factor <= MAX_LIMIT_FACTOR:
        raise _Bad(f"member 'time_limit_factor' must be a number from 1 to {MAX_LIMIT_FACTOR:g}")
    if time_limit is not None and time_req is not None and time_limit < time_req:
        raise _Bad("member 'time_limit' is shorter than its time request ('time')")
    retries = _get(data, "retries", int, DEFAULT_RETRIES)
    max_attempts = _get(data, "max_attempts", int, DEFAULT_MAX_ATTEMPTS)
    if not 0 <= retries <= 1000 or not 1 <= max_attempts <= 100_000:
        raise _Bad("members 'retries' (0-1000) or 'max_attempts' (1-100000) out of range")
    workdir = _get(data, "workdir", str, "persistent")
    if workdir not in ("persistent", "isolated"):
        raise _Bad("member 'workdir' must be 'persistent' or 'isolated'")
    parent = None
    pdata = _get(data, "parent", dict, None)
    if pdata is not None:
        pid, pkey = _get(pdata, "id", str), _get(pdata, "key", str)
        if not names.ID_RE.fullmatch(pid) or names.JobKey.parse(pkey).id != pid:
            raise _Bad("member 'parent' has a bad id or key")
        parent = ParentRef(
            id=pid,
            key=pkey,
            placement=names.check_placement(_get(pdata, "placement", str)),
            activation=_get(pdata, "activation", int),
            label=names.check_label(_get(pdata, "label", str)),
        )
    array_index = _get(data, "array_index", int, None)
    group = _get(data, "group", str, None)
    if group is not None:
        names.check_group(group)
    name = _get(data, "name", str, "")
    if len(name) > 256:
        raise _Bad("member 'name' is longer than 256 characters")
    return JobSpec(
        id=job_id,
        key=key,
        tag=tag,
        name=name,
        program=program,
        args=tuple(args),
        step=names.check_ident(_get(data, "step", str, "main"), "step name"),
        params=check_params(_get(data, "params", dict, {})),
        priority=names.check_priority(_get(data, "priority", int, names.DEFAULT_PRIORITY)),
        placement=names.check_placement(_get(data, "placement", str)),
        pool=pool,
        requires=tuple(requires),
        time=float(time_req) if time_req is not None else None,
        retries=retries,
        max_attempts=max_attempts,
        workdir=workdir,
        require_outcome=_get(data, "require_outcome", bool, False),
        parent=parent,
        array_index=array_index,
        created=float(_get(data, "created", (int, float), 0.0)),
        time_limit=float(time_limit) if time_limit is not None else None,
        time_limit_factor=float(factor),
        resources=Request.from_json(data.get("resources"), "resources"),
        after=afters_from_json(data.get("after"), "after"),
        group=group,
        hold=_get(data, "hold", bool, False),
        extra={k: v for k, v in data.items() if k not in _KNOWN},
    )
