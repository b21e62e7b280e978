"""What a job needs to run: CPUs, GPUs, memory and site-defined resources.

A request is part of the job's service class (services.py), so a manager decides whether
a ready job fits what it has free from the marker name alone, never from job.json.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from httk_flow.errors import UsageError
from httk_flow.protocol import inputs, names

#: the most of any one resource a job may ask for, and of CPUs a manager may offer
MAX_COUNT = 1 << 20
#: the reserved names a --resource may not take: they have flags of their own
RESERVED = frozenset(("cpus", "cpu", "gpus", "gpu", "mem", "memory"))


def parse_size(text: str, obj: str) -> int:
    """A memory size as batch systems take one (4G, 512M, 1.5T; a bare number is
    megabytes) in bytes."""
    t = text.strip()
    hint = "write e.g. 4G, 512M or 2048 (megabytes)"
    try:
        n = int(t) << 20 if t.isdigit() else inputs.parse_size(t, obj)
    except UsageError:
        raise UsageError(f"{text!r} is not a size", obj=obj, hint=hint) from None
    if n <= 0 or n > MAX_COUNT * (1 << 30):
        raise UsageError(f"{text!r} is out of range", obj=obj, hint=hint)
    return n


def format_size(n: int) -> str:
    """Bytes in the largest unit that keeps one decimal at most: 4G, 1.5G, 512M."""
    for unit, size in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            v = n / size
            return f"{v:.0f}{unit}" if abs(v - round(v)) < 0.05 else f"{v:.1f}{unit}"
    return f"{n}B"


def parse_resource(text: str, obj: str = "--resource") -> tuple[str, int]:
    """NAME=N (a site-defined resource and how many units) into its parts."""
    name, sep, count = text.partition("=")
    where = f"{obj} {text!r}"
    if not sep:
        raise UsageError("is not NAME=N", obj=where, hint="write e.g. --resource licence=1")
    name = name.strip()
    try:
        names.check_label(name, "resource name")
    except Exception as e:  # a FlowError, said with the flag it came from
        raise UsageError(
            "has a bad name", obj=where, hint="a name of letters, digits, _ and -"
        ) from e
    if name.lower() in RESERVED:
        own = {"cpu": "--cpus", "gpu": "--gpus", "memory": "--mem"}.get(
            name.lower().rstrip("s") if name.lower() != "mem" else "memory", "--mem"
        )
        raise UsageError(f"{name!r} has its own option", obj=where, hint=f"use {own}")
    return name, _count(count.strip(), where)


def _count(text: str, where: str, low: int = 0) -> int:
    try:
        n = int(text)
    except ValueError:
        raise UsageError(f"{text!r} is not a whole number", obj=where) from None
    if not low <= n <= MAX_COUNT:
        raise UsageError(f"must be from {low} to {MAX_COUNT}", obj=where)
    return n


@dataclass(frozen=True, slots=True)
class Request:
    """What one attempt of a job holds while it runs."""

    cpus: int = 1
    gpus: int = 0
    #: bytes; 0: not stated (the job is trusted to fit beside the others)
    mem: int = 0
    #: site-defined resources, sorted by name, each with a count above 0
    custom: tuple[tuple[str, int], ...] = ()

    @property
    def is_default(self) -> bool:
        return self == DEFAULT_REQUEST

    def to_json(self) -> dict[str, Any]:
        """Only what differs from the default: a default request writes nothing."""
        d: dict[str, Any] = {}
        if self.cpus != 1:
            d["cpus"] = self.cpus
        if self.gpus:
            d["gpus"] = self.gpus
        if self.mem:
            d["mem"] = self.mem
        if self.custom:
            d["custom"] = dict(self.custom)
        return d

    @classmethod
    def from_json(cls, data: object, obj: str) -> Request:
        """A stored request (job.json's `resources`, a class file's); FlowError when bad."""
        if data is None:
            return DEFAULT_REQUEST
        if not isinstance(data, dict):
            raise UsageError("member 'resources' must be an object", obj=obj)
        known = {"cpus", "gpus", "mem", "custom"}
        extra = set(data) - known
        if extra:
            raise UsageError(f"member 'resources' has unknown {sorted(extra)}", obj=obj)

        def count(k: str, default: int, low: int) -> int:
            v = data.get(k, default)
            if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= MAX_COUNT:
                raise UsageError(
                    f"resources member {k!r} must be a whole number from {low}", obj=obj
                )
            return v

        cpus, gpus = count("cpus", 1, 1), count("gpus", 0, 0)
        mem = data.get("mem", 0)
        if isinstance(mem, bool) or not isinstance(mem, int) or mem < 0:
            raise UsageError("resources member 'mem' must be bytes, a whole number", obj=obj)
        custom_d = data.get("custom", {})
        if not isinstance(custom_d, dict):
            raise UsageError("resources member 'custom' must be an object", obj=obj)
        custom: list[tuple[str, int]] = []
        for k, v in custom_d.items():
            names.check_label(k, "resource name")
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_COUNT:
                raise UsageError(f"resource {k!r} must count 1 or more", obj=obj)
            custom.append((k, v))
        return cls(cpus, gpus, mem, tuple(sorted(custom)))

    @classmethod
    def build(
        cls,
        *,
        cpus: int | None = None,
        gpus: int | None = None,
        mem: str | int | None = None,
        custom: list[str] | dict[str, int] | None = None,
        obj: str | None = "flow submit",
    ) -> Request:
        """A request from what a user wrote: checked, with the option it came from named
        in any error (`obj` None: a JSON line, whose keys are named instead of flags)."""

        def at(flag: str) -> str:
            return f"{obj}: --{flag}" if obj is not None else flag

        c = 1 if cpus is None else _count(str(cpus), at("cpus"), low=1)
        g = 0 if gpus is None else _count(str(gpus), at("gpus"))
        m = 0
        if isinstance(mem, int) and not isinstance(mem, bool):
            m = parse_size(str(mem), at("mem"))
        elif isinstance(mem, str):
            m = parse_size(mem, at("mem"))
        elif mem is not None:
            raise UsageError("must be a size such as 4G", obj=at("mem"))
        pairs: dict[str, int] = {}
        items = (
            [f"{k}={v}" for k, v in custom.items()] if isinstance(custom, dict) else custom or []
        )
        for item in items:
            name, n = parse_resource(str(item), at("resource") if obj else "resources")
            if name in pairs:
                raise UsageError(f"resource {name!r} is given twice", obj=obj or "resources")
            if n:
                pairs[name] = n
        return cls(c, g, m, tuple(sorted(pairs.items())))

    def describe(self) -> str:
        """In words, as `flow show` and the blocked reasons say it: 4 CPUs, 1 GPU, 8G."""
        parts = [f"{self.cpus} CPU" + ("s" if self.cpus != 1 else "")]
        if self.gpus:
            parts.append(f"{self.gpus} GPU" + ("s" if self.gpus != 1 else ""))
        if self.mem:
            parts.append(f"{format_size(self.mem)} memory")
        parts += [f"{k}={v}" for k, v in self.custom]
        return ", ".join(parts)


DEFAULT_REQUEST = Request()


def _n(n: int, what: str) -> str:
    return f"{n} {what}" + ("s" if n != 1 else "")


@dataclass(frozen=True, slots=True)
class Offer:
    """What a manager gives its attempts in all (its inventory), or holds of it: in its
    heartbeat, so `flow status` and `flow managers` say what fits where."""

    cpus: int
    gpus: tuple[str, ...] = ()
    mem: int = 0
    custom: tuple[tuple[str, int], ...] = ()

    def lacks(self, need: Request, who: str = "this manager") -> str | None:
        """Why a request can never fit here, even with nothing running (None: it can)."""
        if need.cpus > self.cpus:
            return f"needs {_n(need.cpus, 'CPU')}; {who} has {self.cpus}"
        if need.gpus > len(self.gpus):
            return f"needs {_n(need.gpus, 'GPU')}; {who} has {len(self.gpus)}"
        if need.mem > self.mem:
            return f"needs {format_size(need.mem)} memory; {who} has {format_size(self.mem)}"
        have = dict(self.custom)
        for name, n in need.custom:
            if have.get(name, 0) < n:
                return f"needs {name}={n}; {who} has {name}={have.get(name, 0)}"
        return None

    def describe(self) -> str:
        parts = [_n(self.cpus, "CPU")]
        if self.gpus:
            parts.append(_n(len(self.gpus), "GPU") + f" ({','.join(self.gpus)})")
        if self.mem:
            parts.append(f"{format_size(self.mem)} memory")
        parts += [f"{k}={v}" for k, v in self.custom]
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "cpus": self.cpus,
            "gpus": list(self.gpus),
            "mem": self.mem,
            "custom": dict(self.custom),
        }

    @classmethod
    def from_json(cls, data: object) -> Offer | None:
        """An offer a heartbeat carries; None when absent or not of this shape."""
        if not isinstance(data, dict):
            return None
        cpus, gpus, mem, custom = (data.get(k) for k in ("cpus", "gpus", "mem", "custom"))
        if not isinstance(cpus, int) or not isinstance(mem, int) or not isinstance(gpus, list):
            return None
        pairs = custom.items() if isinstance(custom, dict) else ()
        return cls(
            cpus,
            tuple(str(g) for g in gpus),
            mem,
            tuple(sorted((str(k), int(v)) for k, v in pairs if isinstance(v, int))),
        )


@dataclass(frozen=True, slots=True)
class Grant:
    """What a batch system granted the allocation this process runs in, on its node, as
    its backend reads it from the environment (None: it does not say)."""

    cpus: int | None = None
    mem: int | None = None  # bytes
    gpus: tuple[str, ...] | None = None
    #: where each figure came from, e.g. ("cpus", the variable the backend read)
    sources: tuple[tuple[str, str], ...] = ()

    def source(self, what: str) -> str:
        return dict(self.sources).get(what, "the batch system")


NO_GRANT = Grant()
