"""Slurm's text answers parsed at the boundary into typed values.

squeue is asked for `%i|%T|%B|%k|%r` (job id, long state, batch host, comment, reason:
the reason last because it is free text); `scontrol show job -o` answers one line of
Key=Value pairs. Both become a JobRow, and a JobRow becomes an Observation.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from httk_flow.scale.backends.base import Observation, Phase

#: the squeue format every query uses (see JobRow)
SQUEUE_FORMAT = "%i|%T|%B|%k|%r"

#: not started yet (or put back in the queue)
PENDING_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESV_DEL_HOLD",
        "SPECIAL_EXIT",
    }
)
#: holding an allocation (the manager may be running, suspended, or being cleaned up)
RUNNING_STATES = frozenset(
    {"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING", "SUSPENDED", "STOPPED"}
)
#: gone for good
ENDED_STATES = frozenset(
    {
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
        "REVOKED",
    }
)
#: what squeue and scontrol print for "no value"
_EMPTY = frozenset({"", "n/a", "(null)", "none", "unknown"})

_JOB_ID = re.compile(r"\d+(?:_\d+)?")


@dataclass(frozen=True)
class JobRow:
    """One job as the controller describes it."""

    job_id: str
    state: str
    batch_host: str = ""
    comment: str = ""
    reason: str = ""

    @property
    def started(self) -> bool:
        """A batch host was assigned: the batch script was (at least) launched."""
        return self.batch_host.strip().lower() not in _EMPTY

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES

    @property
    def pending(self) -> bool:
        return self.state in PENDING_STATES

    @property
    def token(self) -> str | None:
        """The token in the comment (`token=<token>`), if any."""
        for word in self.comment.replace(",", " ").split():
            key, sep, value = word.partition("=")
            if sep and key == "token" and value:
                return value
        return None


def is_job_id(text: str) -> bool:
    return _JOB_ID.fullmatch(text) is not None


def _value(text: str) -> str:
    return "" if text.strip().lower() in _EMPTY else text.strip()


def parse_squeue(text: str) -> list[JobRow]:
    """Rows of `squeue -h -o SQUEUE_FORMAT`; lines that are not rows are skipped."""
    rows = []
    for line in text.splitlines():
        parts = line.strip().split("|", 4)
        if len(parts) != 5 or not is_job_id(parts[0]):
            continue
        job_id, state, host, comment, reason = parts
        rows.append(JobRow(job_id, _state(state), _value(host), _value(comment), _value(reason)))
    return rows


_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")


def parse_scontrol(text: str) -> list[JobRow]:
    """Rows of `scontrol show job -o` (one job per line, `Key=Value` pairs)."""
    rows = []
    for line in text.splitlines():
        fields = _pairs(line.strip())
        job_id = fields.get("JobId", "")
        if not is_job_id(job_id):
            continue
        host = fields.get("BatchHost") or fields.get("NodeList", "")
        rows.append(
            JobRow(
                job_id,
                _state(fields.get("JobState", "")),
                _value(host),
                _value(fields.get("Comment", "")),
                _value(fields.get("Reason", "")),
            )
        )
    return rows


def _pairs(line: str) -> dict[str, str]:
    """Key=Value pairs where a value runs up to the next ` Key=` (values may hold spaces)."""
    out: dict[str, str] = {}
    matches = list(_KEY.finditer(line))
    for m, nxt in zip(matches, [*matches[1:], None], strict=True):
        end = nxt.start() if nxt is not None else len(line)
        out.setdefault(m.group(1), line[m.end() : end].strip())
    return out


def _state(text: str) -> str:
    # `scontrol` may add flags (`CANCELLED by 0`); squeue prints the bare long name
    word = text.strip().split(" ", 1)[0].upper()
    return word.rstrip("+")


def observation(row: JobRow) -> Observation:
    """What the reconciler needs to know about one job."""
    detail = {"state": row.state, "reason": row.reason, "batch_host": row.batch_host}
    why = row.state if not row.reason else f"{row.state} ({row.reason})"
    if row.pending:
        return Observation(Phase.PENDING, why, detail)
    if row.state in RUNNING_STATES:
        return Observation(Phase.RUNNING, why, detail)
    if row.ended:
        if row.started:
            return Observation(Phase.DONE, why, detail)
        return Observation(Phase.FAILED, f"{why} before it started", detail)
    # a state this version does not know: keep the allocation counted, claim nothing more
    return Observation(Phase.PENDING, f"unrecognised job state {row.state!r}", detail)


def parse_job_id(stdout: str) -> str | None:
    """The job id `sbatch --parsable` printed (`<id>` or `<id>;<cluster>`), if any."""
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        return None
    job_id = lines[-1].split(";", 1)[0]
    return job_id if is_job_id(job_id) else None


def parse_end_time(text: str, time_left: str = "") -> float | None:
    """Unix time of `squeue -o %e` (the controller's local time), None when unlimited."""
    if time_left.strip().upper() in ("UNLIMITED", "NOT_SET", "INVALID"):
        return None
    value = text.strip()
    for fmt in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"):
        try:
            return dt.datetime.strptime(value, fmt).timestamp()
        except ValueError:
            continue
    return None
