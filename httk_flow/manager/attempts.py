"""An attempt's directory, context.json and environment, prepared before launch."""

from __future__ import annotations

import errno
import functools
import os
import sys
from dataclasses import dataclass
from typing import Any

import orjson

from httk_flow.fsio import write_file
from httk_flow.jobspec import JobSpec
from httk_flow.journal import Frame
from httk_flow.names import attempt_name
from httk_flow.workspace import Workspace

#: reasons a previous attempt ended that make the next start an unclean restart
UNCLEAN = frozenset({"interrupted"})
_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bash_api_path() -> str:
    """shell/flow.sh of a source checkout, else the copy shipped inside the package."""
    repo = os.path.join(os.path.dirname(_PKG), "shell", "flow.sh")
    return repo if os.path.isfile(repo) else os.path.join(_PKG, "shell", "flow.sh")


BASH_API = bash_api_path()


@functools.cache
def _base_env() -> tuple[tuple[str, str], ...]:
    """The manager's environment, copied once: every attempt starts from it."""
    return tuple(os.environ.items())


def _check_inside(ws: Workspace, job_dir: str, attempts: str) -> None:
    """A job directory or attempts/ that is a symlink out of the workspace is refused."""
    for p in (job_dir, attempts):
        if os.path.islink(p):
            raise OSError(errno.ELOOP, "is a symbolic link; refusing to write through it", p)
    real = os.path.realpath(job_dir)
    root = os.path.realpath(ws.root)
    if not real.startswith(root + os.sep):
        raise OSError(errno.EXDEV, "lies outside the workspace", job_dir)


def attempt_dir(ws: Workspace, placement: str, key: str, number: int) -> str:
    """Where attempt `number` of a job lives: derived, never read from a frame."""
    return os.path.join(ws.job_dir(placement, key), "attempts", attempt_name(number))


@dataclass(frozen=True)
class AttemptPlan:
    """Everything needed to start one attempt."""

    name: str
    dir: str
    workdir: str
    argv: list[str]
    env: dict[str, str]
    stdout: str
    stderr: str


def prepare(
    ws: Workspace,
    spec: JobSpec,
    frame: Frame,
    *,
    number: int,
    extra_context: dict[str, Any] | None = None,
) -> AttemptPlan:
    """Make the attempt directory and context.json; return the plan to launch."""
    job_dir = ws.job_dir(spec.placement, spec.key)
    name = attempt_name(number)
    adir = os.path.join(job_dir, "attempts", name)
    _check_inside(ws, job_dir, os.path.dirname(adir))
    try:
        os.mkdir(adir)
    except FileNotFoundError:
        os.makedirs(adir)  # the job's first attempt: make attempts/ too
    if spec.workdir == "persistent":
        workdir = os.path.join(job_dir, "run")
        try:
            os.mkdir(workdir)
        except FileExistsError:
            pass
    else:
        workdir = os.path.join(adir, "work")
        os.mkdir(workdir)
    step = str(frame.get("step", spec.step))
    tried = int(frame.get("try", 1))
    last = frame.get("last")
    # an uncharged interruption hands its try back, yet the next start is a restart
    unclean = last in UNCLEAN
    restart = tried > 1 or unclean
    context: dict[str, Any] = {
        "workspace": ws.root,
        "job_id": spec.id,
        "key": spec.key,
        "job_dir": job_dir,
        "step": step,
        "activation": int(frame.get("act", 1)),
        "attempt": tried,
        "attempt_id": name,
        "attempt_number": number,
        "is_restart": restart,
        "unclean_restart": unclean,
        "previous_end": last if restart else None,
        "workdir": workdir,
        "params": spec.params,
        "array_index": spec.array_index,
    }
    if extra_context:
        context.update(extra_context)
    kids = context.get("children")
    if isinstance(kids, list):
        # flow_children reads this plain file: bash needs no JSON parser
        lines = "".join(f"{c['label']} {c['id']} {c['state']} {c['path']}\n" for c in kids)
        write_file(os.path.join(adir, "children"), lines.encode(), durable=False)
    ctx_path = os.path.join(adir, "context.json")
    write_file(ctx_path, orjson.dumps(context), durable=ws.policy.durable)
    if spec.program.digest:
        argv = [ws.program_path(spec.program.digest), *spec.args]
    else:
        argv = [spec.program.command or "false", *spec.args]
    env = dict(_base_env())
    env.update(
        FLOW_WORKSPACE_DIR=ws.root,
        FLOW_JOB_DIR=job_dir,
        FLOW_JOB_ID=spec.id,
        FLOW_JOB_KEY=spec.key,
        FLOW_STEP=step,
        FLOW_ATTEMPT_ID=name,
        FLOW_ATTEMPT=str(tried),
        FLOW_CONTROL_DIR=adir,
        FLOW_WORKDIR=workdir,
        FLOW_CONTEXT=ctx_path,
        FLOW_IS_RESTART="1" if restart else "0",
        FLOW_UNCLEAN_RESTART="1" if unclean else "0",
        FLOW_DURABLE="1" if ws.policy.durable else "0",
        FLOW_BASH_API=BASH_API,
        FLOW_PYTHON=sys.executable,
    )
    if spec.array_index is not None:
        env["FLOW_ARRAY_INDEX"] = str(spec.array_index)
    for k, v in spec.params.items():
        env[f"FLOW_PARAM_{k}"] = v if isinstance(v, str) else orjson.dumps(v).decode()
    return AttemptPlan(
        name,
        adir,
        workdir,
        argv,
        env,
        os.path.join(adir, "stdout"),
        os.path.join(adir, "stderr"),
    )
