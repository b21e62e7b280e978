"""Durations as users write them: 90, 90s, 15m, 2h, 1d, 1h30m, or a batch system's [D-]HH:MM:SS."""

from __future__ import annotations

import re

from httk_flow.errors import UsageError

_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


def parse_duration(text: str, what: str = "duration") -> float:
    """Seconds in `text`; raises UsageError naming `what` when it is not a duration."""
    t = text.strip().lower()
    try:
        if re.fullmatch(r"\d+(?:\.\d+)?", t):
            return float(t)
        if re.fullmatch(r"(?:\d+-)?\d+(?::\d+){1,2}", t):
            days, _, clock = t.rpartition("-")
            nums = [int(x) for x in clock.split(":")]
            while len(nums) < 3:
                nums.insert(0, 0)
            return int(days or 0) * 86400 + nums[0] * 3600 + nums[1] * 60 + nums[2]
        pos, total = 0, 0.0
        for m in _PART.finditer(t):
            if m.start() != pos:
                break
            total += float(m.group(1)) * _UNIT[m.group(2)]
            pos = m.end()
        if pos == len(t) and pos > 0:
            return total
    except ValueError:
        pass
    raise UsageError(
        "is not a duration; write e.g. 90s, 15m, 2h, 1h30m or 01:30:00", obj=f"{what} {text!r}"
    )


def format_duration(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def compact_duration(seconds: float) -> str:
    """A duration the way users write one, without zero parts: 45s, 2m, 1m20s, 1h, 2h30m.

    Rounded to whole seconds (up to whole minutes past an hour), never down to zero."""
    s = max(1, round(seconds)) if seconds > 0 else 0
    if s >= 3600:
        s = 60 * -(-s // 60)
    d, rest = divmod(s, 86400)
    h, rest = divmod(rest, 3600)
    m, sec = divmod(rest, 60)
    parts = [(d, "d"), (h, "h"), (m, "m"), (sec, "s")]
    return "".join(f"{n}{u}" for n, u in parts if n) or "0s"
