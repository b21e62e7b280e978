"""The Python runner API: a job's program as named steps that each end with one outcome.

    from httk_flow.runner import Runner

    flow = Runner()

    @flow.step
    def prepare(flow: Runner) -> None:
        flow.advance("compute")

    @flow.step
    def compute(flow: Runner) -> None:
        flow.succeed(f"n = {flow.param('n', '1')}")

    raise SystemExit(flow.run())

The rules are those of shell/flow.sh (docs/bash-api.md): exactly one outcome per attempt;
a step that raises, misuses the API or returns without an outcome ends as a fail.
"""

from __future__ import annotations

import datetime
import os
import re
import secrets
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, overload

import orjson

from httk_flow.errors import FlowError
from httk_flow.protocol import layout, names
from httk_flow.protocol.fsio import fsync_dir
from httk_flow.protocol.outcome import Action, JoinMode, child_request
from httk_flow.protocol.states import State
from httk_flow.runner.context import (
    Attempt,
    Child,
    DuplicateOutcome,
    ParamValue,
    RunnerError,
    read_job_params,
)

StepFn = Callable[["Runner"], None]
#: the code of a fail that the runner API itself reports (misuse, no outcome)
PROTOCOL_ERROR = "protocol_error"
#: the code of a fail caused by an exception raised inside a step
STEP_ERROR = "step_error"
_NO_DEFAULT: Any = object()
_T = TypeVar("_T")
_CODE_RE = re.compile(r"[A-Za-z0-9_.:+-]{1,64}")
_STATES = frozenset(s.value for s in State)


class Runner:
    """Steps by name, dispatched on $FLOW_STEP; outcome, spawn and context methods."""

    def __init__(
        self, steps: Mapping[str, StepFn] | None = None, *, env: Mapping[str, str] | None = None
    ) -> None:
        self.steps: dict[str, StepFn] = {}
        for name, fn in (steps or {}).items():
            self.add_step(name, fn)
        self._env: Mapping[str, str] = os.environ if env is None else env
        self._attempt: Attempt | None = None
        self._published = False
        self._error: str | None = None
        self._children: list[bytes] = []
        self._labels: set[str] = set()
        self._spawns = 0
        self._typed_params: dict[str, ParamValue] | None = None
        self._params_read = False

    # -- steps -----------------------------------------------------------------------

    def add_step(self, name: str, fn: StepFn) -> None:
        names.check_ident(name, "step name")
        self.steps[name] = fn

    @overload
    def step(self, arg: StepFn, /) -> StepFn: ...
    @overload
    def step(self, arg: str, /) -> Callable[[StepFn], StepFn]: ...
    def step(self, arg: StepFn | str, /) -> StepFn | Callable[[StepFn], StepFn]:
        """Register a step: `@flow.step` (named after the function) or `@flow.step("name")`."""
        if isinstance(arg, str):
            name = arg

            def register(fn: StepFn) -> StepFn:
                self.add_step(name, fn)
                return fn

            return register
        self.add_step(arg.__name__, arg)
        return arg

    def run(self) -> int:
        """Run the step named by $FLOW_STEP; returns the exit status for the program."""
        try:
            attempt = self.attempt_info
        except RunnerError as e:
            print(f"flow: {e.render()}", file=sys.stderr)
            return 2
        fn = self.steps.get(attempt.step)
        if fn is None:
            declared = ", ".join(self.steps) or "none"
            hint = ""
            if attempt.step == "main" and self.steps:
                # main is no choice the author made: flow submit starts there without --step
                first = next(iter(self.steps))
                hint = (
                    "; a job starts at step main unless flow submit --step names another: "
                    f"submit with --step {first}, and continue this one with flow resume JOB "
                    f"--step {first}"
                )
            self._misuse(
                f"step {attempt.step!r} is not a step of this runner (steps: {declared}){hint}"
            )
            return self._end_with_error()
        try:
            fn(self)
        except DuplicateOutcome:
            return 0  # already flagged in outcome.ready/duplicate
        except RunnerError as e:
            self._misuse(e.render())
        except Exception as e:
            # the whole stack, for `flow logs JOB --stderr`: the outcome holds one line of it
            # from the step's own frame on (this method's would only say the step was called)
            tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
            traceback.print_exception(type(e), e, tb, file=sys.stderr)
            if not self.has_outcome():
                self._publish(_doc(Action.FAIL, _describe(attempt.step, e), code=STEP_ERROR))
            return 0
        if self.has_outcome():
            return 0
        if self._error is not None:
            return self._end_with_error()
        msg = (
            f"step {attempt.step}: returned without publishing an outcome; end each step with "
            "succeed, fail, advance, wait, retry or pause"
        )
        self._publish(_doc(Action.FAIL, msg, code=PROTOCOL_ERROR))
        return 0

    # -- context ---------------------------------------------------------------------

    @property
    def attempt_info(self) -> Attempt:
        if self._attempt is None:
            self._attempt = Attempt.from_env(self._env)
        return self._attempt

    @property
    def workdir(self) -> str:
        return self.attempt_info.workdir

    @property
    def job_dir(self) -> str:
        return self.attempt_info.job_dir

    @property
    def job_id(self) -> str:
        return self.attempt_info.job_id

    @property
    def attempt(self) -> int:
        """1 for the first try of this step in this activation, 2 for the first retry, ..."""
        return self.attempt_info.attempt

    @property
    def is_restart(self) -> bool:
        return self.attempt_info.is_restart

    @property
    def is_unclean_restart(self) -> bool:
        return self.attempt_info.unclean_restart

    @property
    def previous_end(self) -> str | None:
        """How the previous try of this step ended ("interrupted", "process failure: ...")."""
        return self.attempt_info.previous_end

    @property
    def program_source(self) -> str | None:
        """The absolute path the program was submitted from: a stored copy runs, so
        files beside the original are found from here (None: not recorded)."""
        return self.attempt_info.program_source

    @property
    def bundle_dir(self) -> str | None:
        """The stored tree a `--bundle` program runs inside (None: not bundled)."""
        return self.attempt_info.bundle_dir

    @property
    def params(self) -> dict[str, ParamValue]:
        """Every parameter, with the type job.json holds (str, int, float or bool)."""
        typed = self._job_params()
        if typed is not None:
            return dict(typed)
        prefix = layout.ENV_PARAM_PREFIX
        return {k[len(prefix) :]: v for k, v in self._env.items() if k.startswith(prefix)}

    @overload
    def param(self, key: str) -> ParamValue: ...
    @overload
    def param(self, key: str, default: _T) -> ParamValue | _T: ...
    def param(self, key: str, default: Any = _NO_DEFAULT) -> Any:
        """Parameter `key` with the type job.json holds; `default` when unset.

        Outside a job directory (no readable job.json) the FLOW_PARAM_* strings are used."""
        names.check_ident(key, "parameter name")
        typed = self._job_params()
        env_value = self._env.get(layout.env_param(key))
        value: ParamValue | None = typed.get(key) if typed is not None else env_value
        if value is not None:
            return value
        if default is _NO_DEFAULT:
            raise RunnerError(f"parameter {key!r} is not set and no default was given")
        return default

    def _job_params(self) -> dict[str, ParamValue] | None:
        """The params of job.json, read once (a job's definition is immutable); None when
        there is no readable job.json."""
        if not self._params_read:
            self._typed_params = read_job_params(self._env.get(layout.ENV_JOB_DIR))
            self._params_read = True
        return self._typed_params

    def children(self) -> list[Child]:
        """After a join: every child of it, in the order they were spawned."""
        path = layout.children_list(self.attempt_info.control_dir)
        try:
            with open(path, encoding="utf-8") as fh:
                lines = fh.read().splitlines()
        except FileNotFoundError:
            raise RunnerError(
                "this attempt has no children file; it exists in the step that follows a wait"
            ) from None
        kids = []
        for line in lines:
            parts = line.split(" ", 3)
            if len(parts) != 4:
                raise RunnerError(f"bad line in the children file: {line!r}", obj=path)
            label, cid, state, where = parts
            known = state in _STATES
            kids.append(Child(label, cid, State(state) if known else None, where))
        return kids

    def log(self, message: str) -> None:
        """A timestamped line on the attempt's stderr."""
        now = datetime.datetime.now().strftime("%Y-%m-%dT%H:%M:%S")
        try:
            where = f"{self.attempt_info.step} {self.attempt_info.attempt_id}"
        except RunnerError:
            where = "? ?"
        print(f"{now} flow[{where}]: {message}", file=sys.stderr, flush=True)

    # -- outcomes --------------------------------------------------------------------

    def succeed(self, message: str = "") -> None:
        self._outcome(_doc(Action.SUCCEED, message))

    def fail(self, message: str, code: str | None = None) -> None:
        if code is not None and not _CODE_RE.fullmatch(code):
            self._misuse(f"fail code {code!r} is not valid (1-64 letters, digits and '_.:+-')")
        self._outcome(_doc(Action.FAIL, message, code=code))

    def advance(self, step: str, message: str = "") -> None:
        self._check_step(step)
        self._outcome(_doc(Action.ADVANCE, message, step=step))

    def retry(self, reason: str) -> None:
        self._outcome(_doc(Action.RETRY, reason))

    def pause(self, reason: str) -> None:
        self._outcome(_doc(Action.PAUSE, reason))

    def spawn(
        self,
        *,
        tag: str | None = None,
        step: str | None = None,
        params: Mapping[str, ParamValue] | None = None,
        priority: int | None = None,
        label: str | None = None,
        program: str | os.PathLike[str] | None = None,
        cpus: int | None = None,
        gpus: int | None = None,
        mem: str | int | None = None,
        resources: Mapping[str, int] | None = None,
    ) -> str:
        """Define a child job (registered when this attempt ends with wait); its label.

        cpus, gpus, mem ("4G", or whole megabytes) and resources ({"licence": 1}) are
        what each attempt of the child holds; each one left out is the parent's own
        (resources replaces the parent's site-defined resources as a whole)."""
        self._spawns += 1
        request: dict[str, Any] = {
            k: v
            for k, v in (("cpus", cpus), ("gpus", gpus), ("mem", mem), ("resources", resources))
            if v is not None
        }
        try:
            child = self._child_line(tag, step, params, priority, label, program, request)
        except FlowError as e:
            self._misuse(f"spawn: {e.render()}")
            raise RunnerError(f"spawn: {e.render()}") from None
        self._children.append(child[1])
        self._labels.add(child[0])
        return child[0]

    def wait(
        self,
        step: str,
        mode: JoinMode | str = JoinMode.ALL_SUCCEEDED,
        on_impossible: str | None = None,
    ) -> None:
        """End the attempt: register the spawned children, continue at `step` once joined."""
        self._check_step(step)
        try:
            join = JoinMode(mode.replace("-", "_") if isinstance(mode, str) else mode)
        except ValueError:
            modes = ", ".join(m.value for m in JoinMode)
            self._misuse(f"wait: join mode {mode!r} is not one of {modes}")
            join = JoinMode.ALL_SUCCEEDED
        if on_impossible is not None:
            self._check_step(on_impossible)
        if not self._children:
            self._misuse(
                "wait: no children were spawned; a join over nothing can never be decided "
                "(call spawn before wait)"
            )
        doc = _doc(Action.WAIT, "", step=step, join=join.value)
        if on_impossible is not None:
            doc["on_impossible"] = on_impossible
        self._outcome(doc)

    def has_outcome(self) -> bool:
        """Whether this attempt already published its outcome."""
        return self._published or os.path.lexists(
            layout.outcome_ready(self.attempt_info.control_dir)
        )

    # -- internals -------------------------------------------------------------------

    def _child_line(
        self,
        tag: str | None,
        step: str | None,
        params: Mapping[str, ParamValue] | None,
        priority: int | None,
        label: str | None,
        program: str | os.PathLike[str] | None,
        request: dict[str, Any],
    ) -> tuple[str, bytes]:
        if self.has_outcome():
            raise RunnerError("called after this attempt published its outcome")
        d: dict[str, Any] = {}
        label = label if label is not None else f"c{self._spawns}"
        names.check_label(label, "child label")
        if label in self._labels:
            raise RunnerError(f"label {label!r} is used twice in this attempt")
        d["label"] = label
        if tag is not None:
            d["tag"] = names.check_tag(tag)
        if step is not None:
            d["step"] = names.check_ident(step, "step name")
        if program is None and self.steps and (step or "main") not in self.steps:
            raise RunnerError(
                f"the child would start at step {step or 'main'!r}, which is not a step of "
                "this runner; pass step="
            )
        if params:
            for k, v in params.items():
                names.check_ident(k, "parameter name")
                if not isinstance(v, str | int | float | bool):
                    raise RunnerError(f"param {k!r} must be a string, number or bool")
            d["params"] = dict(params)
        if priority is not None:
            if isinstance(priority, bool) or not isinstance(priority, int):
                raise RunnerError("priority must be an integer")
            d["priority"] = names.check_priority(priority)
        if program is not None:
            path = os.path.abspath(os.fspath(program))
            if not (os.path.isfile(path) and os.access(path, os.X_OK)):
                raise RunnerError(f"program {path!r} is not an executable file")
            d["program"] = path
        if request:
            if isinstance(request.get("resources"), Mapping):
                request["resources"] = dict(request["resources"])
            child_request(request, None)  # the manager's own check, at the call
            d.update(request)
        return label, orjson.dumps(d)

    def _check_step(self, step: str) -> None:
        if not names.IDENT_RE.fullmatch(step):
            self._misuse(f"step name {step!r} is not valid (letters, digits, '_')")
        elif self.steps and step not in self.steps:
            declared = ", ".join(self.steps)
            self._misuse(f"step {step!r} is not a step of this runner (steps: {declared})")

    def _misuse(self, message: str) -> None:
        print(f"flow: {message}", file=sys.stderr)
        if self._error is None:
            self._error = message

    def _end_with_error(self) -> int:
        assert self._error is not None
        if not self.has_outcome():
            msg = f"step {self.attempt_info.step}: {self._error}"
            self._publish(_doc(Action.FAIL, msg, code=PROTOCOL_ERROR))
        return 0

    def _outcome(self, doc: dict[str, Any]) -> None:
        if self.has_outcome():
            self._flag_duplicate(doc["action"])
        if self._error is not None:
            self._end_with_error()
            raise RunnerError(f"published a fail instead of {doc['action']}: {self._error}")
        self._publish(doc)

    def _flag_duplicate(self, action: str) -> None:
        ready = layout.outcome_ready(self.attempt_info.control_dir)
        try:
            with open(layout.duplicate_file(ready), "ab") as fh:
                fh.write(action.encode() + b"\n")
        except OSError:
            pass
        raise DuplicateOutcome(
            f"this attempt already published an outcome; a second one ({action}) "
            "makes the job fail with a protocol error"
        )

    def _publish(self, doc: dict[str, Any]) -> None:
        info = self.attempt_info
        files = {layout.OUTCOME_FILE: orjson.dumps(doc, option=orjson.OPT_APPEND_NEWLINE)}
        if doc["action"] == Action.WAIT.value:
            files[layout.CHILDREN_FILE] = b"".join(c + b"\n" for c in self._children)
        tmp = layout.outcome_tmp(info.control_dir, f"{os.getpid()}.{secrets.token_hex(4)}")
        ready = layout.outcome_ready(info.control_dir)
        try:
            os.mkdir(tmp)
            for name, data in files.items():
                _write(os.path.join(tmp, name), data, durable=info.durable)
            if info.durable:
                fsync_dir(tmp)
            os.rename(tmp, ready)
        except OSError as e:
            if os.path.isdir(ready):
                self._published = True
                self._flag_duplicate(doc["action"])
            raise RunnerError(f"cannot publish the outcome ({e})", obj=ready) from e
        self._published = True
        if info.durable:
            fsync_dir(info.control_dir)


def _doc(action: Action, message: str, **fields: str | None) -> dict[str, Any]:
    """An outcome.json document; fields that are None or empty are left out."""
    return {"action": action.value, "message": message, **{k: v for k, v in fields.items() if v}}


def _write(path: str, data: bytes, *, durable: bool) -> None:
    with open(path, "xb") as fh:
        fh.write(data)
        if durable:
            fh.flush()
            os.fsync(fh.fileno())


def _describe(step: str, e: BaseException) -> str:
    """`step x: ValueError: msg (at file.py:12 in f)` for an exception raised in a step."""
    where = ""
    frames: Sequence[traceback.FrameSummary] = traceback.extract_tb(e.__traceback__)
    if frames:
        last = frames[-1]
        # the program itself lies in the program store under a digest: its name says nothing
        main = getattr(sys.modules.get("__main__"), "__file__", None)
        if main and os.path.abspath(main) == os.path.abspath(last.filename):
            where = f" (at line {last.lineno} in {last.name})"
        else:
            where = f" (at {os.path.basename(last.filename)}:{last.lineno} in {last.name})"
    text = str(e)
    return f"step {step}: {type(e).__name__}{': ' + text if text else ''}{where}"
