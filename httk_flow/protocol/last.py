"""`last`: the vocabulary of how a job's previous activity ended, as a frame records it
and as the next attempt is told it (`previous_end`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class LastKind(enum.Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    ADVANCED = "advanced"
    PAUSED = "paused"
    WAITING = "waiting"
    JOINED = "joined"
    RESUMED = "resumed"
    INTERRUPTED = "interrupted"
    RETRYING = "retrying"  # a charged failure or a requested retry; the text says which
    OTHER = "other"  # a word this version does not know (kept, never acted upon)


#: failure codes written as `last` when a job is failed by the engine
_FAILURE_WORDS = frozenset(
    {
        "protocol_error",
        "budget_exhausted",
        "manager_deaths",
        "interrupted_too_often",
        "commit_error",
        "time_limit",
        "program_not_found",
        "program_not_executable",
        "program_changed",
    }
)
_RETRY_PREFIXES = ("process failure:", "retry requested:", "time limit ")


@dataclass(frozen=True, slots=True)
class Last:
    """`last`: its kind (what the engine acts upon) and its text (what the job is told
    as `previous_end`, and what is written)."""

    kind: LastKind
    text: str

    @classmethod
    def of(cls, kind: LastKind) -> Last:
        return cls(kind, kind.value)

    @classmethod
    def failed(cls, code: str) -> Last:
        return cls(LastKind.FAILED, code)

    @classmethod
    def retrying(cls, why: str) -> Last:
        return cls(LastKind.RETRYING, why)

    @classmethod
    def parse(cls, text: str) -> Last:
        for kind in LastKind:
            if text == kind.value and kind not in (LastKind.RETRYING, LastKind.OTHER):
                return cls(kind, text)
        if text in _FAILURE_WORDS:
            return cls(LastKind.FAILED, text)
        if text.startswith(_RETRY_PREFIXES):
            return cls(LastKind.RETRYING, text)
        return cls(LastKind.OTHER, text)

    @property
    def unclean(self) -> bool:
        """The previous attempt was stopped from outside: the next start is a restart."""
        return self.kind is LastKind.INTERRUPTED
