"""Bulk submission input: `--array` ranges and `--from FILE.jsonl` lines into SubmitRequests."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator
from typing import Any

import orjson

from httk_flow.errors import FlowError, UsageError
from httk_flow.ops.depend import placeholders
from httk_flow.protocol.after import After, AfterPolicy
from httk_flow.protocol.durations import parse_duration
from httk_flow.protocol.resources import Request
from httk_flow.protocol.submit import SubmitRequest

#: members a line of a --from file may carry (CLI.md), plus a few of ours
LINE_KEYS = frozenset(
    "name tag step params priority placement pool requires time retries args "
    "program inputs workdir require_outcome time_limit time_limit_factor max_attempts "
    "cpus gpus mem resources bundle in_place group hold after after_policy".split()
)
MAX_ARRAY = 10_000_000
#: a line's resource request, each key over the command line's
RESOURCE_KEYS = frozenset(("cpus", "gpus", "mem", "resources"))


#: one item of an --array list: an index, or a range with an optional step
_ARRAY_ITEM = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?")
_ARRAY_FORMS = "write e.g. 1-100, 1-9:2, 1,3,5 or 1-3,7,10-20:5"


def parse_array(spec: str) -> list[range]:
    """`--array` forms (as batch systems write job arrays) into ranges, in the order written.

    A comma-separated list of items, each `N`, `START-END` or `START-END:STEP`.
    Refused: an empty list or item, END < START, STEP 0, an index given twice (an
    overlap of two items), more than MAX_ARRAY indices, and a `%N` throttle.
    """
    obj = f"--array {spec!r}"
    text = spec.strip()
    if "%" in text:
        raise UsageError("throttling with %N is not supported", obj=obj, hint=_throttle_hint(text))
    if not text:
        raise UsageError("is empty", obj=obj, hint=_ARRAY_FORMS)
    ranges: list[range] = []
    total = 0
    for item in text.split(","):
        m = _ARRAY_ITEM.fullmatch(item.strip())
        if not m:
            what = "an empty item" if not item.strip() else f"{item.strip()!r}"
            raise UsageError(
                f"has {what}, not N, START-END or START-END:STEP", obj=obj, hint=_ARRAY_FORMS
            )
        start = int(m.group(1))
        end = int(m.group(2)) if m.group(2) else start
        step = int(m.group(3)) if m.group(3) else 1
        if end < start:
            raise UsageError(
                f"range {item.strip()!r} ends before it starts",
                obj=obj,
                hint="write START-END with START <= END",
            )
        if step < 1:
            raise UsageError(
                f"range {item.strip()!r} has step 0", obj=obj, hint="a STEP is 1 or more"
            )
        r = range(start, end + 1, step)
        total += len(r)
        if total > MAX_ARRAY:
            raise UsageError(f"has more than {MAX_ARRAY} indices", obj=obj, hint="submit in parts")
        ranges.append(r)
    dup = _first_duplicate(ranges)
    if dup is not None:
        raise UsageError(f"gives index {dup} more than once", obj=obj, hint="list every index once")
    return ranges


def _throttle_hint(text: str) -> str:
    """The ways out of a `%N` throttle, in the numbers of the spec when it has them: the
    jobs submitted without it (in parts, or from a file), and what caps how many run at
    once here: a pool of their own, served by one manager with that many workers."""
    body, _, limit = (t.strip() for t in text.partition("%"))
    n = limit if limit.isdigit() and int(limit) > 0 else "N"
    items = [i.strip() for i in body.split(",")]
    valid = all(_ARRAY_ITEM.fullmatch(i) for i in items)
    whole = ",".join(items) if valid else "1-100"
    parts = "e.g. --array 1-50, later --array 51-100"
    m = re.fullmatch(r"(\d+)-(\d+)", whole)
    if m and int(m.group(2)) > int(m.group(1)):
        start, end = int(m.group(1)), int(m.group(2))
        mid = (start + end) // 2
        parts = f"--array {start}-{mid}, later --array {mid + 1}-{end}"
    elif valid and len(items) > 1:
        half = (len(items) + 1) // 2
        parts = f"--array {','.join(items[:half])}, later --array {','.join(items[half:])}"
    return (
        f"submit without it: in parts ({parts}) or one JSON line per job in a file for "
        f"--from; to run at most {n} at once, give the jobs a pool of their own (flow submit "
        f"--pool throttled --array {whole} ...) served by one manager with {n} workers "
        f"(flow serve --pool throttled --workers {n})"
    )


def _first_duplicate(ranges: list[range]) -> int | None:
    """The smallest index two of the ranges share, or None."""
    found: int | None = None
    for i, a in enumerate(ranges):
        for b in ranges[i + 1 :]:
            lo, hi = max(a[0], b[0]), min(a[-1], b[-1])
            if lo > hi:
                continue
            small, big = (a, b) if len(a) <= len(b) else (b, a)
            # walk the sparser range over the shared span; `in` on a range is O(1)
            first = small.start + -(-(lo - small.start) // small.step) * small.step
            for x in range(first, hi + 1, small.step):
                if x in big:
                    if found is None or x < found:
                        found = x
                    break
    return found


def array_requests(base: SubmitRequest, indices: Iterable[range]) -> Iterator[SubmitRequest]:
    for r in indices:
        for i in r:
            yield base.but(array_index=i, params=dict(base.params))


def jsonl_requests(
    stream: Iterable[bytes], base: SubmitRequest, where: str
) -> Iterator[SubmitRequest]:
    """One request per non-blank line; a bad line raises UsageError naming file:line
    (and the column, for a line that is not JSON)."""
    for item in jsonl_lines(stream, base, where):
        if isinstance(item, UsageError):
            raise item
        yield item


def jsonl_lines(
    stream: Iterable[bytes], base: SubmitRequest, where: str
) -> Iterator[SubmitRequest | UsageError]:
    """Per non-blank line, its request or the UsageError that says what is wrong with it:
    a check of a whole file reports every bad line, not one per run."""
    for lineno, raw in enumerate(stream, 1):
        if not raw.strip():
            continue
        try:
            yield _parse_line(raw, base, f"{where}:{lineno}")
        except UsageError as e:
            yield e


def _parse_line(raw: bytes, base: SubmitRequest, obj: str) -> SubmitRequest:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        # one line is one document: its column is what locates the mistake
        why = e.msg.split(": line ")[0]
        raise UsageError(
            f"is not valid JSON: {why}",
            obj=f"{obj}, column {e.colno}",
            hint="each line of the file is one JSON object",
        ) from None
    if not isinstance(data, dict):
        raise UsageError("is not a JSON object", obj=obj)
    return _line(data, base, obj)


def _line(data: dict[str, Any], base: SubmitRequest, obj: str) -> SubmitRequest:
    unknown = sorted(set(data) - LINE_KEYS)
    if unknown:
        raise UsageError(
            f"has unknown key(s) {', '.join(unknown)}",
            obj=obj,
            hint=f"allowed: {' '.join(sorted(LINE_KEYS))}",
        )
    req = base.but(params=dict(base.params), origin=obj)
    try:
        if RESOURCE_KEYS & data.keys():
            req.resources = _resources(data, base.resources, obj)
        if "after" in data or "after_policy" in data:
            req.after = _after(data, base)
        for k, v in data.items():
            if k in RESOURCE_KEYS or k in ("after", "after_policy"):
                continue
            if k in ("time", "time_limit"):
                if isinstance(v, str):
                    setattr(req, k, parse_duration(v, k))
                elif isinstance(v, int | float) and not isinstance(v, bool):
                    setattr(req, k, float(v))
                else:
                    raise UsageError("must be seconds or a duration string", obj=k)
            elif k == "time_limit_factor":
                if not isinstance(v, int | float) or isinstance(v, bool):
                    raise UsageError("must be a number", obj=k)
                req.time_limit_factor = float(v)
            elif k == "params":
                if not isinstance(v, dict):
                    raise UsageError("must be an object", obj="params")
                req.params.update(v)
            elif k in ("args", "requires", "inputs"):
                if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                    raise UsageError("must be a list of strings", obj=k)
                setattr(req, k, list(v))
            elif k in ("priority", "retries", "max_attempts"):
                if not isinstance(v, int) or isinstance(v, bool):
                    raise UsageError("must be an integer", obj=k)
                setattr(req, k, v)
            elif k in ("require_outcome", "in_place", "hold"):
                if not isinstance(v, bool):
                    raise UsageError("must be true or false", obj=k)
                setattr(req, k, v)
            elif k == "workdir":
                if v not in ("persistent", "isolated"):
                    raise UsageError("must be persistent or isolated", obj=k)
                req.workdir = v
            else:
                if not isinstance(v, str):
                    raise UsageError("must be a string", obj=k)
                setattr(req, k, v)
    except FlowError as e:
        raise UsageError(e.render(), obj=obj) from None
    return req


def _after(data: dict[str, Any], base: SubmitRequest) -> tuple[After, ...]:
    """A line's own dependencies: `after` (a selector or a list of them) under
    `after_policy` (default: the command line's, else ok), as placeholders the batch
    makes into sets before it publishes (ops/depend.py)."""
    pol = data.get("after_policy")
    if pol is None:
        policy = base.after[0].policy if base.after else AfterPolicy.OK
    elif isinstance(pol, str):
        policy = AfterPolicy.parse(pol, "after_policy")
    else:
        raise UsageError("must be ok, fail, wait or any", obj="after_policy")
    sel = data.get("after", [a.selector for a in base.after])
    if isinstance(sel, str):
        sel = [sel]
    if not isinstance(sel, list) or not all(isinstance(x, str) and x.strip() for x in sel):
        raise UsageError("must be a selector or a list of selectors", obj="after")
    return placeholders(sel, policy)


def _resources(data: dict[str, Any], base: Request, obj: str) -> Request:
    """A line's cpus, gpus, mem (4G, or megabytes) and resources ({"licence": 1}), each
    over the command line's own."""
    for k in ("cpus", "gpus"):
        if k in data and (not isinstance(data[k], int) or isinstance(data[k], bool)):
            raise UsageError("must be a whole number", obj=k)
    custom = data.get("resources")
    if custom is not None and not isinstance(custom, dict):
        raise UsageError('must be an object such as {"licence": 1}', obj="resources")
    got = Request.build(
        cpus=data.get("cpus", base.cpus),
        gpus=data.get("gpus", base.gpus),
        mem=data.get("mem"),
        custom=custom,
        obj=None,  # the line is named by the caller: name its keys, not flags
    )
    return dataclasses.replace(
        got,
        mem=got.mem if "mem" in data else base.mem,
        custom=got.custom if custom is not None else base.custom,
    )
