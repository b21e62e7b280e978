"""Helpers for the runner tests: a workspace driven through the real `flow` CLI, job
scripts that source shell/flow.sh, and the jobs read back from their journal.

Attempt processes live in process groups of their own; when a test kills a manager they
are orphaned, and PID 1 may not reap orphans, so the test process makes itself their
subreaper (OrphanReaper) rather than letting zombies look like live attempts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

# one reaper and one process reader for every suite
from helpers import ends_a_commit
from manager.support import OrphanReaper as OrphanReaper
from manager.support import processes_of

from httk_flow.ops import lookup
from httk_flow.protocol import jobs, layout
from httk_flow.protocol.journal import RawFrame as Frame
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import JobHandle
from httk_flow.protocol.workspace import Workspace

FLOW = [sys.executable, "-m", "httk_flow"]
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
FLOW_SH = REPO / "shell" / "flow.sh"
BASH = shutil.which("bash") or "/bin/bash"
#: the longest one `flow run` may take before a test gives up on it
RUN_TIMEOUT = 90.0
#: first lines of every bash job script written by a test
PRELUDE = '#!/usr/bin/env bash\nsource "$FLOW_BASH_API"\n'


def flow_env() -> dict[str, str]:
    """The environment of `flow` commands: this interpreter's bin first on PATH, so a
    `#!/usr/bin/env python3` runner finds httk_flow."""
    env = dict(os.environ)
    env.pop("FLOW_WORKSPACE", None)
    env.pop("FLOW_CRASH_AT", None)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def flow(
    *args: str, timeout: float = 60, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*FLOW, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=flow_env(),
        input=input,
    )


@dataclass(frozen=True)
class Job:
    """A job as its journal tells it."""

    handle: JobHandle
    frames: list[Frame]
    dir: Path

    @property
    def state(self) -> State:
        return self.handle.state

    @property
    def last(self) -> Frame:
        return self.frames[-1]

    @property
    def message(self) -> str | None:
        m = self.last.get("message")
        return m if isinstance(m, str) else None

    @property
    def failure(self) -> dict[str, Any]:
        f = self.last.get("failure")
        return f if isinstance(f, dict) else {}

    @property
    def code(self) -> str | None:
        return self.failure.get("code")

    @property
    def reason(self) -> str:
        """The failure message, or "" when the job did not fail."""
        return str(self.failure.get("message", ""))

    def commits(self) -> list[Frame]:
        """Frames that end a commit (committing -> a state other than committing, or the
        direct running -> succeeded)."""
        return [f for f in self.frames if ends_a_commit(f)]

    def attempt_dirs(self) -> list[Path]:
        """The attempt directories left (a committed attempt may have been tidied away)."""
        return sorted(
            p for p in self.dir.iterdir() if layout.is_attempt_name(p.name) and p.is_dir()
        )

    def attempt_ids(self) -> list[str]:
        """Every attempt the journal says was started, oldest first."""
        return [
            str(f["attempt"]["id"])
            for f in self.frames
            if f.get("from") == "claimed" and f.get("to") == "running"
        ]

    def stderr(self) -> str:
        """Every attempt's stderr, in order: in its directory, or where its commit's
        tidying moved it (aNNNN.stderr beside job.json)."""
        paths = [d / "stderr" for d in self.attempt_dirs()]
        paths += list(self.dir.glob("a*.stderr"))
        return "".join(
            p.read_text(errors="replace") for p in sorted(paths, key=lambda p: str(p)) if p.exists()
        )

    def describe(self) -> str:
        lines = [f"{self.handle.key} {self.state.value} {self.failure or ''}"]
        lines += [
            f"  {f.get('from', '-')} -> {f.get('to')} step={f.get('step')} why={f.get('why')}"
            for f in self.frames
        ]
        return "\n".join(lines) + "\n" + self.stderr()[-2000:]


class Bench:
    """One workspace, the scripts of a test, and `flow` commands run against it."""

    def __init__(self, tmp: Path, *, backoff: float = 0.1, keep_files: bool = False) -> None:
        self.tmp = tmp
        self.root = str(tmp / "ws")
        self.scripts = tmp / "scripts"
        self.scripts.mkdir(parents=True, exist_ok=True)
        self.logs: list[Path] = []
        # keep_files: a test that reads a committed attempt's own files (outcome.line, ...)
        done = flow("init", self.root, *(["--keep-attempt-files"] if keep_files else []))
        assert done.returncode == 0, done.stderr
        fmt = Path(self.root) / ".flow" / "format.json"
        data = orjson.loads(fmt.read_bytes())
        data["policy"].update(backoff_base=backoff, backoff_cap=backoff * 4)
        fmt.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
        self.procs: list[subprocess.Popen[bytes]] = []

    def script(self, name: str, body: str, *, prelude: str = PRELUDE) -> str:
        path = self.scripts / name
        path.write_text(prelude + body)
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return str(path)

    def submit(
        self,
        program: str,
        *args: str,
        step: str | None = None,
        params: Mapping[str, str] | None = None,
        options: Sequence[str] = (),
    ) -> str:
        argv = ["submit", "-w", self.root, "--json", *options]
        if step:
            argv += ["--step", step]
        for k, v in (params or {}).items():
            argv += ["--param", f"{k}={v}"]
        done = flow(*argv, "--", program, *args)
        assert done.returncode == 0, done.stderr
        return str(orjson.loads(done.stdout)["jobs"][0]["id"])

    def submit_many(self, program: str, lines: Iterable[Mapping[str, Any]]) -> list[str]:
        """Bulk submission (`flow submit --from -`): one job per line."""
        text = "".join(orjson.dumps(dict(line)).decode() + "\n" for line in lines)
        done = flow("submit", "-w", self.root, "--json", "--from", "-", program, input=text)
        assert done.returncode == 0, done.stderr
        return [str(j["id"]) for j in orjson.loads(done.stdout)["jobs"]]

    def start(self, *args: str, workers: int = 2, command: str = "run") -> subprocess.Popen[bytes]:
        """Start a manager in the background; its output goes to a log file."""
        log = self.tmp / f"manager-{len(self.logs) + 1}.log"
        self.logs.append(log)
        argv = [*FLOW, command, "-w", self.root, "--workers", str(workers), "--quiet", *args]
        with open(log, "wb") as out:
            p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=flow_env())
        self.procs.append(p)
        return p

    def run(self, *args: str, workers: int = 2, timeout: float = RUN_TIMEOUT) -> int:
        """`flow run -w WS --workers N --quiet`, to completion; its exit status."""
        p = self.start(*args, workers=workers)
        try:
            return p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            log = self.logs[-1].read_text(errors="replace")[-3000:]
            raise AssertionError(f"flow run did not finish in {timeout} s:\n{log}") from None

    def job(self, ident: str) -> Job:
        ws = Workspace.open(self.root)
        try:
            h = lookup.find(ws, ident)
            return Job(h, jobs.history_json(ws, h), Path(ws.job_dir(h.placement, h.key)))
        finally:
            ws.close()

    def all_jobs(self) -> list[Job]:
        ws = Workspace.open(self.root)
        try:
            return [
                Job(h, jobs.history_json(ws, h), Path(ws.job_dir(h.placement, h.key)))
                for h in jobs.all_jobs(ws)
            ]
        finally:
            ws.close()

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for pid in processes_of(self.root):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, 9)


def bash(
    script: str,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    stdin: bytes | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[bytes]:
    """Run `script` in one bash process that has sourced shell/flow.sh."""
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    full.update(env or {})
    return subprocess.run(
        [BASH, "-c", f'source "$1"\n{script}', "flow-test", str(FLOW_SH)],
        input=stdin,
        capture_output=True,
        env=full,
        cwd=cwd,
        timeout=timeout,
    )
