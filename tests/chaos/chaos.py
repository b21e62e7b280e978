"""The chaos harness: many jobs, several managers, SIGKILLs at random moments, then an audit.

    python tests/chaos/chaos.py --jobs 1000 --kills 100 --managers 3 --seed 1 \\
        --workdir /tmp/chaos [--json out.json]

What it does:

1. makes a workspace (retry backoff 0.2 s doubling to 2 s) and submits --jobs jobs of one
   bash program written with the bash runner API, whose behaviour a parameter picks:
   `normal` (one step), `steps` (main -> two -> three), `fanout` (2-5 children spawned with
   flow_spawn, joined with flow_wait, checked in a collect step), `fail` (main -> two,
   which calls flow_fail with code chaos_fail) and `retry` (flow_retry on its first try,
   counted in a file of $FLOW_WORKDIR, then success). Every step first appends the line
   `<job id> <step> <activation> <attempt id>` to a per-job file outside the workspace (the
   audited side effect), then sleeps 0-50 ms (0-2 s for the --long-share of jobs submitted
   with nap=long, so that kills also land in the middle of steps);
2. runs --managers `flow serve --workers 2 --lease 2s` processes while a driver SIGKILLs,
   at random moments spread over the run, either a whole manager (restarted after a short
   random delay) or the process group of one attempt (at most 2 per job), --kills in all
   (with --nodes every manager believes it runs on a host of its own, and a manager kill is
   a node death: its attempts are killed with it, and only lease evidence can recover them);
3. once every job is terminal, stops the managers with SIGTERM and audits the journal, the
   state tree, the audit files and `flow fsck` (see `audit` for the invariants). It prints
   the figures and exits 1 if any invariant was violated.

`run_chaos` is the same thing as a function (tests/chaos/test_chaos.py runs a small one).

Attempt processes orphaned by a killed manager are reparented to this process, which
reaps them (tests/manager/support.py's OrphanReaper): PID 1 here does not reap orphans,
and an unreaped zombie must not look like a live attempt.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import random
import shlex
import signal
import stat
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from httk_flow import jobs, names
from httk_flow.children import child_id, child_placement
from httk_flow.errors import FlowError
from httk_flow.journal import Frame
from httk_flow.states import State
from httk_flow.submit import SubmitRequest, Submitter
from httk_flow.transition import JobHandle
from httk_flow.workspace import Workspace

#: the tests directory, so that the manager tests' support module can be imported
TESTS_DIR = str(Path(__file__).resolve().parent.parent)
FLOW = [sys.executable, "-m", "httk_flow"]
#: `flow` on another host: argv[1] is the host name its gethostname() returns
ELSEWHERE = (
    "import socket, sys; host = sys.argv.pop(1); socket.gethostname = lambda: host\n"
    "from httk_flow.cli.main import main; main()"
)

#: the one program every job runs; $FLOW_PARAM_kind picks what it does
JOB_SCRIPT = r"""#!/usr/bin/env bash
# a chaos job: the parameter "kind" (normal, steps, fail, retry, fanout) picks its program
set -euo pipefail
# shellcheck disable=SC1090
source "$FLOW_BASH_API"

flow_steps main two three child collect

# the audited side effect: one line per step execution, outside the workspace
audit() {
    local ctx="" act="?" d
    IFS= read -r -d '' ctx <"$FLOW_CONTEXT" || true
    if [[ $ctx =~ \"activation\":([0-9]+) ]]; then act=${BASH_REMATCH[1]}; fi
    printf '%s %s %s %s\n' "$FLOW_JOB_ID" "$FLOW_STEP" "$act" "$FLOW_ATTEMPT_ID" \
        >>"$CHAOS_AUDIT/$FLOW_JOB_ID"
    # a short nap (0-50 ms); jobs submitted with nap=long compute for 0-2 s instead, so
    # that kills also land mid-step and orphans outlive their manager's death
    if [[ ${FLOW_PARAM_nap-} == long ]]; then
        printf -v d '%d.%03d' $((RANDOM % 2)) $((RANDOM % 1000))
    else
        printf -v d '0.%03d' $((RANDOM % 51))
    fi
    sleep "$d"
}

# put FILE VALUE: replace FILE whole (write a temporary, then rename)
put() {
    echo "$2" >"$1.tmp.$$"
    mv -f "$1.tmp.$$" "$1"
}

step_main() {
    local kind n=0 i
    audit
    flow_param -v kind kind
    case $kind in
    normal) flow_succeed "one step" ;;
    steps | fail) flow_advance two "main done" ;;
    retry)
        if [[ -f $FLOW_WORKDIR/count ]]; then read -r n <"$FLOW_WORKDIR/count" || true; fi
        n=$((n + 1))
        put "$FLOW_WORKDIR/count" "$n"
        if ((n == 1)); then
            flow_retry "the first try fails on purpose"
        else
            flow_succeed "succeeded at run $n"
        fi
        ;;
    fanout)
        flow_param -v n kids
        for ((i = 1; i <= n; i++)); do
            flow_spawn --tag kid --step child --param i="$i" --param nap="${FLOW_PARAM_nap-short}"
        done
        flow_wait collect --all-succeeded
        ;;
    *) flow_fail "unknown kind '$kind'" chaos_bad_kind ;;
    esac
}

step_two() {
    local kind
    audit
    flow_param -v kind kind
    if [[ $kind == fail ]]; then
        flow_fail "step two fails on purpose" chaos_fail
    else
        flow_advance three "two done"
    fi
}

step_three() {
    audit
    flow_succeed "three done"
}

step_child() {
    local i
    audit
    flow_param -v i i
    put "$FLOW_JOB_DIR/result" "$((i * i))"
    flow_succeed "child $i"
}

step_collect() {
    local kids label state path v n=0 sum=0 want=0 i bad=""
    audit
    flow_param -v kids kids
    while read -r label _ state path; do
        n=$((n + 1))
        if [[ $state != succeeded ]]; then
            bad+=" $label:$state"
            continue
        fi
        read -r v <"$path/result"
        sum=$((sum + v))
    done < <(flow_children)
    for ((i = 1; i <= kids; i++)); do want=$((want + i * i)); done
    if [[ -n $bad || $n -ne $kids || $sum -ne $want ]]; then
        flow_fail "join mismatch: $n of $kids children, sum $sum of $want;$bad" chaos_bad_join
        return
    fi
    flow_succeed "sum $sum"
}

flow_main "$@"
"""

#: how often each kind of job is submitted
MIX = {"normal": 0.2, "steps": 0.25, "fanout": 0.25, "fail": 0.1, "retry": 0.2}

#: (activation, step, why) of the commits that end each activation, per program
EXPECTED_COMMITS: dict[str, list[tuple[int, str, str]]] = {
    "normal": [(1, "main", "succeed")],
    "steps": [(1, "main", "advance"), (2, "two", "advance"), (3, "three", "succeed")],
    "fail": [(1, "main", "advance"), (2, "two", "fail")],
    "retry": [(1, "main", "succeed")],
    "fanout": [(1, "main", "wait"), (2, "collect", "succeed")],
    "child": [(1, "child", "succeed")],
}

#: a commit whose `why` starts so returns the job to ready in the same activation: the
#: activation is re-run by a later attempt (an interruption, a process failure, flow_retry)
RERUN_WHY = ("interrupted", "process failure", "retry requested")
RERUN_KIND = {
    "interrupted": "interrupted",
    "process failure": "process_failure",
    "retry requested": "retry_requested",
}
#: bugs of the package this harness found, reported to its developers; a run meets them
#: only under the precise circumstances each recogniser below checks, and counts them
#: apart from the violations (`--strict` counts them as violations)
KNOWN_BUGS = {
    "vanished-marker-crash": (
        "httk_flow/transition.py _resolve: locate_key scans the state kinds one listdir "
        "at a time, so a job that moves to an earlier-listed kind during the scan "
        "(committing -> ready) is not found; the FlowError 'marker vanished' is not a "
        "TransitionConflict, escapes ClaimPass._claim and the manager exits with status 1"
    ),
    "state-dir-race-crash": (
        "httk_flow/transition.py rename_marker: the rename fails with ENOENT because the "
        "target state directory of the placement does not exist yet, another manager "
        "creates it before the isdir check, so no retry is made and _resolve, finding the "
        "source still there, raises FlowError 'cannot move marker (No such file or "
        "directory)'; it escapes ClaimPass._claim and the manager exits with status 1"
    ),
    "resume-without-evidence": (
        "httk_flow/manager/passes.py RecoveryPass._one: a committing marker whose owner is "
        "gone is taken over by committer.resume(h, frame), which is not given the proof: "
        "the committing -> committing frame records no evidence"
    ),
}
VANISHED = "marker vanished during a transition and no other marker exists"
NO_DIR = ": cannot move marker (No such file or directory); "


def known_bug_exit(rc: int, last_line: str) -> str | None:
    """The known bug a manager's own exit is (status 1, its last line the error), or None."""
    if rc != 1 or not last_line.startswith("flow: error: "):
        return None
    if last_line.startswith("flow: error: job ") and VANISHED in last_line:
        return "vanished-marker-crash"
    if "/.flow/state/" in last_line and NO_DIR in last_line:
        return "state-dir-race-crash"
    return None


ACTIVE_KINDS = (State.CLAIMED, State.RUNNING, State.COMMITTING, State.CANCELLING)
TERMINAL_KINDS = (State.SUCCEEDED, State.FAILED, State.CANCELLED)


# -- configuration and expectations -------------------------------------------------------


@dataclass
class ChaosConfig:
    jobs: int = 1000
    kills: int = 100
    managers: int = 3
    seed: int = 1
    workdir: str = "chaos-run"
    workers: int = 2
    lease: str = "2s"
    #: the share of kills that hit a whole manager (the rest hit one attempt's group)
    manager_share: float = 0.4
    #: at most this many attempt kills per job, so no job can exhaust its retry budget
    max_kills_per_job: int = 2
    #: each job's retries (the budget for process failures and flow_retry)
    retries: int = 6
    #: the share of jobs (and their children) whose steps last 0-2 s rather than 0-50 ms
    long_share: float = 0.1
    #: give up (a violation) when the jobs are not all terminal after this many seconds
    timeout: float = 3600.0
    durable: bool = False
    #: every manager runs on a host of its own (its gethostname lies) and a manager kill
    #: is a node death: the manager and its attempts die together, and the work is taken
    #: over on lease evidence (the workspace allows persistent workdirs to be)
    nodes: bool = False
    #: count meetings with KNOWN_BUGS as violations (they are fixed: any meeting is a regression)
    strict: bool = True
    #: kills fire while this share of the jobs is terminal, uniformly spread
    kill_window: tuple[float, float] = (0.02, 0.85)
    verbose: bool = True


@dataclass(frozen=True)
class Expected:
    """A job the harness submitted (or its program will spawn), and how it must end."""

    id: str
    key: str
    placement: str
    kind: str
    kids: int = 0
    parent: str | None = None

    @property
    def state(self) -> State:
        return State.FAILED if self.kind == "fail" else State.SUCCEEDED

    @property
    def failure_code(self) -> str | None:
        return "chaos_fail" if self.kind == "fail" else None

    @property
    def commits(self) -> list[tuple[int, str, str]]:
        return EXPECTED_COMMITS[self.kind]


def expected_children(parent: Expected) -> list[Expected]:
    """The children a fanout parent spawns: labels c1..cN of activation 1, tag `kid`."""
    placement = child_placement(parent.placement, parent.key)
    out = []
    for i in range(1, parent.kids + 1):
        cid = child_id(parent.id, 1, f"c{i}")
        out.append(Expected(cid, names.make_key(cid, "kid"), placement, "child", 0, parent.id))
    return out


# -- figures ----------------------------------------------------------------------------


@dataclass
class Report:
    config: ChaosConfig
    command: str = ""
    root: str = ""
    jobs_top: int = 0
    jobs_total: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    kills_planned: int = 0
    kills_manager: int = 0
    kills_attempt: int = 0
    manager_starts: int = 0
    tally: Counter[str] = field(default_factory=Counter)
    recoveries: Counter[str] = field(default_factory=Counter)
    fsck: dict[str, Any] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    known_bugs: Counter[str] = field(default_factory=Counter)
    known_examples: list[str] = field(default_factory=list)
    #: for re-auditing (tests): what was expected, where the side effects are, who died
    expected: list[Expected] = field(default_factory=list, repr=False)
    audit_dir: str = ""
    killed_jobs: Counter[str] = field(default_factory=Counter, repr=False)
    dead_managers: set[str] = field(default_factory=set)
    run_seconds: float = 0.0
    audit_seconds: float = 0.0
    wall_seconds: float = 0.0

    def known(self, bug: str, detail: str) -> None:
        """A meeting with a known (reported) bug: a violation only in strict mode."""
        if self.config.strict:
            self.violations.append(f"[known bug {bug}] {detail}")
            return
        self.known_bugs[bug] += 1
        if len(self.known_examples) < 20:
            self.known_examples.append(f"[{bug}] {detail}")

    @property
    def kills(self) -> int:
        return self.kills_manager + self.kills_attempt

    @property
    def recovered(self) -> int:
        return sum(self.recoveries.values())

    def to_json(self) -> dict[str, Any]:
        c = self.config
        return {
            "command": self.command,
            "config": {
                "jobs": c.jobs,
                "kills": c.kills,
                "managers": c.managers,
                "workers": c.workers,
                "lease": c.lease,
                "seed": c.seed,
                "durable": c.durable,
                "nodes": c.nodes,
                "manager_share": c.manager_share,
                "long_share": c.long_share,
            },
            "workspace": self.root,
            "jobs": {"submitted": self.jobs_top, "total": self.jobs_total, "kinds": self.kinds},
            "kills": {
                "planned": self.kills_planned,
                "managers": self.kills_manager,
                "attempts": self.kills_attempt,
            },
            "manager_starts": self.manager_starts,
            "tally": dict(sorted(self.tally.items())),
            "recoveries": {"total": self.recovered, **dict(sorted(self.recoveries.items()))},
            "fsck": self.fsck,
            "violations": self.violations,
            "known_bugs": {
                "counts": dict(self.known_bugs),
                "examples": self.known_examples,
                "descriptions": {k: KNOWN_BUGS[k] for k in self.known_bugs},
            },
            "seconds": {
                "run": round(self.run_seconds, 1),
                "audit": round(self.audit_seconds, 1),
                "wall": round(self.wall_seconds, 1),
            },
        }

    def render(self) -> str:
        c, t = self.config, self.tally
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.kinds.items()))
        by_evidence = ", ".join(f"{k} {n}" for k, n in sorted(self.recoveries.items()))
        lines = [
            f"chaos: seed {c.seed}, {c.managers} managers x {c.workers} workers, lease {c.lease}"
            f"{', durable' if c.durable else ''}"
            f"{', a host per manager (manager kills are node deaths)' if c.nodes else ''}",
            f"jobs: {self.jobs_top} submitted ({kinds}), {self.jobs_total} with children",
            f"kills: {self.kills} of {self.kills_planned} planned (managers {self.kills_manager}"
            f" / attempts {self.kills_attempt}); {self.manager_starts} manager starts"
            + (
                f"; the node deaths killed {t['node_death_attempts']} attempts with them"
                if c.nodes
                else ""
            ),
            f"attempts launched: {t['attempts']}; transitions: {t['frames']}",
            f"commits: {t['commits']} = {t['ending_commits']} ending an activation + "
            f"{t['rerun_interrupted']} interrupted + {t['rerun_process_failure']} process "
            f"failures + {t['rerun_retry_requested']} flow_retry",
            f"recoveries: {self.recovered} takeover frames with evidence ({by_evidence or '-'})",
            f"side effects: {t['audit_lines']} step executions audited, "
            f"{t['audit_reexecutions']} re-executions of a step in the same activation "
            f"(flow_retry, kills: at-least-once), {t['audit_uncommitted']} executions "
            "whose outcome did not end its activation",
            f"fsck: {'clean' if self.fsck.get('clean') else 'NOT clean'} "
            f"({self.fsck.get('markers', '?')} markers, {self.fsck.get('payloads', '?')} "
            f"payloads, {self.fsck.get('segments', '?')} journal segments)",
            f"violations: {len(self.violations)}",
        ]
        if self.known_bugs:
            met = ", ".join(f"{k} {n}" for k, n in sorted(self.known_bugs.items()))
            lines.append(f"known bugs met (reported; not counted as violations): {met}")
            lines += [f"  {e}" for e in self.known_examples[:10]]
        lines += [f"  {v}" for v in self.violations[:40]]
        if len(self.violations) > 40:
            lines.append(f"  ... and {len(self.violations) - 40} more")
        lines.append(
            f"wall time: {self.wall_seconds:.1f} s (run {self.run_seconds:.1f} s, "
            f"audit {self.audit_seconds:.1f} s)"
        )
        return "\n".join(lines)


# -- processes --------------------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgid) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return fields[0].decode(), int(fields[1]), int(fields[2])
    except (IndexError, ValueError):
        return None


def _parent(pid: int) -> int | None:
    st = _proc_stat(pid)
    return st[1] if st else None


def _environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return b"\0" + fh.read()
    except OSError:
        return b""


def workspace_processes(root: str) -> Iterator[tuple[int, str, int, str]]:
    """(pid, state, pgid, job id) of every process started for an attempt of `root`."""
    needle = f"\0FLOW_WORKSPACE_DIR={root}\0".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        env = _environ(pid)
        if needle not in env:
            continue
        st = _proc_stat(pid)
        if st is None:
            continue
        jid = ""
        at = env.find(b"\0FLOW_JOB_ID=")
        if at >= 0:
            jid = env[at + 13 : env.find(b"\0", at + 1)].decode(errors="replace")
        yield pid, st[0], st[2], jid


def attempt_groups(root: str) -> dict[int, str]:
    """Process groups of live attempts of `root` (group id: job id)."""
    return {
        pid: jid
        for pid, state, pgid, jid in workspace_processes(root)
        if pgid == pid and state not in ("Z", "X")
    }


def orphan_reaper() -> contextlib.AbstractContextManager[Any]:
    """The manager tests' OrphanReaper (this process becomes the orphans' subreaper)."""
    if TESTS_DIR not in sys.path:
        sys.path.insert(0, TESTS_DIR)
    from manager.support import OrphanReaper

    return OrphanReaper()


# -- setup ------------------------------------------------------------------------------


def make_workspace(path: Path, *, durable: bool, persistent_takeover: bool = False) -> str:
    """A workspace whose retries back off 0.2 s, doubling up to 2 s."""
    ws = Workspace.create(str(path))
    ws.close()
    fmt_path = Path(ws.flow) / "format.json"
    fmt = orjson.loads(fmt_path.read_bytes())
    fmt["policy"].update(
        backoff_base=0.2,
        backoff_cap=2.0,
        durable=durable,
        persistent_takeover=persistent_takeover,
    )
    fmt_path.write_bytes(orjson.dumps(fmt, option=orjson.OPT_INDENT_2))
    return ws.root


def submit_jobs(root: str, program: str, cfg: ChaosConfig, rng: random.Random) -> list[Expected]:
    """Submit cfg.jobs jobs of a random mix of kinds; returns every expected job."""
    kinds = rng.choices(list(MIX), weights=list(MIX.values()), k=cfg.jobs)
    reqs = []
    for kind in kinds:
        params: dict[str, str | int | float | bool] = {"kind": kind}
        params["nap"] = "long" if rng.random() < cfg.long_share else "short"
        if kind == "fanout":
            params["kids"] = rng.randint(2, 5)
        reqs.append(SubmitRequest(program=program, tag=kind, params=params, retries=cfg.retries))
    ws = Workspace.open(root)
    try:
        specs = list(Submitter(ws, actor="chaos").submit(reqs))
    finally:
        ws.close()
    out: list[Expected] = []
    for spec, kind in zip(specs, kinds, strict=True):
        kids = int(spec.params.get("kids", 0) or 0)
        top = Expected(spec.id, spec.key, spec.placement, kind, kids)
        out.append(top)
        out.extend(expected_children(top))
    return out


def count_markers(root: str, kinds: tuple[State, ...]) -> int:
    base = os.path.join(root, ".flow", "state")
    n = 0
    for st in kinds:
        for _, _, files in os.walk(os.path.join(base, st.value)):
            n += len(files)
    return n


# -- the driver -------------------------------------------------------------------------


@dataclass
class ManagerRun:
    """One manager process: its log, and how it ended ("killed", "exited", "stopped")."""

    proc: subprocess.Popen[bytes]
    log: Path
    ended: str = ""

    @property
    def id(self) -> str:
        """The manager's id, from the first line of its log ("... manager <id> serving")."""
        try:
            with open(self.log, "rb") as fh:
                first = fh.readline().decode(errors="replace").split()
        except OSError:
            return ""
        return first[3] if len(first) > 4 and first[2] == "manager" else ""


@dataclass
class _Kill:
    at: float  # share of the jobs terminal when it is armed
    kind: str  # "manager" or "attempt"
    due: float | None = None  # monotonic time it fires, once armed


class Driver:
    """Keeps cfg.managers managers serving and kills managers and attempts on a plan."""

    def __init__(
        self,
        cfg: ChaosConfig,
        root: str,
        audit_dir: str,
        logs: Path,
        total: int,
        rng: random.Random,
        report: Report,
        say: Callable[[str], None],
    ) -> None:
        self.cfg, self.root, self.logs, self.total = cfg, root, logs, total
        self.rng, self.report, self.say = rng, report, say
        self.env = {
            k: v for k, v in os.environ.items() if k not in ("FLOW_CRASH_AT", "FLOW_WORKSPACE")
        }
        self.env["CHAOS_AUDIT"] = audit_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.runs: list[ManagerRun] = []
        self.restarts: list[float] = []
        self.killed_jobs: Counter[str] = Counter()
        lo, hi = cfg.kill_window
        self.plan = sorted(
            (
                _Kill(
                    rng.uniform(lo, hi),
                    "manager" if rng.random() < cfg.manager_share else "attempt",
                )
                for _ in range(cfg.kills)
            ),
            key=lambda k: k.at,
        )
        report.kills_planned = len(self.plan)
        self.terminal = 0

    def start_manager(self) -> None:
        self.report.manager_starts += 1
        n = self.report.manager_starts
        flow = FLOW
        if self.cfg.nodes:
            # every manager start is a fresh node: its gethostname() answers node<n>
            flow = [sys.executable, "-c", ELSEWHERE, f"node{n:03d}"]
        argv = [*flow, "serve", "-w", self.root, "--workers", str(self.cfg.workers)]
        argv += ["--lease", self.cfg.lease]
        log = self.logs / f"manager-{n:03d}.log"
        with open(log, "wb") as out:
            p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env)
        self.procs.append(p)
        self.runs.append(ManagerRun(p, log))

    def _run_of(self, p: subprocess.Popen[bytes]) -> ManagerRun:
        return next(r for r in self.runs if r.proc is p)

    def _check_managers(self) -> None:
        """A manager that ended without being killed is a violation (unless it is a known
        bug, precisely recognised); it is replaced."""
        for p in list(self.procs):
            rc = p.poll()
            if rc is None:
                continue
            self.procs.remove(p)
            run = self._run_of(p)
            run.ended = "exited"
            tail = run.log.read_text(errors="replace").strip().splitlines()[-1:]
            last = tail[0] if tail else ""
            bug = known_bug_exit(rc, last)
            what = f"manager {run.id or p.pid} exited on its own with status {rc}: {last}"
            if bug:
                self.report.known(bug, f"{what} ({run.log.name})")
            else:
                self.report.violations.append(f"{what} ({run.log})")
            self.restarts.append(time.monotonic())

    def _kill_manager(self) -> bool:
        """SIGKILL a manager; with cfg.nodes, its node dies: its attempts die with it."""
        if not self.procs:
            return False
        p = self.rng.choice(self.procs)
        groups: list[int] = []
        if self.cfg.nodes:
            # frozen first, so that it launches nothing between the listing and the kill
            p.send_signal(signal.SIGSTOP)
            groups = [
                pid
                for pid, state, pgid, _ in workspace_processes(self.root)
                if pgid == pid and state not in ("Z", "X") and _parent(pid) == p.pid
            ]
        p.kill()
        p.wait()
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        self.procs.remove(p)
        self._run_of(p).ended = "killed"
        self.report.kills_manager += 1
        self.report.tally["node_death_attempts"] += len(groups)
        self.restarts.append(time.monotonic() + self.rng.uniform(0.05, 1.5))
        return True

    def _kill_attempt(self) -> bool:
        groups = [
            (pgid, jid)
            for pgid, jid in attempt_groups(self.root).items()
            if self.killed_jobs[jid] < self.cfg.max_kills_per_job
        ]
        if not groups:
            return False
        pgid, jid = self.rng.choice(groups)
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        self.killed_jobs[jid] += 1
        self.report.kills_attempt += 1
        return True

    def run(self) -> None:
        for _ in range(self.cfg.managers):
            self.start_manager()
        start = time.monotonic()
        deadline = start + self.cfg.timeout
        every = 0.2 + self.total / 20000  # progress walks cost: fewer of them on big runs
        next_count = 0.0
        next_say = start + 10
        while True:
            now = time.monotonic()
            if now > deadline:
                active = self.total - self.terminal
                self.report.violations.append(
                    f"timeout: {active} of {self.total} jobs not terminal after "
                    f"{self.cfg.timeout:.0f} s"
                )
                return
            self._check_managers()
            due = [t for t in self.restarts if t <= now]
            for t in due:
                self.restarts.remove(t)
                self.start_manager()
            if now >= next_count:
                next_count = now + every
                self.terminal = count_markers(self.root, TERMINAL_KINDS)
                share = self.terminal / max(1, self.total)
                for k in self.plan:
                    if k.due is None and k.at <= share:
                        k.due = now + self.rng.uniform(0.0, 0.5)
                if self.terminal >= self.total and not count_markers(
                    self.root, tuple(s for s in State if not s.is_terminal)
                ):
                    return
            for k in [k for k in self.plan if k.due is not None and k.due <= now]:
                fired = self._kill_manager() if k.kind == "manager" else self._kill_attempt()
                if fired:
                    self.plan.remove(k)
                else:
                    k.due = now + 0.02  # nothing to kill just now: look again shortly
            if self.cfg.verbose and now >= next_say:
                next_say = now + 10
                self.say(
                    f"  {now - start:6.0f} s: {self.terminal}/{self.total} terminal, kills "
                    f"{self.report.kills_manager} managers / {self.report.kills_attempt} "
                    f"attempts, {len(self.procs)} managers up"
                )
            time.sleep(0.01)

    def stop(self) -> None:
        """SIGTERM every manager (a drain); one that does not exit in time is a violation."""
        for t in list(self.restarts):
            self.restarts.remove(t)
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(60)
                self._run_of(p).ended = "stopped"
            except subprocess.TimeoutExpired:
                self.report.violations.append(f"manager pid {p.pid} did not drain in 60 s")
                p.kill()
                p.wait()
                self._run_of(p).ended = "killed"
        self.procs.clear()

    def dead_ids(self) -> set[str]:
        """Managers that died under their work (killed by us, or exited on their own)."""
        return {r.id for r in self.runs if r.ended in ("killed", "exited") and r.id}


# -- the audit --------------------------------------------------------------------------


AuditLine = tuple[str, str, str, str]  # job id, step, activation, attempt id


def read_audit(audit_dir: str, job_id: str) -> list[AuditLine]:
    try:
        text = Path(audit_dir, job_id).read_text()
    except FileNotFoundError:
        return []
    out: list[AuditLine] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4:
            out.append((parts[0], parts[1], parts[2], parts[3]))
        else:
            out.append((line, "", "", ""))  # a torn or foreign line: reported by check_job
    return out


def check_job(
    exp: Expected,
    state: State,
    frames: list[Frame],
    lines: list[AuditLine],
    *,
    kills: int,
    tally: Counter[str],
    recoveries: Counter[str],
    dead: set[str] | None = None,
    known: Callable[[str, str], None] | None = None,
) -> list[str]:
    """Every invariant of one job's history and side effects; returns the violations.

    What is counted as a commit: a frame `committing -> X` with X not committing. Its
    activation is the `act` of the committing frame before it. A commit whose `why` starts
    with one of RERUN_WHY sends the job back to ready in the same activation (an attempt
    interrupted by a dead manager, a process failure, a flow_retry); any other commit
    ends its activation. The protocol allows any number of re-runs of an activation, then
    exactly one commit that ends it. So, per job:

    - the commits that end an activation are exactly the program's (activation, step, why)
      list, in order: each activation is committed exactly once;
    - no commit of an activation follows the commit that ended it, and every attempt that
      was launched (claimed -> running) is committed exactly once, whether it ended its
      activation or was re-run;
    - process failures never outnumber the SIGKILLs the driver sent to the job's attempts,
      and only `retry` jobs call flow_retry, once at most.
    """
    v: list[str] = []
    who = f"{exp.kind} job {exp.key}"
    tally["frames"] += len(frames)
    # the chain: generations count up from the submission, each move is in the table
    for i, f in enumerate(frames):
        if f.get("gen") != i or f.get("job") != exp.id:
            v.append(f"{who}: frame {i} has gen {f.get('gen')} job {f.get('job')}")
        if i == 0:
            if f.get("to") != State.SUBMITTED.value or f.get("prev") is not None:
                v.append(f"{who}: history does not start with the submission")
            continue
        if f.get("from") != frames[i - 1].get("to"):
            v.append(
                f"{who}: frame {i} moves from {f.get('from')}, "
                f"the one before went to {frames[i - 1].get('to')}"
            )
        try:
            State(f["from"]).check(State(f["to"]))
        except (FlowError, KeyError, ValueError) as e:
            v.append(f"{who}: frame {i}: {e}")
    if frames and frames[-1].get("to") != state.value:
        v.append(f"{who}: marker in {state.value}, last frame says {frames[-1].get('to')}")
    # the end state the program dictates
    if state is not exp.state:
        last = frames[-1] if frames else {}
        v.append(
            f"{who}: ended {state.value}, expected {exp.state.value} "
            f"({last.get('failure') or last.get('why')})"
        )
    elif exp.failure_code is not None:
        failure = frames[-1].get("failure") if frames else None
        code = failure.get("code") if isinstance(failure, dict) else None
        if code != exp.failure_code:
            v.append(f"{who}: failed with code {code}, expected {exp.failure_code}")
    # attempts: numbered 1, 2, ... in claim order; what each launched attempt ran
    launched: dict[str, tuple[str, str]] = {}
    numbers = []
    for f in frames:
        att = f.get("attempt")
        if not isinstance(att, dict):
            continue
        if f.get("from") == State.READY.value and f.get("to") == State.CLAIMED.value:
            numbers.append(att.get("n"))
        if f.get("from") == State.CLAIMED.value and f.get("to") == State.RUNNING.value:
            launched[str(att.get("id"))] = (str(att.get("step")), str(f.get("act")))
    tally["attempts"] += len(launched)
    if numbers != list(range(1, len(numbers) + 1)):
        v.append(f"{who}: attempts were numbered {numbers}")
    # commits: each activation ended exactly once, re-runs only before its end
    endings: list[tuple[int, str, str]] = []
    ending_attempts: set[str] = set()
    closed: set[int] = set()
    seen: set[str] = set()
    reruns: Counter[str] = Counter()
    committing = State.COMMITTING.value
    for before, f in itertools.pairwise(frames):
        if f.get("from") != committing or f.get("to") == committing:
            continue
        tally["commits"] += 1
        raw = f.get("attempt")
        committed = raw if isinstance(raw, dict) else {}
        aid = str(committed.get("id"))
        act = int(before.get("act", 0))
        why = str(f.get("why"))
        if aid in seen:
            v.append(f"{who}: attempt {aid} committed twice ({why})")
        seen.add(aid)
        if act in closed:
            v.append(f"{who}: activation {act} committed again after it ended ({aid}: {why})")
        if why.startswith(RERUN_WHY):
            kind = RERUN_KIND[next(w for w in RERUN_WHY if why.startswith(w))]
            reruns[kind] += 1
            tally[f"rerun_{kind}"] += 1
            continue
        closed.add(act)
        endings.append((act, str(committed.get("step")), why))
        ending_attempts.add(aid)
        tally["ending_commits"] += 1
    if seen != set(launched):
        v.append(
            f"{who}: launched attempts {sorted(launched)} but committed {sorted(seen)}: every "
            "attempt that started must end in exactly one commit"
        )
    if endings != exp.commits:
        v.append(f"{who}: activations committed as {endings}, expected {exp.commits}")
    if reruns["process_failure"] > kills:
        v.append(
            f"{who}: {reruns['process_failure']} process failures but only {kills} attempt kills"
        )
    if reruns["retry_requested"] > (1 if exp.kind == "retry" else 0):
        v.append(f"{who}: flow_retry committed {reruns['retry_requested']} times")
    # takeovers: a move out of an active state by another actor than the previous move
    for before, f in itertools.pairwise(frames):
        src = f.get("from")
        if src not in {s.value for s in ACTIVE_KINDS} or f.get("by") == before.get("by"):
            continue
        ev = f.get("evidence")
        label = f"{src}->{f.get('to')}"
        if isinstance(ev, dict) and ev.get("evidence"):
            recoveries[f"{label} {ev['evidence']}"] += 1
            owner = ev.get("owner")
            if dead is not None and owner not in dead and ev["evidence"] != "lease_expired":
                v.append(
                    f"{who}: {label} by {f.get('by')} took over from {owner}, which was "
                    f"alive (evidence {ev['evidence']})"
                )
            continue
        tally["takeovers_without_evidence"] += 1
        what = f"{who}: takeover {label} by {f.get('by')} (gen {f.get('gen')}) records no evidence"
        resumed = src == State.COMMITTING.value and f.get("to") == src
        if (
            known is not None
            and resumed
            and f.get("why") == "commit resumed"
            and dead is not None
            and before.get("by") in dead
        ):
            known("resume-without-evidence", f"{what}; its owner {before.get('by')} was dead")
        else:
            v.append(what)
    # side effects: every execution is a launched attempt's, every committed outcome ran
    tally["audit_lines"] += len(lines)
    ran: Counter[str] = Counter()
    per_activation: Counter[tuple[str, str]] = Counter()
    for jid, step, line_act, aid in lines:
        ran[aid] += 1
        per_activation[(step, line_act)] += 1
        if jid != exp.id:
            v.append(f"{who}: audit line of job {jid!r} in its file")
        elif launched.get(aid) != (step, line_act):
            v.append(
                f"{who}: {aid} ran step {step} activation {line_act}, but the journal launched "
                f"it as {launched.get(aid)}"
            )
    for aid, n in ran.items():
        if n > 1:
            v.append(f"{who}: attempt {aid} ran its step {n} times")
    for aid in ending_attempts - set(ran):
        v.append(f"{who}: the outcome of {aid} was committed, but its step never ran")
    tally["audit_reexecutions"] += sum(n - 1 for n in per_activation.values())
    tally["audit_uncommitted"] += len(set(ran) - ending_attempts)
    return v


def job_dirs(root: str) -> Iterator[tuple[str, str]]:
    """(placement, key) of every job directory of the workspace (children included)."""
    stack = [(root, "")]
    while stack:
        d, placement = stack.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            if e.name.startswith(".") or not e.is_dir(follow_symlinks=False):
                continue
            sub = f"{placement}/{e.name}" if placement else e.name
            if names.KEY_RE.fullmatch(e.name) and os.path.exists(os.path.join(e.path, "job.json")):
                yield placement, e.name
                stack.append((e.path, sub))  # children live inside their parent
            elif placement and e.name in ("attempts", "run", "files"):
                continue
            else:
                stack.append((e.path, sub))


def audit(
    root: str,
    audit_dir: str,
    expected: list[Expected],
    killed: Counter[str],
    report: Report,
    dead: set[str] | None = None,
) -> None:
    """Check every invariant; violations and figures go into the report.

    - every job is terminal, in the state its program dictates (check_job);
    - each activation is committed exactly once (check_job);
    - exactly the expected jobs exist: one marker per job id, children of each parent
      exactly as spawned, no job directory without a marker, no marker without a
      payload whose job.json parses;
    - every side effect belongs to a launched attempt and every committed outcome's step
      ran (check_job);
    - `flow fsck` is clean (exit 0).
    """
    v = report.violations
    by_key = {e.key: e for e in expected}
    # markers: one per job, each of the grammar, each with its payload
    markers: dict[str, list[tuple[State, str, names.Marker]]] = defaultdict(list)
    base = os.path.join(root, ".flow", "state")
    for st in State:
        top = os.path.join(base, st.value)
        for d, _, files in os.walk(top):
            placement = os.path.relpath(d, top)
            for name in files:
                m = names.Marker.parse_or_none(name)
                if m is None:
                    v.append(f"not a marker: {os.path.join(d, name)}")
                    continue
                markers[m.key].append((st, placement, m))
    for key, found in markers.items():
        if len(found) > 1:
            v.append(f"job {key} has {len(found)} markers: {[f[0].value for f in found]}")
        if key not in by_key:
            v.append(f"job {key} was never submitted nor spawned (in {found[0][1]})")
    for key in by_key.keys() - markers.keys():
        v.append(f"{by_key[key].kind} job {key} has no marker (lost)")
    # payloads: exactly the expected job directories, children inside their parent
    dirs = set(job_dirs(root))
    want = {(e.placement, e.key) for e in expected}
    for placement, key in sorted(dirs - want):
        v.append(f"job directory {placement}/{key} is no expected job (orphan or duplicate child)")
    for placement, key in sorted(want - dirs):
        v.append(f"job directory {placement}/{key} is missing")
    # histories
    ws = Workspace.open(root)
    try:
        for key, found in markers.items():
            st, placement, m = found[-1]
            exp = by_key.get(key)
            if exp is None:
                continue
            if placement != exp.placement:
                v.append(f"job {key} has its marker under {placement}, expected {exp.placement}")
                continue
            try:
                jobs.load_spec(ws, placement, key)
            except FlowError as e:
                v.append(f"job {key}: marker without a valid payload: {e.render()}")
            h = JobHandle(st, placement, m)
            try:
                frames = jobs.history(ws, h)
            except FlowError as e:
                v.append(f"job {key}: history unreadable: {e.render()}")
                continue
            v.extend(
                check_job(
                    exp,
                    st,
                    frames,
                    read_audit(audit_dir, exp.id),
                    kills=killed[exp.id],
                    tally=report.tally,
                    recoveries=report.recoveries,
                    dead=dead,
                    known=report.known,
                )
            )
    finally:
        ws.close()
    # fsck
    r = subprocess.run(
        [*FLOW, "fsck", "-w", root, "--json"], capture_output=True, text=True, timeout=600
    )
    try:
        report.fsck = orjson.loads(r.stdout)
    except orjson.JSONDecodeError:
        report.fsck = {"clean": False, "output": r.stdout[-2000:] + r.stderr[-2000:]}
    report.fsck["exit"] = r.returncode
    if r.returncode != 0:
        problems = report.fsck.get("problems") or []
        v.append(f"flow fsck exited {r.returncode}: {problems[:5] or r.stderr[-500:]}")


# -- the whole run ----------------------------------------------------------------------


def run_chaos(cfg: ChaosConfig, *, say: Callable[[str], None] = print, command: str = "") -> Report:
    """Submit, serve under kills until every job is terminal, stop, audit; return the figures."""
    t0 = time.monotonic()
    report = Report(cfg, command=command)
    rng = random.Random(cfg.seed)
    work = Path(cfg.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    if (work / "ws").exists():
        raise SystemExit(f"{work / 'ws'} exists: give an empty --workdir")
    # a dead node's persistent workdirs are taken over on lease age (its attempts died too)
    root = make_workspace(work / "ws", durable=cfg.durable, persistent_takeover=cfg.nodes)
    report.root = root
    audit_dir = work / "audit"
    audit_dir.mkdir(exist_ok=True)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    program = work / "chaos-job.sh"
    program.write_text(JOB_SCRIPT)
    program.chmod(program.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)

    expected = submit_jobs(root, str(program), cfg, rng)
    report.jobs_top = cfg.jobs
    report.jobs_total = len(expected)
    report.kinds = dict(Counter(e.kind for e in expected if e.parent is None))
    say(f"chaos: {cfg.jobs} jobs submitted ({len(expected)} with children) in {root}")

    t_run = time.monotonic()
    with orphan_reaper():
        driver = Driver(cfg, root, str(audit_dir), logs, len(expected), rng, report, say)
        try:
            driver.run()
        finally:
            driver.stop()
            # nothing of the workspace may still run once its managers are gone
            time.sleep(0.2)
            for pid, state, _, jid in list(workspace_processes(root)):
                if state not in ("Z", "X"):
                    report.violations.append(f"attempt process {pid} of job {jid} still runs")
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
    report.run_seconds = time.monotonic() - t_run

    t_audit = time.monotonic()
    report.expected, report.audit_dir = expected, str(audit_dir)
    report.killed_jobs, report.dead_managers = driver.killed_jobs, driver.dead_ids()
    audit(root, str(audit_dir), expected, driver.killed_jobs, report, driver.dead_ids())
    report.audit_seconds = time.monotonic() - t_audit
    report.wall_seconds = time.monotonic() - t0
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--kills", type=int, default=100)
    ap.add_argument("--managers", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workdir", required=True, help="an empty (or new) directory")
    ap.add_argument("--json", dest="json_out", help="also write the figures here")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--lease", default="2s")
    ap.add_argument("--manager-share", type=float, default=0.4)
    ap.add_argument("--long-share", type=float, default=0.1, help="jobs whose steps last 0-2 s")
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--durable", action="store_true", help="fsync everything (policy)")
    ap.add_argument(
        "--lenient",
        dest="strict",
        action="store_false",
        help="count meetings with the (fixed) known bugs apart from violations",
    )
    ap.add_argument(
        "--nodes",
        action="store_true",
        help="each manager on a host of its own; a manager kill kills its attempts too",
    )
    a = ap.parse_args(argv)
    cfg = ChaosConfig(
        jobs=a.jobs,
        kills=a.kills,
        managers=a.managers,
        seed=a.seed,
        workdir=a.workdir,
        workers=a.workers,
        lease=a.lease,
        manager_share=a.manager_share,
        long_share=a.long_share,
        timeout=a.timeout,
        durable=a.durable,
        strict=a.strict,
        nodes=a.nodes,
    )
    command = shlex.join(
        ["python", "tests/chaos/chaos.py", *(argv if argv is not None else sys.argv[1:])]
    )
    report = run_chaos(cfg, say=lambda s: print(s, flush=True), command=command)
    print(report.render(), flush=True)
    if a.json_out:
        Path(a.json_out).write_bytes(orjson.dumps(report.to_json(), option=orjson.OPT_INDENT_2))
    return 1 if report.violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
