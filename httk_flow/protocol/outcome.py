"""What an attempt reports: outcome.line written in place, or outcome.ready/ renamed into place.

An outcome always wins over the exit status. It is parsed at the boundary into a frozen
Outcome; anything malformed becomes a protocol error of that job alone.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from typing import Any

import orjson

from httk_flow.errors import FlowError, InvalidOutcome, UnsafePath
from httk_flow.protocol import layout, names
from httk_flow.protocol.fsio import fs
from httk_flow.protocol.layout import OUTCOME_DIR as OUTCOME_DIR  # re-exported from layout
from httk_flow.protocol.resources import MAX_COUNT, RESERVED, Request, parse_size

MAX_OUTCOME = 1 << 20
MAX_CHILDREN_FILE = 64 << 20
MAX_CHILDREN = 100_000
MAX_MESSAGE = 4000


class Action(enum.Enum):
    SUCCEED = "succeed"
    FAIL = "fail"
    ADVANCE = "advance"
    RETRY = "retry"
    PAUSE = "pause"
    WAIT = "wait"


class JoinMode(enum.Enum):
    ALL_SUCCEEDED = "all_succeeded"
    ALL_DONE = "all_done"
    ANY_SUCCEEDED = "any_succeeded"


@dataclass(frozen=True)
class ChildDef:
    label: str
    tag: str | None = None
    step: str = "main"
    params: dict[str, Any] = field(default_factory=dict)
    priority: int | None = None
    program: str | None = None  # a path relative to the parent's job dir, or None = parent's
    #: what the line stated of its request (the members it did not state are the
    #: defaults here); None: it stated nothing and the child runs with the parent's
    resources: Request | None = None
    #: which members of `resources` the line stated: cpus, gpus, mem, custom
    stated: frozenset[str] = frozenset()

    def request_over(self, parent: Request) -> Request:
        """The child's request: each member the line stated, the parent's for the rest
        (`resources` replaces the parent's site-defined resources as a whole)."""
        mine = self.resources
        if mine is None:
            return parent
        return Request(
            mine.cpus if "cpus" in self.stated else parent.cpus,
            mine.gpus if "gpus" in self.stated else parent.gpus,
            mine.mem if "mem" in self.stated else parent.mem,
            mine.custom if "custom" in self.stated else parent.custom,
        )


@dataclass(frozen=True)
class Outcome:
    action: Action
    message: str = ""
    step: str | None = None  # advance / wait: the next step
    code: str = ""  # fail: a short machine-readable reason
    children: tuple[ChildDef, ...] = ()
    join: JoinMode = JoinMode.ALL_SUCCEEDED
    on_impossible: str | None = None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"action": self.action.value, "message": self.message}
        if self.step:
            d["step"] = self.step
        if self.code:
            d["code"] = self.code
        if self.action is Action.WAIT:
            d["join"] = self.join.value
            d["on_impossible"] = self.on_impossible
            d["children"] = len(self.children)
        return d


class TornOutcome(InvalidOutcome):
    """outcome.line exists but is not whole (no final newline): its writer was cut short,
    or is still writing. The caller decides: a killed attempt's is no outcome at all."""


def read_outcome(attempt_dir: str) -> Outcome | None:
    """The published outcome of an attempt, None if there is none; InvalidOutcome if bad.

    Two forms (§10): outcome.line, written in place by the runner, and the outcome.ready/
    directory renamed into place. Both, or a second publication, fail the job."""
    line = layout.outcome_line(attempt_dir)
    try:
        raw = fs.read_bytes(line, MAX_OUTCOME)
    except FileNotFoundError:
        return _read_ready(attempt_dir)
    except (OSError, UnsafePath) as e:
        raise InvalidOutcome(f"cannot read it ({e})", obj=line) from None
    again = layout.outcome_again(attempt_dir)
    if os.path.lexists(again):
        raise _published_twice(raw, again, attempt_dir)
    if os.path.lexists(layout.outcome_ready(attempt_dir)):
        raise _published_twice(raw, None, attempt_dir)
    if not raw.endswith(b"\n"):
        raise TornOutcome("is not whole (it does not end in a newline)", obj=line)
    if b"\0" in raw:
        # neither JSON nor a bash string holds a NUL: a hole a crashed file server left
        raise TornOutcome("is not whole (it has a hole of NUL bytes)", obj=line)
    if raw.count(b"\n") != 1:
        raise InvalidOutcome("must be one JSON object on one line", obj=line)
    out = parse_outcome(raw, line)
    if out.action is Action.WAIT:
        raise InvalidOutcome(
            "a wait outcome carries its children: publish it as outcome.ready/", obj=line
        )
    return out


def _read_ready(attempt_dir: str) -> Outcome | None:
    d = layout.outcome_ready(attempt_dir)
    try:
        st = os.lstat(d)
    except FileNotFoundError:
        return None
    where = layout.outcome_file(d)
    if not os.path.isdir(d) or os.path.islink(d):
        raise InvalidOutcome("outcome.ready is not a directory", obj=d)
    del st
    try:
        raw = fs.read_bytes(where, MAX_OUTCOME)
    except FileNotFoundError:
        raise InvalidOutcome("outcome.ready has no outcome.json", obj=d) from None
    except (OSError, UnsafePath) as e:
        raise InvalidOutcome(f"cannot read it ({e})", obj=where) from None
    dup = layout.duplicate_file(d)
    if os.path.lexists(dup):
        # the runner tried to publish a second outcome: neither can be trusted
        raise _published_twice(raw, dup, d)
    out = parse_outcome(raw, where)
    if out.action is Action.WAIT:
        out = _with_children(out, layout.children_file(d))
    return out


def _published_twice(first: bytes, again: str | None, obj: str) -> InvalidOutcome:
    """The error of an attempt that published two outcomes, naming both where they can be
    read (`again`: the runner's note of the second action): most often a step that went
    on after its outcome, which returns rather than ends the step."""
    said = "the attempt published more than one outcome"
    try:
        out = parse_outcome(first, obj)
        words = fs.read_bytes(again, 4096).split() if again is not None else []
    except (InvalidOutcome, OSError, UnsafePath):
        return InvalidOutcome(said, obj=obj)
    if not words:
        return InvalidOutcome(said, obj=obj)
    shown = f"{out.action.value} ({out.message!r})" if out.message else out.action.value
    second = words[0].decode(errors="replace")[:32]
    return InvalidOutcome(
        f"{said}: {shown}, then {second}; publishing an outcome does not end the step, so "
        "return (or exit) right after it",
        obj=obj,
    )


def parse_outcome(raw: bytes, where: str) -> Outcome:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise InvalidOutcome(f"is not valid JSON ({e})", obj=where) from None
    if not isinstance(data, dict):
        raise InvalidOutcome("is not a JSON object", obj=where)
    try:
        action = Action(data.get("action"))
    except ValueError:
        raise InvalidOutcome(
            f"action {data.get('action')!r} is not one of " + ", ".join(a.value for a in Action),
            obj=where,
        ) from None
    msg = data.get("message", "")
    if not isinstance(msg, str):
        raise InvalidOutcome("message must be a string", obj=where)
    step = data.get("step")
    try:
        if action in (Action.ADVANCE, Action.WAIT):
            if not isinstance(step, str):
                raise InvalidOutcome(f"a {action.value} outcome needs a step", obj=where)
            names.check_ident(step, "step name")
        else:
            step = None
        code = data.get("code", "")
        if not isinstance(code, str) or len(code) > 64:
            raise InvalidOutcome("code must be a short string", obj=where)
        join = JoinMode(data.get("join", "all_succeeded"))
        on_imp = data.get("on_impossible")
        if on_imp is not None:
            if not isinstance(on_imp, str):
                raise InvalidOutcome("on_impossible must be a step name", obj=where)
            names.check_ident(on_imp, "step name")
    except ValueError:
        raise InvalidOutcome(f"join {data.get('join')!r} is not a join mode", obj=where) from None
    except InvalidOutcome:
        raise
    except FlowError as e:
        raise InvalidOutcome(e.render(), obj=where) from None
    return Outcome(action, msg[:MAX_MESSAGE], step, code, (), join, on_imp)


def _with_children(out: Outcome, path: str) -> Outcome:
    try:
        raw = fs.read_bytes(path, MAX_CHILDREN_FILE)
    except FileNotFoundError:
        raw = b""
    except (OSError, UnsafePath) as e:
        raise InvalidOutcome(f"cannot read it ({e})", obj=path) from None
    children: list[ChildDef] = []
    labels: set[str] = set()
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        child = parse_child(line, f"{path}:{n}")
        if child.label in labels:
            raise InvalidOutcome(f"label {child.label!r} is used twice", obj=f"{path}:{n}")
        labels.add(child.label)
        children.append(child)
        if len(children) > MAX_CHILDREN:
            raise InvalidOutcome(f"spawns more than {MAX_CHILDREN} children", obj=path)
    if not children:
        raise InvalidOutcome("a wait outcome spawned no children to join", obj=path)
    return Outcome(
        out.action, out.message, out.step, out.code, tuple(children), out.join, out.on_impossible
    )


def parse_child(line: bytes, where: str) -> ChildDef:
    try:
        d = orjson.loads(line)
        if not isinstance(d, dict):
            raise InvalidOutcome("is not a JSON object", obj=where)
        label = d.get("label")
        if not isinstance(label, str):
            raise InvalidOutcome("needs a label", obj=where)
        names.check_label(label, "child label")
        tag = d.get("tag")
        if tag is not None:
            if not isinstance(tag, str):
                raise InvalidOutcome("tag must be a string", obj=where)
            names.check_tag(tag)
        step = d.get("step", "main")
        if not isinstance(step, str):
            raise InvalidOutcome("step must be a string", obj=where)
        names.check_ident(step, "step name")
        params = d.get("params", {})
        if not isinstance(params, dict):
            raise InvalidOutcome("params must be an object", obj=where)
        for k, v in params.items():
            names.check_ident(k, "parameter name")
            if not isinstance(v, str | int | float | bool):
                raise InvalidOutcome(f"param {k!r} must be a string or number", obj=where)
        prio = d.get("priority")
        if prio is not None:
            if not isinstance(prio, int) or isinstance(prio, bool):
                raise InvalidOutcome("priority must be an integer", obj=where)
            names.check_priority(prio)
        program = d.get("program")
        if program is not None and (not isinstance(program, str) or "\0" in program):
            raise InvalidOutcome("program must be a path", obj=where)
        request, stated = child_request(d, where)
    except orjson.JSONDecodeError as e:
        raise InvalidOutcome(f"is not valid JSON ({e})", obj=where) from None
    except InvalidOutcome:
        raise
    except FlowError as e:
        raise InvalidOutcome(e.render(), obj=where) from None
    return ChildDef(label, tag, step, params, prio, program, request, stated)


#: the keys of a child line that state its request, and the member each one sets
REQUEST_KEYS = {"cpus": "cpus", "gpus": "gpus", "mem": "mem", "resources": "custom"}


def child_request(d: dict[str, Any], where: str | None) -> tuple[Request | None, frozenset[str]]:
    """What a child line's cpus, gpus, mem (a size such as "4G", or whole megabytes) and
    resources ({"licence": 1}) ask for, and which members they state; InvalidOutcome
    naming the key when one is bad. (None, {}) when the line states none of them."""
    stated = frozenset(m for k, m in REQUEST_KEYS.items() if k in d)
    if not stated:
        return None, stated
    cpus = _child_count(d, "cpus", 1, where) if "cpus" in d else 1
    gpus = _child_count(d, "gpus", 0, where) if "gpus" in d else 0
    mem = 0
    if "mem" in d:
        v = d["mem"]
        hint = "a size such as 4G, 512M or 2048 (megabytes)"
        if isinstance(v, bool) or not isinstance(v, str | int):
            raise InvalidOutcome(f"mem must be {hint}, not {_shown(v)}", obj=where)
        try:
            mem = parse_size(str(v), "mem")
        except FlowError:
            raise InvalidOutcome(f"mem must be {hint}, not {_shown(v)}", obj=where) from None
    custom: list[tuple[str, int]] = []
    if "resources" in d:
        v = d["resources"]
        if not isinstance(v, dict):
            raise InvalidOutcome(
                f'resources must be an object such as {{"licence": 1}}, not {_shown(v)}',
                obj=where,
            )
        for name, n in v.items():
            if not isinstance(name, str):
                raise InvalidOutcome(f"resource name {name!r} is not a string", obj=where)
            names.check_label(name, "resource name")
            if name.lower() in RESERVED:
                key = {"cpu": "cpus", "gpu": "gpus", "memory": "mem"}.get(name.lower())
                raise InvalidOutcome(
                    f"resource {name!r} has a key of its own: {key or name.lower()}",
                    obj=where,
                )
            if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_COUNT:
                raise InvalidOutcome(
                    f"resource {name!r} must be a whole number from 0 to {MAX_COUNT}, "
                    f"not {_shown(n)}",
                    obj=where,
                )
            if n:
                custom.append((name, n))
    return Request(cpus, gpus, mem, tuple(sorted(custom))), stated


def _child_count(d: dict[str, Any], key: str, low: int, where: str | None) -> int:
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= MAX_COUNT:
        raise InvalidOutcome(
            f"{key} must be a whole number from {low} to {MAX_COUNT}, not {_shown(v)}", obj=where
        )
    return v


def _shown(v: object) -> str:
    """A value of a line as its error names it: JSON text (a Python value that has none,
    as the runner API may be given, by its repr), cut short."""
    try:
        text = orjson.dumps(v).decode(errors="replace")
    except TypeError:
        text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."
