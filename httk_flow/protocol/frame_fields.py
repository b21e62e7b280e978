"""Reading frame members: every member's shape is checked here, once, as it is parsed.

Used by frames.py and members.py only; anything else reads frames as types.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from httk_flow.errors import InvalidName
from httk_flow.protocol.names import RecordRef

Json = dict[str, Any]
T = TypeVar("T")


class BadFrame(ValueError):
    """A frame member of the wrong shape; `member` names it."""

    def __init__(self, member: str) -> None:
        super().__init__(f"member {member!r}")
        self.member = member

    @property
    def top(self) -> str:
        """What a reader says of it: the top-level member (`attempt` for `attempt.n`)."""
        return f"member {self.member.split('.')[0]!r}"


def get_int(d: Mapping[str, Any], k: str, default: int | None = None) -> int:
    v = d.get(k)
    if v is None and default is not None:
        return default
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise BadFrame(k)
    return v


def opt_int(d: Mapping[str, Any], k: str, *, signed: bool = False) -> int | None:
    v = d.get(k)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or (v < 0 and not signed):
        raise BadFrame(k)
    return v


def get_str(d: Mapping[str, Any], k: str, default: str | None = None) -> str:
    v = d.get(k)
    if v is None and default is not None:
        return default
    if not isinstance(v, str):
        raise BadFrame(k)
    return v


def opt_str(d: Mapping[str, Any], k: str) -> str | None:
    v = d.get(k)
    if v is None:
        return None
    if not isinstance(v, str):
        raise BadFrame(k)
    return v


def opt_number(d: Mapping[str, Any], k: str) -> float | None:
    v = d.get(k)
    if v is None:
        return None
    if not isinstance(v, int | float) or isinstance(v, bool):
        raise BadFrame(k)
    return v


def opt_ref(d: Mapping[str, Any], k: str) -> RecordRef | None:
    v = opt_str(d, k)
    try:
        return RecordRef.parse(v) if v is not None else None
    except InvalidName:
        raise BadFrame(k) from None


def member(d: Mapping[str, Any], k: str, parse: Callable[[Json], T]) -> T | None:
    v = d.get(k)
    if v is None:
        return None
    if not isinstance(v, dict):
        raise BadFrame(k)
    try:
        return parse(v)
    except BadFrame as e:
        raise BadFrame(f"{k}.{e.member}") from None


def put(d: Json, k: str, v: object) -> None:
    if v is not None:
        d[k] = v
