"""Manager log lines: one per transition, as text or as one JSON object a line.

The transition lines are not written by hand: `ManagerLog.observe` is installed as the
workspace's transition observer, so every move the manager makes is logged exactly once.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

import orjson

from httk_flow.protocol.frames import Frame
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import JobHandle


class ManagerLog:
    def __init__(
        self,
        manager_id: str,
        fmt: str = "text",
        stream: IO[str] | None = None,
        enabled: bool = True,
    ) -> None:
        self.id = manager_id
        self.fmt = fmt
        self.stream = stream or sys.stderr
        self.enabled = enabled

    def _emit(self, event: str, fields: dict[str, Any], text: str) -> None:
        # quiet managers still report problems: a broken job must never go unmentioned
        if not self.enabled and event != "problem":
            return
        now = time.time()
        if self.fmt == "json":
            line = orjson.dumps(
                {"t": round(now, 3), "manager": self.id, "event": event, **fields}
            ).decode()
        else:
            stamp = time.strftime("%H:%M:%S", time.localtime(now))
            line = f"{stamp} {self.id} {text}"
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass  # a closed log never stops the manager

    def transition(self, key: str, src: str, dst: str, why: str = "") -> None:
        self._emit(
            "transition",
            {"job": key, "from": src, "to": dst, "why": why},
            f"{key} {src} -> {dst}" + (f" ({why})" if why else ""),
        )

    def observe(self, old: JobHandle, new: JobHandle, frame: Frame, note: str | None) -> None:
        """The workspace's transition observer: one line for the move just made.

        Its reason is the caller's note, else the frame's `why`; a move to failed also
        names the failure code (`fail: bad_input`), the word an operator searches for.
        """
        if not self.enabled:
            return
        failure = frame.body.failure
        code = failure.code if failure is not None else None
        why = note if note is not None else frame.body.why or ""
        if new.state is State.FAILED and code and code != why:
            why = f"{why}: {code}" if why else code
        self.transition(old.key, old.state.value, new.state.value, why)

    def info(self, message: str, **fields: Any) -> None:
        self._emit("info", {"message": message, **fields}, message)

    def problem(self, obj: str, message: str) -> None:
        self._emit("problem", {"object": obj, "message": message}, f"problem: {obj}: {message}")
