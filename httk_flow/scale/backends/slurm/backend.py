"""The Slurm allocation backend: sbatch to submit, squeue/scontrol to observe, scancel to
end, and the token in both the job name and the comment to find a submission again.

A controller that does not answer raises BackendUnavailable from every query: the
reconciler then moves no state. "Not found" is only ever concluded from an answer.
"""

from __future__ import annotations

import os

from httk_flow.scale.backends.base import (
    AllocationRequest,
    BackendUnavailable,
    Observation,
    Outcome,
    Phase,
    SubmitResult,
)
from httk_flow.scale.backends.slurm.commands import (
    QUERY_TIMEOUT,
    SUBMIT_TIMEOUT,
    CommandResult,
    Runner,
    checked,
    run_command,
)
from httk_flow.scale.backends.slurm.parse import (
    SQUEUE_FORMAT,
    JobRow,
    is_job_id,
    observation,
    parse_end_time,
    parse_job_id,
    parse_scontrol,
    parse_squeue,
)
from httk_flow.scale.backends.slurm.script import (
    SIGNAL_MARGIN,
    batch_script,
    check_request,
    default_log_dir,
    job_name,
    sbatch_argv,
)

#: set by Slurm inside every job (batch script, srun task, salloc shell)
JOB_ID_ENV = "SLURM_JOB_ID"
#: seconds a manager waits at its start to learn when its allocation ends
END_TIMEOUT = 20.0


class SlurmBackend:
    name = "slurm"
    signal_margin = SIGNAL_MARGIN

    def __init__(
        self,
        runner: Runner = run_command,
        *,
        query_timeout: float = QUERY_TIMEOUT,
        submit_timeout: float = SUBMIT_TIMEOUT,
    ) -> None:
        self.runner = runner
        self.query_timeout = query_timeout
        self.submit_timeout = submit_timeout

    def _query(self, *argv: str, timeout: float | None = None) -> CommandResult:
        return checked(self.runner(argv, timeout or self.query_timeout, None))

    # -- submit ----------------------------------------------------------------------

    def submit(self, request: AllocationRequest) -> SubmitResult:
        problem = check_request(request)
        if problem:
            return SubmitResult(Outcome.REJECTED, reason=problem)
        log_dir = request.log_dir or default_log_dir(request.workspace)
        try:
            os.makedirs(log_dir, exist_ok=True)
        except OSError as e:
            return SubmitResult(Outcome.REJECTED, reason=f"cannot create {log_dir}: {e}")
        # a timeout raises BackendUnavailable: the job may exist, the token will tell
        res = self.runner(sbatch_argv(request), self.submit_timeout, batch_script(request))
        if res.ok:
            job_id = parse_job_id(res.stdout)
            if job_id is None:
                return SubmitResult(
                    Outcome.UNKNOWN, reason=f"sbatch answered no job id: {res.message}"
                )
            return SubmitResult(Outcome.CREATED, job_id)
        if res.unreachable:
            raise BackendUnavailable(f"failed ({res.message})", obj="sbatch")
        return SubmitResult(Outcome.REJECTED, reason=f"sbatch refused: {res.message}")

    # -- observe ---------------------------------------------------------------------

    def _rows(self, job_ids: list[str]) -> dict[str, JobRow]:
        """What squeue says about these jobs, then scontrol for the ones it left out."""
        rows: dict[str, JobRow] = {}
        if not job_ids:
            return rows
        res = self._query("squeue", "-h", "-t", "all", "-j", ",".join(job_ids), "-o", SQUEUE_FORMAT)
        for row in parse_squeue(res.stdout):
            rows.setdefault(row.job_id, row)
        for job_id in job_ids:
            if job_id in rows:
                continue
            res = self._query("scontrol", "show", "job", "-o", job_id)
            for row in parse_scontrol(res.stdout):
                if row.job_id == job_id:
                    rows[job_id] = row
        return rows

    def observe(self, handles: list[str]) -> dict[str, Observation]:
        out: dict[str, Observation] = {}
        ids = sorted({h for h in handles if is_job_id(h)}, key=_order)
        rows = self._rows(ids)
        for h in handles:
            if not is_job_id(h):
                out[h] = Observation(Phase.UNKNOWN, "not a Slurm job id")
            elif h in rows:
                out[h] = observation(rows[h])
            else:
                out[h] = Observation(Phase.UNKNOWN, "the controller no longer knows this job")
        return out

    # -- find by token ---------------------------------------------------------------

    def find_by_token(self, workspace: str, token: str) -> str | None:
        res = self._query(
            "squeue", "-h", "-t", "all", "--name", job_name(token), "-o", SQUEUE_FORMAT
        )
        # the comment is a second check: a job of that name carrying another token is
        # not ours (a site that drops comments leaves it empty: the name decides then)
        rows = [r for r in parse_squeue(res.stdout) if r.token in (None, token)]
        if not rows:
            return None
        # normally exactly one; if ever more, the live one with the lowest id
        rows.sort(key=lambda r: (r.ended, _order(r.job_id)))
        return rows[0].job_id

    # -- cancel ----------------------------------------------------------------------

    def cancel(self, handle: str) -> None:
        """Drain a running manager (`scancel -b -s TERM`); cancel a pending job outright.

        `scancel --state=PENDING` is atomic in the controller: it cancels the job only
        if it has not started, so a job that starts meanwhile is drained instead.
        Idempotent for a job that ended; a running manager signalled again later takes
        it as its second signal (exit at once), as a manager does with any TERM."""
        if not is_job_id(handle):
            return
        row = self._rows([handle]).get(handle)
        if row is None or row.ended:
            return
        if row.state == "PENDING":
            self._scancel("--state=PENDING", handle)
            row = self._rows([handle]).get(handle)
            if row is None or row.ended or row.state == "PENDING":
                return
        if row.pending:
            # configuring, held or requeued: no manager runs yet, nothing to drain
            self._scancel(handle)
        elif row.state != "COMPLETING":
            self._scancel("-b", "-s", "TERM", handle)

    def _scancel(self, *args: str) -> None:
        res = self.runner(("scancel", *args), self.query_timeout, None)
        if res.ok:
            return
        low = res.stderr.lower()
        if res.invalid_job or "already completing or completed" in low:
            return  # ended meanwhile: what was asked for has happened
        raise BackendUnavailable(f"failed ({res.message})", obj="scancel")

    # -- about the system and this process ---------------------------------------------

    def diagnostics(self) -> dict[str, str]:
        out = {"backend": self.name}
        try:
            version = self._query("sbatch", "--version")
            out["version"] = version.stdout.strip()
            info = self._query("sinfo", "-h", "-o", "%P %a %l %D %t %N")
            out["sinfo"] = info.stdout.strip()
            out["controller"] = "answering"
        except BackendUnavailable as e:
            out["controller"] = f"not answering: {e.render()}"
        return out

    def current_job(self) -> tuple[str, str] | None:
        """This process's Slurm job, from the environment alone, and the line slurmstepd
        writes into the job's output whenever it sends the job TERM: at the `--signal`
        drain, on `scancel` (`-b -s TERM` too) and at the time limit (`DUE TO TIME LIMIT`)."""
        job_id = os.environ.get(JOB_ID_ENV, "")
        if not is_job_id(job_id):
            return None
        return f"Slurm job {job_id}", f"*** JOB {job_id} ON <node> CANCELLED AT <time> ***"

    def allocation_id(self) -> str | None:
        job_id = os.environ.get(JOB_ID_ENV, "")
        return job_id if is_job_id(job_id) else None

    def allocation_end(self) -> float | None:
        job_id = os.environ.get(JOB_ID_ENV, "")
        if not is_job_id(job_id):
            return None
        try:
            # asked once as a manager starts: do not hold the start up for long
            res = self._query("squeue", "-h", "-j", job_id, "-o", "%e|%L", timeout=END_TIMEOUT)
        except BackendUnavailable:
            return None  # without an answer the manager runs without a known end
        for line in res.stdout.splitlines():
            end, _, left = line.partition("|")
            return parse_end_time(end, left)
        return None


def _order(job_id: str) -> tuple[int, int]:
    base, _, task = job_id.partition("_")
    return int(base), int(task or 0)
