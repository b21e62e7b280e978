"""How many inputs each fuzzed parser was handed in this run (printed at the end)."""

from __future__ import annotations

from collections import Counter

TRIED: Counter[str] = Counter()


def tried(parser: str, n: int = 1) -> None:
    TRIED[parser] += n
