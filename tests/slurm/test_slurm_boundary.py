"""The Slurm backend's boundary without a cluster: what is sent to sbatch, how answers are
parsed, and that a controller that does not answer is never read as "not found".

These run anywhere (no `slurm` mark): the client commands are replaced by a fake runner
that answers with text captured from Slurm 22.05."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path

import pytest

from httk_flow.scale.backends.base import AllocationRequest, BackendUnavailable, Outcome, Phase
from httk_flow.scale.backends.slurm import BACKEND, COMMANDS, SUBMIT_ARG_FLAGS, SlurmBackend
from httk_flow.scale.backends.slurm.commands import CommandResult, run_command
from httk_flow.scale.backends.slurm.parse import (
    observation,
    parse_end_time,
    parse_job_id,
    parse_scontrol,
    parse_squeue,
)
from httk_flow.scale.backends.slurm.script import batch_script, check_request, sbatch_argv

DOWN = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n"
SCONTROL = (
    "JobId=4 JobName=flow-abc UserId=root(0) JobState=CANCELLED Reason=Resources "
    "Dependency=(null) ExitCode=0:0 StartTime=2026-11-30T13:12:20 NodeList= "
    "Comment=token=abc StdOut=/tmp/x y.out\n"
)


class FakeSlurm:
    """Answers commands from a table of (argv prefix -> result); records every call."""

    def __init__(self, answers: dict[str, tuple[int, str, str]]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str], timeout: float, stdin: str | None) -> CommandResult:
        args = tuple(argv)
        self.calls.append(args)
        line = " ".join(args)
        for prefix, (rc, out, err) in self.answers.items():
            if line.startswith(prefix):
                return CommandResult(args, rc, out, err)
        raise AssertionError(f"unexpected command: {line}")


def request(**kw: object) -> AllocationRequest:
    fields: dict[str, object] = {"workspace": "/ws/a b", "token": "a1b2", "log_dir": "/ws/logs"}
    fields.update(kw)
    return AllocationRequest(**fields)  # type: ignore[arg-type]


def test_the_backend_is_found_with_its_command_and_submission_flag() -> None:
    from httk_flow.scale import backends

    assert backends.get("slurm") is BACKEND
    assert [c.name for c in COMMANDS] == ["sbatch"]
    assert SUBMIT_ARG_FLAGS == ["--sbatch-arg"]
    assert "--sbatch-arg" in backends.submit_arg_flags()


def test_sbatch_gets_the_token_the_drain_signal_the_time_and_the_extra_args_last() -> None:
    argv = sbatch_argv(request(time=61.0, drain=90.5, extra_args=("--time=5", "-p", "short")))
    assert argv[:2] == ["sbatch", "--parsable"]
    assert "--job-name=flow-a1b2" in argv
    assert "--comment=token=a1b2" in argv
    assert "--signal=B:TERM@91" in argv
    assert "--time=2" in argv  # minutes, rounded up
    assert "--output=/ws/logs/flow-a1b2-%j.out" in argv
    assert argv[-3:] == ["--time=5", "-p", "short"]  # a user's own value wins
    assert not any(a.startswith("--time") for a in sbatch_argv(request()))  # none: the default


def test_the_batch_script_exports_the_token_and_execs_the_manager() -> None:
    text = batch_script(request(serve_args=("--pool", "gpu nodes")), python="/py/bin/python")
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert "export FLOW_ALLOCATION_TOKEN=a1b2" in lines
    [serve] = [ln for ln in lines if ln.startswith("serve=(")]
    assert serve.startswith("serve=(/py/bin/python -m httk_flow serve -w '/ws/a b' ")
    assert serve.endswith("--pool 'gpu nodes')")
    # on one node the manager is the batch shell (several: test_scale_shapes.py)
    assert '    exec "${serve[@]}"' in lines


def test_a_drain_as_long_as_the_walltime_is_refused() -> None:
    assert check_request(request(time=60.0, drain=10.0)) is None
    assert "shorter than the walltime" in (check_request(request(time=60.0, drain=60.0)) or "")
    assert check_request(request(token="a b")) is not None


def test_squeue_and_scontrol_answers_become_observations() -> None:
    rows = parse_squeue(
        "7|RUNNING|vm|token=abc|None\n"
        "8|PENDING|n/a|(null)|Resources\n"
        "9|CANCELLED||token=x|Resources\n"
        "10|TIMEOUT|vm|token=y|TimeLimit\n"
        "garbage\n"
    )
    assert [r.job_id for r in rows] == ["7", "8", "9", "10"]
    assert rows[0].token == "abc" and rows[1].token is None
    phases = [observation(r).phase for r in rows]
    assert phases == [Phase.RUNNING, Phase.PENDING, Phase.FAILED, Phase.DONE]
    [row] = parse_scontrol(SCONTROL)
    assert (row.job_id, row.state, row.started, row.token) == ("4", "CANCELLED", False, "abc")
    assert observation(row).phase is Phase.FAILED  # cancelled before it ever started


def test_job_ids_and_end_times_are_parsed() -> None:
    assert parse_job_id("123\n") == "123"
    assert parse_job_id("123;cluster\n") == "123"
    assert parse_job_id("Submitted batch job 5\n") is None
    end = parse_end_time("2026-11-30T13:20:38", "4:59")
    assert end == dt.datetime(2026, 11, 30, 13, 20, 38).timestamp()
    assert parse_end_time("2027-11-30T13:10:43", "UNLIMITED") is None
    assert parse_end_time("N/A") is None


def test_an_unanswering_controller_is_unavailable_never_not_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    fake = FakeSlurm({cmd: (1, "", DOWN) for cmd in ("squeue", "scontrol", "scancel", "sbatch")})
    backend = SlurmBackend(fake)
    with pytest.raises(BackendUnavailable, match="Unable to contact"):
        backend.find_by_token("/ws", "abc")
    with pytest.raises(BackendUnavailable):
        backend.observe(["7"])
    with pytest.raises(BackendUnavailable):
        backend.cancel("7")
    assert backend.allocation_end() is None  # outside a job: no question asked
    assert "not answering" in backend.diagnostics()["controller"]


def test_an_unknown_job_id_is_an_answer() -> None:
    invalid = (1, "", "slurm_load_jobs error: Invalid job id specified\n")
    backend = SlurmBackend(FakeSlurm({"squeue": invalid, "scontrol": invalid}))
    assert backend.observe(["7"])["7"].phase is Phase.UNKNOWN
    assert backend.observe(["x"])["x"].phase is Phase.UNKNOWN


def test_squeue_leaves_out_a_job_and_scontrol_answers_for_it() -> None:
    fake = FakeSlurm(
        {"squeue": (0, "7|RUNNING|vm|token=a|None\n", ""), "scontrol": (0, SCONTROL, "")}
    )
    obs = SlurmBackend(fake).observe(["7", "4"])
    assert obs["7"].phase is Phase.RUNNING and obs["4"].phase is Phase.FAILED
    assert fake.calls[-1] == ("scontrol", "show", "job", "-o", "4")


def test_find_by_token_checks_the_comment_too() -> None:
    fake = FakeSlurm(
        {"squeue": (0, "7|RUNNING|vm|token=other|None\n8|PENDING||token=abc|None\n", "")}
    )
    assert SlurmBackend(fake).find_by_token("/ws", "abc") == "8"
    assert fake.calls[0][:6] == ("squeue", "-h", "-t", "all", "--name", "flow-abc")
    nothing = FakeSlurm({"squeue": (0, "", "")})
    assert SlurmBackend(nothing).find_by_token("/ws", "abc") is None


def test_submit_tells_created_rejected_and_unavailable_apart(tmp_path: Path) -> None:
    req = request(log_dir=str(tmp_path))
    created = SlurmBackend(FakeSlurm({"sbatch": (0, "42\n", "")})).submit(req)
    assert (created.outcome, created.handle) == (Outcome.CREATED, "42")
    refused = (
        1,
        "",
        "sbatch: error: Batch job submission failed: Invalid partition name specified\n",
    )
    rejected = SlurmBackend(FakeSlurm({"sbatch": refused})).submit(req)
    assert rejected.outcome is Outcome.REJECTED and "Invalid partition" in rejected.reason
    down = (
        1,
        "",
        "sbatch: error: Batch job submission failed: Unable to contact slurm controller\n",
    )
    with pytest.raises(BackendUnavailable):
        SlurmBackend(FakeSlurm({"sbatch": down})).submit(req)
    odd = SlurmBackend(FakeSlurm({"sbatch": (0, "hello\n", "")})).submit(req)
    assert odd.outcome is Outcome.UNKNOWN


def test_cancel_drains_a_running_manager_and_cancels_a_pending_job() -> None:
    running = FakeSlurm({"squeue": (0, "7|RUNNING|vm|token=a|None\n", ""), "scancel": (0, "", "")})
    SlurmBackend(running).cancel("7")
    assert running.calls[-1] == ("scancel", "-b", "-s", "TERM", "7")
    pending = FakeSlurm(
        {"squeue": (0, "7|PENDING||token=a|Resources\n", ""), "scancel": (0, "", "")}
    )
    SlurmBackend(pending).cancel("7")
    assert ("scancel", "--state=PENDING", "7") in pending.calls
    assert not any("-b" in c for c in pending.calls)
    ended = FakeSlurm({"squeue": (0, "7|COMPLETED|vm|token=a|None\n", "")})
    SlurmBackend(ended).cancel("7")
    assert all(c[0] == "squeue" for c in ended.calls)


def test_a_command_that_hangs_is_unavailable_and_a_missing_one_answers_127() -> None:
    with pytest.raises(BackendUnavailable, match="did not answer"):
        run_command(["sleep", "5"], 0.2)
    assert run_command(["/nonexistent/squeue"], 5).returncode == 127


def test_inside_a_job_its_end_comes_from_squeue(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    fake = FakeSlurm({"squeue -h -j 7 -o %e|%L": (0, "2026-11-30T13:20:38|4:59\n", "")})
    assert SlurmBackend(fake).allocation_end() == dt.datetime(2026, 11, 30, 13, 20, 38).timestamp()
    down = FakeSlurm({"squeue": (1, "", DOWN)})
    assert SlurmBackend(down).allocation_end() is None  # the manager runs without a known end
