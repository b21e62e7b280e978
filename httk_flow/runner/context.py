"""What an attempt knows about itself: the manager's environment and context.json, the
children of the join before this step, the job's typed parameters, and the errors the
runner API raises."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from httk_flow.errors import FlowError
from httk_flow.protocol import layout
from httk_flow.protocol.states import State

ParamValue = str | int | float | bool


class RunnerError(FlowError):
    """The runner API was misused, or the attempt cannot publish its outcome."""


class DuplicateOutcome(RunnerError):
    """A second outcome in one attempt: the job fails with a protocol error."""


@dataclass(frozen=True)
class Child:
    """One child of the join that preceded this step (a line of the `children` file)."""

    label: str
    id: str
    state: State | None  # None: no marker was found for it
    path: str  # the child's job directory

    @property
    def succeeded(self) -> bool:
        return self.state is State.SUCCEEDED


@dataclass(frozen=True)
class Attempt:
    """What the manager says about this attempt (environment and context.json)."""

    control_dir: str
    step: str
    job_id: str
    job_dir: str
    workdir: str
    attempt_id: str
    attempt: int
    is_restart: bool
    unclean_restart: bool
    previous_end: str | None
    durable: bool
    array_index: int | None
    #: where the program was submitted from (FLOW_PROGRAM_SOURCE), and the bundle it
    #: runs inside (FLOW_BUNDLE_DIR); None when the attempt has none
    program_source: str | None = None
    bundle_dir: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Attempt:
        control = env.get(layout.ENV_CONTROL_DIR)
        if not control:
            raise RunnerError(
                f"{layout.ENV_CONTROL_DIR} is not set",
                hint="run this program through flow (flow submit, then flow run)",
            )
        ctx: dict[str, Any] = {}
        path = env.get(layout.ENV_CONTEXT) or layout.context_file(control)
        try:
            with open(path, "rb") as fh:
                loaded = orjson.loads(fh.read())
            if isinstance(loaded, dict):
                ctx = loaded
        except (OSError, orjson.JSONDecodeError):
            pass  # the environment carries everything essential
        prev = ctx.get("previous_end") or env.get(layout.ENV_PREVIOUS_END)
        index = env.get(layout.ENV_ARRAY_INDEX)
        return cls(
            control_dir=control,
            step=env.get(layout.ENV_STEP, "main"),
            job_id=env.get(layout.ENV_JOB_ID, ""),
            job_dir=env.get(layout.ENV_JOB_DIR, ""),
            workdir=env.get(layout.ENV_WORKDIR, os.getcwd()),
            attempt_id=env.get(layout.ENV_ATTEMPT_ID, ""),
            attempt=int(ctx.get("attempt", env.get(layout.ENV_ATTEMPT, "1"))),
            is_restart=bool(ctx.get("is_restart", env.get(layout.ENV_IS_RESTART) == "1")),
            unclean_restart=bool(
                ctx.get("unclean_restart", env.get(layout.ENV_UNCLEAN_RESTART) == "1")
            ),
            previous_end=prev if isinstance(prev, str) else None,
            durable=env.get(layout.ENV_DURABLE) == "1",
            array_index=int(index) if index else None,
            program_source=env.get(layout.ENV_PROGRAM_SOURCE) or _str(ctx, "program_source"),
            bundle_dir=env.get(layout.ENV_BUNDLE_DIR) or _str(ctx, "bundle_dir"),
        )


def _str(ctx: dict[str, Any], key: str) -> str | None:
    v = ctx.get(key)
    return v if isinstance(v, str) else None


def read_job_params(job_dir: str | None) -> dict[str, ParamValue] | None:
    """`params` of <job_dir>/job.json, keeping their JSON types; None when unreadable."""
    if not job_dir:
        return None
    try:
        with open(layout.job_file(job_dir), "rb") as fh:
            data = orjson.loads(fh.read())
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    params = data.get("params", {})
    if not isinstance(params, dict):
        return None
    return {k: v for k, v in params.items() if isinstance(v, str | int | float | bool)}
