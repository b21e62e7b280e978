"""An attempt's directory, context.json and environment, prepared before launch."""

from __future__ import annotations

import errno
import functools
import os
import sys
from dataclasses import dataclass
from typing import Any

import orjson

from httk_flow.manager.interp import bash_for, gates_in
from httk_flow.protocol import layout, programs
from httk_flow.protocol.frames import Snapshot
from httk_flow.protocol.fsio import real_dir, write_file
from httk_flow.protocol.jobs import find_attempt_dir
from httk_flow.protocol.jobspec import JobSpec
from httk_flow.protocol.names import attempt_name
from httk_flow.protocol.workspace import Workspace

_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: a larger context.json (a big join's children) is written here, as the launcher gets it
#: in one environment string (the kernel caps each at 128 KiB); durable mode writes here
#: too, to fsync it
MAX_LAUNCHER_CONTEXT = 32 * 1024


def bash_api_path() -> str:
    """shell/flow.sh of a source checkout, else the copy shipped inside the package."""
    repo = os.path.join(os.path.dirname(_PKG), "shell", "flow.sh")
    return repo if os.path.isfile(repo) else os.path.join(_PKG, "shell", "flow.sh")


BASH_API = bash_api_path()


@functools.cache
def _base_env() -> tuple[tuple[str, str], ...]:
    """The manager's environment, copied once: every attempt starts from it."""
    return tuple(os.environ.items())


def _check_inside(ws: Workspace, job_dir: str) -> None:
    """A job directory that is a symlink, or lies out of the workspace, is refused."""
    if os.path.islink(job_dir):
        raise OSError(errno.ELOOP, "is a symbolic link; refusing to write through it", job_dir)
    # job_dir itself is no symlink (checked above): its parent's real path places it
    real = os.path.join(real_dir(os.path.dirname(job_dir)), os.path.basename(job_dir))
    if not real.startswith(real_dir(ws.root) + os.sep):
        raise OSError(errno.EXDEV, "lies outside the workspace", job_dir)


def _bash_launcher(program: str, env: dict[str, str]) -> str | None:
    """The bash to start `program` on directly, if its #! names one and `env` keeps the gate."""
    bash = bash_for(program, env.get("PATH", os.defpath))
    return bash if bash is not None and gates_in(env) else None


def attempt_dir(ws: Workspace, placement: str, key: str, number: int) -> str:
    """Where attempt `number` of a job lives (one a manager of revision 5 or older made:
    under attempts/): derived, never read from a frame."""
    return find_attempt_dir(ws.job_dir(placement, key), number)


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
    #: where the launcher says that it could not execute the program
    exec_failure: str
    #: (path, text) of context.json for the launcher to write; None once it is written
    context: tuple[str, str] | None = None
    #: the bash that the program's #! line names: started on it directly (interp.py)
    bash: str | None = None


def prepare(
    ws: Workspace,
    spec: JobSpec,
    snap: Snapshot,
    *,
    number: int,
    extra_context: dict[str, Any] | None = None,
) -> AttemptPlan:
    """Make the attempt directory, aNNNN/ in the job directory (context.json, or leave it
    to the launcher); the plan."""
    job_dir = ws.job_dir(spec.placement, spec.key)
    name = attempt_name(number)
    adir = layout.attempt_dir(job_dir, number)
    _check_inside(ws, job_dir)
    # never an existing one (a link someone put there): the number is this claim's own
    os.mkdir(adir)
    if spec.workdir == "persistent":
        workdir = layout.run_dir(job_dir)
        try:
            os.mkdir(workdir)
        except FileExistsError:
            pass
    else:
        workdir = layout.work_dir(adir)
        os.mkdir(workdir)
    step = snap.step or spec.step
    tried = snap.try_
    last = snap.last
    # an uncharged interruption hands its try back, yet the next start is a restart
    unclean = last is not None and last.unclean
    restart = tried > 1 or unclean
    context: dict[str, Any] = {
        "workspace": ws.root,
        "job_id": spec.id,
        "key": spec.key,
        "job_dir": job_dir,
        "step": step,
        "activation": snap.act,
        "attempt": tried,
        "attempt_id": name,
        "attempt_number": number,
        "is_restart": restart,
        "unclean_restart": unclean,
        "previous_end": last.text if restart and last is not None else None,
        "workdir": workdir,
        "params": spec.params,
        "array_index": spec.array_index,
    }
    where = programs.program_env(ws, spec.program)
    if where:
        context["program_source"] = where.get(layout.ENV_PROGRAM_SOURCE)
        context["bundle_dir"] = where.get(layout.ENV_BUNDLE_DIR)
    if extra_context:
        context.update(extra_context)
    kids = context.get("children")
    if isinstance(kids, list):
        # flow_children reads this plain file: bash needs no JSON parser
        lines = "".join(f"{c['label']} {c['id']} {c['state']} {c['path']}\n" for c in kids)
        write_file(layout.children_list(adir), lines.encode(), durable=False)
    ctx_path = layout.context_file(adir)
    ctx_data = orjson.dumps(context)
    launcher_writes = None
    if ws.policy.durable or len(ctx_data) > MAX_LAUNCHER_CONTEXT:
        write_file(ctx_path, ctx_data, durable=ws.policy.durable)
    else:
        # the launcher creates it beside the manager; the program starts only after that
        launcher_writes = (ctx_path, ctx_data.decode())
    argv = [programs.executable(ws, spec.program), *spec.args]
    env = dict(_base_env())
    env.update(where)
    env.update(
        {
            layout.ENV_WORKSPACE_DIR: ws.root,
            layout.ENV_JOB_DIR: job_dir,
            layout.ENV_JOB_ID: spec.id,
            layout.ENV_JOB_KEY: spec.key,
            layout.ENV_STEP: step,
            layout.ENV_ATTEMPT_ID: name,
            layout.ENV_ATTEMPT: str(tried),
            layout.ENV_CONTROL_DIR: adir,
            layout.ENV_WORKDIR: workdir,
            layout.ENV_CONTEXT: ctx_path,
            layout.ENV_IS_RESTART: "1" if restart else "0",
            layout.ENV_UNCLEAN_RESTART: "1" if unclean else "0",
            layout.ENV_DURABLE: "1" if ws.policy.durable else "0",
            layout.ENV_BASH_API: BASH_API,
            layout.ENV_PYTHON: sys.executable,
        }
    )
    previous = context["previous_end"]
    if previous:
        # an outcome's message may hold a NUL (JSON allows \u0000): no environment string can
        env[layout.ENV_PREVIOUS_END] = previous.replace("\0", "\\0")
    if spec.array_index is not None:
        env[layout.ENV_ARRAY_INDEX] = str(spec.array_index)
    for k, v in spec.params.items():
        env[layout.env_param(k)] = v if isinstance(v, str) else orjson.dumps(v).decode()
    return AttemptPlan(
        name,
        adir,
        workdir,
        argv,
        env,
        layout.stdout_file(adir),
        layout.stderr_file(adir),
        layout.exec_failed_file(adir),
        launcher_writes,
        _bash_launcher(argv[0], env),
    )
