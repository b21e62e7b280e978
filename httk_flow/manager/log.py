"""Manager log lines: one per transition, as text or as one JSON object a line."""

from __future__ import annotations

import sys
import time
from typing import IO, Any

import orjson


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

    def info(self, message: str, **fields: Any) -> None:
        self._emit("info", {"message": message, **fields}, message)

    def problem(self, obj: str, message: str) -> None:
        self._emit("problem", {"object": obj, "message": message}, f"problem: {obj}: {message}")
