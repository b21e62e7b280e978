"""Bulk submission input: `--array` ranges and `--from FILE.jsonl` lines into SubmitRequests."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator
from typing import Any

import orjson

from httk_flow.durations import parse_duration
from httk_flow.errors import FlowError, UsageError
from httk_flow.submit import SubmitRequest

#: members a line of a --from file may carry (CLI.md), plus a few of ours
LINE_KEYS = frozenset(
    "name tag step params priority placement pool requires time retries args "
    "program inputs workdir require_outcome".split()
)
MAX_ARRAY = 10_000_000


def parse_array(spec: str) -> range:
    """`1-1000[:STEP]` (or a single index) into a range of indices."""
    m = re.fullmatch(r"(\d+)(?:-(\d+))?(?::(\d+))?", spec.strip())
    if not m:
        raise UsageError("is not START-END[:STEP]", obj=f"--array {spec!r}")
    start = int(m.group(1))
    end = int(m.group(2)) if m.group(2) else start
    step = int(m.group(3) or 1)
    if end < start or step < 1 or (end - start) // step + 1 > MAX_ARRAY:
        raise UsageError(
            f"needs START <= END, STEP >= 1 and at most {MAX_ARRAY} indices",
            obj=f"--array {spec!r}",
        )
    return range(start, end + 1, step)


def array_requests(base: SubmitRequest, indices: range) -> Iterator[SubmitRequest]:
    for i in indices:
        yield dataclasses.replace(base, array_index=i, params=dict(base.params))


def jsonl_requests(
    stream: Iterable[bytes], base: SubmitRequest, where: str
) -> Iterator[SubmitRequest]:
    """One request per non-blank line; a bad line raises UsageError naming file:line."""
    for lineno, raw in enumerate(stream, 1):
        if not raw.strip():
            continue
        obj = f"{where}:{lineno}"
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise UsageError(f"is not valid JSON ({e})", obj=obj) from None
        if not isinstance(data, dict):
            raise UsageError("is not a JSON object", obj=obj)
        yield _line(data, base, obj)


def _line(data: dict[str, Any], base: SubmitRequest, obj: str) -> SubmitRequest:
    unknown = sorted(set(data) - LINE_KEYS)
    if unknown:
        raise UsageError(
            f"has unknown key(s) {', '.join(unknown)}",
            obj=obj,
            hint=f"allowed: {' '.join(sorted(LINE_KEYS))}",
        )
    req = dataclasses.replace(base, params=dict(base.params), origin=obj)
    try:
        for k, v in data.items():
            if k == "time":
                if isinstance(v, str):
                    req.time = parse_duration(v, "time")
                elif isinstance(v, int | float) and not isinstance(v, bool):
                    req.time = float(v)
                else:
                    raise UsageError("must be seconds or a duration string", obj="time")
            elif k == "params":
                if not isinstance(v, dict):
                    raise UsageError("must be an object", obj="params")
                req.params.update(v)
            elif k in ("args", "requires", "inputs"):
                if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                    raise UsageError("must be a list of strings", obj=k)
                setattr(req, k, list(v))
            elif k in ("priority", "retries"):
                if not isinstance(v, int) or isinstance(v, bool):
                    raise UsageError("must be an integer", obj=k)
                setattr(req, k, v)
            elif k == "require_outcome":
                if not isinstance(v, bool):
                    raise UsageError("must be true or false", obj=k)
                req.require_outcome = v
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
