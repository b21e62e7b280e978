"""The chaos harness: many jobs, several managers, SIGKILLs and SIGSTOPs at random moments, then
an audit.

    python tests/chaos/chaos.py --jobs 1000 --kills 100 --freezes 30 --managers 3 --seed 1 \\
        --bigfan-share 0.002 --workdir /tmp/chaos [--json out.json]

What it does:

1. makes a workspace (retry backoff 0.2 s doubling to 2 s) and submits --jobs jobs of one
   bash program written with the bash runner API, whose behaviour a parameter picks:
   `normal` (one step), `steps` (main -> two -> three), `fanout` (2-5 children spawned with
   flow_spawn, joined with flow_wait, checked in a collect step), `fail` (main -> two,
   which calls flow_fail with code chaos_fail), `retry` (flow_retry on its first try,
   counted in a file of $FLOW_WORKDIR, then success) and, for the --bigfan-share of the
   jobs, `bigfan` (--bigfan-children children, 1,000 by default, spawned with the bash
   API's cheapest bulk form, joined, then a collect step that checks from their audit
   lines that every child ran and succeeded, each execution by an attempt of its own).
   Every step first appends the line `<job id> <step> <activation> <attempt id>` to a
   per-job file outside the workspace (the audited side effect), then sleeps 0-50 ms (0-2 s
   for the --long-share of jobs submitted with nap=long, so that kills also land in the
   middle of steps);
2. runs --managers `flow serve --workers 2 --lease 2s` processes while a driver, at random
   moments spread over the run, SIGKILLs either a whole manager (restarted after a short
   random delay) or the process group of one attempt (at most 2 per job), --kills in all,
   and SIGSTOPs a manager for 1-5 x the lease before it SIGCONTs it, --freezes in all (a
   frozen manager's lease expires, others take its work over, and once thawed it must be
   fenced: every rename it tries on that work fails). With --nodes every manager believes
   it runs on a host of its own, and a manager kill is a node death: its attempts are
   killed with it, and only lease evidence can recover them. Some of the kills and
   freezes (--aimed) are aimed at the manager that holds a big fan-out's commit while it
   registers the children (the parent's marker is `committing`). Every 0.5 s (or five
   times as long as the last read took) the driver also reads the whole state tree and
   counts the markers of every job: a job seen with two (confirmed by reading its placement
   again) is a violation, even if it has one by the end;
3. once every job is terminal, stops the managers with SIGTERM and audits the journal, the
   state tree, the audit files and `flow fsck` (see `audit` for the invariants). It prints
   the figures and exits 1 if any invariant was violated.

`run_chaos` is the same thing as a function (tests/chaos/test_chaos.py runs small ones).

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
import re
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

from httk_flow.errors import FlowError
from httk_flow.ops.logs import read_log
from httk_flow.ops.lookup import view
from httk_flow.protocol import jobs, layout, names
from httk_flow.protocol.children import child_id, child_placement
from httk_flow.protocol.discovery import walk_all
from httk_flow.protocol.durations import parse_duration
from httk_flow.protocol.journal import RawFrame as Frame
from httk_flow.protocol.leases import heartbeat_path
from httk_flow.protocol.states import State, ends_commit
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.transition import JobHandle
from httk_flow.protocol.workspace import Workspace

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
# a chaos job: the parameter "kind" (normal, steps, fail, retry, fanout, bigfan) picks its
# program
set -euo pipefail
# shellcheck disable=SC1090
source "$FLOW_BASH_API"

flow_steps main two three child collect bigkid bigcollect

# the audited side effect: one line per step execution, outside the workspace
audit() {
    local ctx="" act="?" d
    IFS= read -r -d '' ctx <"$FLOW_CONTEXT" || true
    if [[ $ctx =~ \"activation\":([0-9]+) ]]; then act=${BASH_REMATCH[1]}; fi
    printf '%s %s %s %s\n' "$FLOW_JOB_ID" "$FLOW_STEP" "$act" "$FLOW_ATTEMPT_ID" \
        >>"$CHAOS_AUDIT/$FLOW_JOB_ID"
    # the attempt's output: `flow logs` must give back exactly this (audit_output)
    printf '%s\n' "$FLOW_ATTEMPT_ID"
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
    bigfan)
        flow_param -v n kids
        # the API's cheapest bulk form: one flow_spawn (pure bash, no process) per child,
        # default labels c1..cN, no tag, no parameter; flow_wait writes children.jsonl once
        for ((i = 0; i < n; i++)); do flow_spawn --step bigkid; done
        flow_wait bigcollect --all-succeeded
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

step_bigkid() {
    audit
    flow_succeed
}

# every child of the big fan-out succeeded, and ran: its audit file has a line for each of
# its executions, all of step bigkid in activation 1, each by an attempt of its own (a
# re-execution after a kill is a new attempt; the harness checks it against the journal)
step_bigcollect() {
    local kids label id state path n=0 i bad="" nbad=0 jid s act aid aids k
    local -A labels=() ids=()
    audit
    flow_param -v kids kids
    while read -r label id state path; do
        n=$((n + 1))
        if [[ -n ${labels[$label]-} || -n ${ids[$id]-} ]]; then
            bad+=" $label:listed-twice" nbad=$((nbad + 1))
        fi
        labels[$label]=1 ids[$id]=1
        if [[ $state != succeeded ]]; then
            bad+=" $label:$state" nbad=$((nbad + 1))
            continue
        fi
        if [[ ! -f $CHAOS_AUDIT/$id ]]; then
            bad+=" $label:never-ran" nbad=$((nbad + 1))
            continue
        fi
        aids=" " k=0
        while read -r jid s act aid; do
            k=$((k + 1))
            if [[ $jid != "$id" || $s != bigkid || $act != 1 || $aids == *" $aid "* ]]; then
                bad+=" $label:ran-as:$s/$act/$aid" nbad=$((nbad + 1))
            fi
            aids+="$aid "
        done <"$CHAOS_AUDIT/$id"
        if ((k == 0)); then bad+=" $label:never-ran" nbad=$((nbad + 1)); fi
    done < <(flow_children)
    for ((i = 1; i <= kids; i++)); do
        [[ -n ${labels[c$i]-} ]] || { bad+=" c$i:missing" nbad=$((nbad + 1)); }
    done
    if ((n != kids || nbad)); then
        flow_fail "big join mismatch: $n of $kids children, $nbad problems:${bad:0:600}" \
            chaos_bad_join
        return
    fi
    flow_succeed "$n children, each ran and succeeded"
}

flow_main "$@"
"""

#: how often each kind of job is submitted
MIX = {"normal": 0.2, "steps": 0.25, "fanout": 0.25, "fail": 0.1, "retry": 0.2}
#: the failure code of a job whose manager died during 3 consecutive attempts (the engine
#: fails a job that may be killing its managers); accepted only with the proof in its frames
MANAGER_DEATHS = "manager_deaths"
MAX_MANAGER_DEATHS = 3

#: (activation, step, why) of the commits that end each activation, per program
EXPECTED_COMMITS: dict[str, list[tuple[int, str, str]]] = {
    "normal": [(1, "main", "succeed")],
    "steps": [(1, "main", "advance"), (2, "two", "advance"), (3, "three", "succeed")],
    "fail": [(1, "main", "advance"), (2, "two", "fail")],
    "retry": [(1, "main", "succeed")],
    "fanout": [(1, "main", "wait"), (2, "collect", "succeed")],
    "child": [(1, "child", "succeed")],
    "bigfan": [(1, "main", "wait"), (2, "bigcollect", "succeed")],
    "bigkid": [(1, "bigkid", "succeed")],
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
    #: the workspace's output policy: "files", or "stream" (output into log segments)
    logs: str = "files"
    #: every manager runs on a host of its own (its gethostname lies) and a manager kill
    #: is a node death: the manager and its attempts die together, and the work is taken
    #: over on lease evidence (the workspace allows persistent workdirs to be)
    nodes: bool = False
    #: count meetings with KNOWN_BUGS as violations (they are fixed: any meeting is a regression)
    strict: bool = True
    #: kills and freezes fire while this share of the jobs is terminal, uniformly spread
    kill_window: tuple[float, float] = (0.02, 0.85)
    #: SIGSTOPs of a manager, each SIGCONTed after freeze_leases x the lease (random)
    freezes: int = 0
    freeze_leases: tuple[float, float] = (1.0, 5.0)
    #: the share of the jobs that are big fan-outs (at least one when above 0), and their size
    #: pools the jobs are spread over, the default's and p1, p2, ...: each other pool's
    #: ready jobs lie in a class directory of their own (protocol.md §1)
    pools: int = 1
    bigfan_share: float = 0.0
    bigfan_children: int = 1000
    #: kills and freezes (taken from --kills and --freezes) aimed at the manager that holds
    #: a big fan-out's commit while it registers the children; -1: two per big fan-out
    aimed: int = -1
    #: seconds between two reads of the whole state tree (markers per job) during the run
    #: (longer when a read takes more than a fifth of that)
    scan_every: float = 0.5
    verbose: bool = True

    @property
    def lease_seconds(self) -> float:
        return parse_duration(self.lease, "--lease")

    @property
    def bigfans(self) -> int:
        if self.bigfan_share <= 0:
            return 0
        return min(self.jobs, max(1, round(self.jobs * self.bigfan_share)))


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
    def big(self) -> bool:
        return self.kind == "bigfan"

    @property
    def failure_code(self) -> str | None:
        return "chaos_fail" if self.kind == "fail" else None

    @property
    def commits(self) -> list[tuple[int, str, str]]:
        return EXPECTED_COMMITS[self.kind]


def expected_children(parent: Expected) -> list[Expected]:
    """The children a parent spawns: labels c1..cN of activation 1; a fanout's are tagged
    `kid` and run step child, a bigfan's have no tag and run step bigkid."""
    placement = child_placement(parent.placement, parent.key)
    tag, kind = (None, "bigkid") if parent.big else ("kid", "child")
    out = []
    for i in range(1, parent.kids + 1):
        cid = child_id(parent.id, 1, f"c{i}")
        out.append(Expected(cid, names.make_key(cid, tag), placement, kind, 0, parent.id))
    return out


@dataclass(frozen=True)
class Freeze:
    """One SIGSTOP of a manager: when (unix time), its heartbeat's mtime then, and the
    SIGCONT (or the SIGKILL that ended it frozen)."""

    manager: str
    start: float
    heartbeat: float | None
    end: float
    aimed: bool = False
    killed: bool = False


#: manager id: its freezes, in order
FreezeWindows = dict[str, list[Freeze]]


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
    freezes_planned: int = 0
    freezes: list[Freeze] = field(default_factory=list)
    kills_aimed: int = 0
    #: markers seen twice during the run (job key: what was seen), and the scans made
    run_duplicates: dict[str, str] = field(default_factory=dict)
    scans: int = 0
    scan_seconds: float = 0.0
    #: lines of thawed managers' logs saying a rename of theirs was fenced
    fenced_after_thaw: int = 0
    #: seconds from a frozen manager's last heartbeat to each takeover of its work
    frozen_silences: list[float] = field(default_factory=list)
    run_seconds: float = 0.0
    audit_seconds: float = 0.0
    wall_seconds: float = 0.0

    @property
    def frozen(self) -> FreezeWindows:
        out: FreezeWindows = defaultdict(list)
        for f in self.freezes:
            out[f.manager].append(f)
        return dict(out)

    @property
    def freezes_aimed(self) -> int:
        return sum(1 for f in self.freezes if f.aimed)

    @property
    def violation_kinds(self) -> Counter[str]:
        return Counter(violation_kind(v) for v in self.violations)

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
                "logs": c.logs,
                "nodes": c.nodes,
                "manager_share": c.manager_share,
                "long_share": c.long_share,
                "freezes": c.freezes,
                "freeze_leases": list(c.freeze_leases),
                "bigfans": c.bigfans,
                "bigfan_children": c.bigfan_children,
                "aimed": c.aimed,
            },
            "workspace": self.root,
            "jobs": {"submitted": self.jobs_top, "total": self.jobs_total, "kinds": self.kinds},
            "kills": {
                "planned": self.kills_planned,
                "managers": self.kills_manager,
                "attempts": self.kills_attempt,
                "aimed": self.kills_aimed,
            },
            "freezes": {
                "planned": self.freezes_planned,
                "fired": len(self.freezes),
                "aimed": self.freezes_aimed,
                "killed_while_frozen": sum(1 for f in self.freezes if f.killed),
                "windows": [
                    {
                        "manager": f.manager,
                        "start": round(f.start, 3),
                        "heartbeat": f.heartbeat,
                        "end": round(f.end, 3),
                        "aimed": f.aimed,
                        "killed": f.killed,
                    }
                    for f in self.freezes
                ],
                "takeovers_of_frozen": self.tally["takeovers_of_frozen"],
                "silence_before_takeover": _span(self.frozen_silences),
                "fenced_after_thaw": self.fenced_after_thaw,
            },
            "scans": {
                "count": self.scans,
                "seconds": round(self.scan_seconds, 1),
                "duplicates": self.run_duplicates,
            },
            "manager_deaths": {
                "accepted": self.tally["manager_deaths"],
                "by_killed_owners": self.tally["manager_deaths_killed"],
                "by_frozen_owners": self.tally["manager_deaths_frozen"],
            },
            "manager_starts": self.manager_starts,
            # for re-auditing a run's workspace later (audit(), with these and the freezes)
            "dead_managers": sorted(self.dead_managers),
            "attempt_kills_by_job": dict(sorted(self.killed_jobs.items())),
            "tally": dict(sorted(self.tally.items())),
            "recoveries": {"total": self.recovered, **dict(sorted(self.recoveries.items()))},
            "fsck": self.fsck,
            "violations": self.violations,
            "violations_by_kind": dict(sorted(self.violation_kinds.items())),
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
            f"{', output streamed' if c.logs == 'stream' else ''}"
            f"{', a host per manager (manager kills are node deaths)' if c.nodes else ''}",
            f"jobs: {self.jobs_top} submitted ({kinds}), {self.jobs_total} with children",
            f"kills: {self.kills} of {self.kills_planned} planned (managers {self.kills_manager}"
            f" / attempts {self.kills_attempt}); {self.manager_starts} manager starts"
            + (
                f"; the node deaths killed {t['node_death_attempts']} attempts with them"
                if c.nodes
                else ""
            ),
            *self._freeze_lines(),
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
            f"manager_deaths failures accepted (3 consecutive attempts taken over from dead "
            f"or frozen owners, in the frames): {t['manager_deaths']}",
            f"marker scans during the run: {self.scans} "
            f"({1000 * self.scan_seconds / max(1, self.scans):.0f} ms each), "
            f"{len(self.run_duplicates)} jobs seen with more than one marker",
            f"violations: {len(self.violations)}"
            + (
                " (" + ", ".join(f"{k} {n}" for k, n in self.violation_kinds.most_common()) + ")"
                if self.violations
                else ""
            ),
        ]
        if self.known_bugs:
            met = ", ".join(f"{k} {n}" for k, n in sorted(self.known_bugs.items()))
            lines.append(f"known bugs met (reported; not counted as violations): {met}")
            lines += [f"  {e}" for e in self.known_examples[:10]]
        by_kind: dict[str, list[str]] = defaultdict(list)
        for v in self.violations:
            by_kind[violation_kind(v)].append(v)
        for kind, vs in sorted(by_kind.items(), key=lambda kv: -len(kv[1])):
            lines.append(f"  [{kind}] {len(vs)}")
            lines += [f"    {v}" for v in vs[:6]]
            if len(vs) > 6:
                lines.append(f"    ... and {len(vs) - 6} more")
        lines.append(
            f"wall time: {self.wall_seconds:.1f} s (run {self.run_seconds:.1f} s, "
            f"audit {self.audit_seconds:.1f} s)"
        )
        return "\n".join(lines)

    def _freeze_lines(self) -> list[str]:
        c, t = self.config, self.tally
        out = []
        if c.freezes or self.freezes:
            secs = [f.end - f.start for f in self.freezes]
            span = f"{min(secs):.1f}-{max(secs):.1f} s" if secs else "-"
            out.append(
                f"freezes: {len(self.freezes)} of {self.freezes_planned} planned "
                f"({self.freezes_aimed} aimed at big fan-out registrations, "
                f"{sum(1 for f in self.freezes if f.killed)} killed while frozen; "
                f"frozen {span}); {t['takeovers_of_frozen']} takeover frames of frozen "
                f"managers' work, {_span(self.frozen_silences)} s after their last heartbeat; "
                f"{self.fenced_after_thaw} fenced attempts or lost races in their logs"
            )
        if c.bigfans:
            out.append(
                f"big fan-outs: {c.bigfans} x {c.bigfan_children} children; "
                f"{self.kills_aimed} kills aimed at their registrations; their commits "
                f"taken over {t['bigfan_commit_takeovers']} times"
            )
        return out


def _span(xs: list[float]) -> str:
    return f"{min(xs):.1f}-{max(xs):.1f}" if xs else "-"


# -- violations by kind --------------------------------------------------------------------

#: (kind, pattern) in order: the first that matches a violation's text names its kind
VIOLATION_KINDS: list[tuple[str, re.Pattern[str]]] = [
    (k, re.compile(p))
    for k, p in (
        ("known-bug", r"^\[known bug "),
        ("timeout", r"^timeout: "),
        ("duplicate-marker-in-run", r"markers during the run"),
        ("duplicate-marker", r"^job \S+ has \d+ markers"),
        ("file-exists-failure", r"records `File exists`"),
        ("manager-deaths-unproven", r"manager_deaths without"),
        ("premature-takeover", r"before lease x takeover_factor"),
        ("takeover-of-live-manager", r"which was alive"),
        ("takeover-judged-wrong-owner", r"on evidence about another manager"),
        ("not-fenced", r"after it was taken over from it: not fenced"),
        ("takeover-without-evidence", r"records no evidence"),
        ("child-ran-twice", r"times in activation \d+, but the journal"),
        ("attempt-ran-twice", r"ran its step \d+ times"),
        (
            "committed-twice",
            r"committed twice|committed again after it ended|launched attempts .* but committed",
        ),
        ("wrong-commits", r"activations committed as"),
        ("wrong-end-state", r"ended \w+, expected|failed with code"),
        ("side-effect", r"journal launched it as|its step never ran|audit line of job"),
        ("process-failures-beyond-kills", r"process failures but only"),
        ("flow-retry-count", r"flow_retry committed"),
        ("chain", r"frame \d+|history does not start|last frame says|attempts were numbered"),
        (
            "jobs-and-payloads",
            r"job directory|never submitted|has no marker|marker without a valid payload"
            r"|history unreadable|has its marker under|not a marker",
        ),
        ("fsck", r"^flow fsck exited"),
        ("manager-exit", r"exited on its own"),
        ("drain", r"did not drain"),
        ("leftover-process", r"still runs"),
    )
]


def violation_kind(v: str) -> str:
    return next((k for k, p in VIOLATION_KINDS if p.search(v)), "other")


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


#: PF_EXITING among a process's flags (the ninth field of /proc/<pid>/stat)
_PF_EXITING = 0x4


def _dying(pid: int) -> bool:
    """The process has a SIGKILL pending, or is already exiting (or is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        with open(f"/proc/{pid}/status", "rb") as fh:
            status = dict(line.split(b":", 1) for line in fh.read().splitlines() if b":" in line)
        flags = int(fields[6])
        pending = int(status[b"SigPnd"], 16) | int(status[b"ShdPnd"], 16)
    except (OSError, IndexError, KeyError, ValueError):
        return True  # gone while we looked
    return bool(flags & _PF_EXITING) or bool(pending & (1 << (signal.SIGKILL - 1)))


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


def make_workspace(
    path: Path, *, durable: bool, persistent_takeover: bool = False, logs: str = "files"
) -> str:
    """A workspace whose retries back off 0.2 s, doubling up to 2 s."""
    ws = Workspace.create(str(path), logs=logs)
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
    if cfg.bigfans:
        for i in rng.sample(range(cfg.jobs), cfg.bigfans):
            kinds[i] = "bigfan"
    reqs = []
    for kind in kinds:
        params: dict[str, str | int | float | bool] = {"kind": kind}
        params["nap"] = "long" if rng.random() < cfg.long_share else "short"
        if kind == "fanout":
            params["kids"] = rng.randint(2, 5)
        elif kind == "bigfan":
            params["kids"] = cfg.bigfan_children
        # spread over cfg.pools pools: every ready job but the default pool's lies in a
        # class directory (protocol.md §1)
        pool = f"p{len(reqs) % cfg.pools}" if len(reqs) % cfg.pools else None
        reqs.append(
            SubmitRequest(program=program, tag=kind, params=params, retries=cfg.retries, pool=pool)
        )
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


#: (state, placement, marker name) of every marker of one job
Placed = list[tuple[State, str, str]]


def scan_markers(root: str) -> dict[str, Placed]:
    """Every marker of the state tree by job key (anything else in it is skipped)."""
    base = os.path.join(root, ".flow", "state")
    out: dict[str, Placed] = defaultdict(list)
    for st in State:
        top = os.path.join(base, st.value)
        stack = [(top, "")]
        while stack:
            d, placement = stack.pop()
            try:
                it = os.scandir(d)
            except OSError:
                continue
            with it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        if e.name.startswith("@"):
                            sub = placement  # a class directory: its placement's ready jobs
                        else:
                            sub = f"{placement}/{e.name}" if placement else e.name
                        stack.append((e.path, sub))
                        continue
                    key = _key_of(e.name)
                    if key:
                        out[key].append((st, placement, e.name))
    return out


def _key_of(name: str) -> str:
    cut = name.find(".p")
    return name[:cut] if cut > 0 else ""


def confirmed_duplicates(
    root: str, suspects: dict[str, Placed], tries: int = 3
) -> dict[str, list[tuple[State, str]]]:
    """The jobs a scan saw with more than one marker that still have more than one each
    time their placements are read again (one listing per state kind and placement, `tries`
    times); a job that merely moved during the scan drops out."""
    base = os.path.join(root, ".flow", "state")
    placements = sorted({pl for placed in suspects.values() for _, pl, _ in placed})
    left = set(suspects)
    found: dict[str, list[tuple[State, str]]] = {}
    for i in range(tries):
        found = defaultdict(list)
        for placement in placements:
            for st in State:
                d = os.path.join(base, st.value, placement)
                try:
                    entries = os.listdir(d)
                    for c in [n for n in entries if n.startswith("@")]:
                        entries += os.listdir(os.path.join(d, c))
                except OSError:
                    continue
                for n in entries:
                    key = _key_of(n)
                    if key in left:
                        found[key].append((st, n))
        left = {k for k in left if len(found.get(k, ())) > 1}
        if not left:
            return {}
        if i + 1 < tries:
            time.sleep(0.001)
    return {k: found[k] for k in sorted(left)}


# -- the driver -------------------------------------------------------------------------


@dataclass
class ManagerRun:
    """One manager process: its log, and how it ended ("killed", "exited", "stopped")."""

    proc: subprocess.Popen[bytes]
    log: Path
    ended: str = ""
    _id: str = ""

    @property
    def id(self) -> str:
        """The manager's id, from the first line of its log ("... manager <id> serving")."""
        if self._id:
            return self._id
        try:
            with open(self.log, "rb") as fh:
                first = fh.readline().decode(errors="replace").split()
        except OSError:
            return ""
        self._id = first[3] if len(first) > 4 and first[2] == "manager" else ""
        return self._id


@dataclass
class _Kill:
    at: float  # share of the jobs terminal when it is armed
    kind: str  # "manager", "attempt" or "freeze"
    due: float | None = None  # monotonic time it fires, once armed


@dataclass
class _Frozen:
    run: ManagerRun
    start: float  # unix time of the SIGSTOP
    heartbeat: float | None  # the heartbeat's mtime once the manager stopped
    until: float  # monotonic time of the SIGCONT
    aimed: bool


def _wait_stopped(pid: int, limit: float = 0.2) -> None:
    """Wait (briefly) until the process is in the stopped state, so it writes no more."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        st = _proc_stat(pid)
        if st is None or st[0] in ("T", "t", "Z", "X"):
            return
        time.sleep(0.002)


class Driver:
    """Keeps cfg.managers managers serving, kills managers and attempts and freezes managers
    on a plan (and some at big fan-outs' registrations), and reads the state tree as it goes."""

    def __init__(
        self,
        cfg: ChaosConfig,
        root: str,
        audit_dir: str,
        logs: Path,
        expected: list[Expected],
        rng: random.Random,
        report: Report,
        say: Callable[[str], None],
    ) -> None:
        self.cfg, self.root, self.logs, self.total = cfg, root, logs, len(expected)
        #: child key -> its parent's key: a child is never made once its parent has ended
        #: without it (a parent failed with manager_deaths before its wait; the audit judges)
        by_id = {e.id: e.key for e in expected}
        self.parent_of = {e.key: by_id[e.parent] for e in expected if e.parent in by_id}
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
        kills = [
            _Kill(rng.uniform(lo, hi), "manager" if rng.random() < cfg.manager_share else "attempt")
            for _ in range(cfg.kills)
        ]
        freezes = [_Kill(rng.uniform(lo, hi), "freeze") for _ in range(cfg.freezes)]
        self.plan = sorted(kills + freezes, key=lambda k: k.at)
        report.kills_planned = len(kills)
        report.freezes_planned = len(freezes)
        self.terminal = 0
        self.frozen: dict[int, _Frozen] = {}
        self.lease = cfg.lease_seconds
        self.ws = Workspace.open(root)
        self.factor = self.ws.policy.takeover_factor
        #: big fan-out parents (placement, key), and the committing markers already aimed at
        self.bigfans = [(e.placement, e.key) for e in expected if e.big]
        self.aim_budget = cfg.aimed if cfg.aimed >= 0 else 2 * len(self.bigfans)
        #: spread over the big fan-outs: each takes at most its share of the budget
        self.aim_each = -(-self.aim_budget // max(1, len(self.bigfans)))
        self.aimed: set[tuple[str, int]] = set()
        self.aimed_at: Counter[str] = Counter()
        self.aims = 0

    def start_manager(self) -> None:
        self.report.manager_starts += 1
        n = self.report.manager_starts
        flow = FLOW
        if self.cfg.nodes:
            # every manager start is a fresh node: its gethostname() answers node<n>
            flow = [sys.executable, "-c", ELSEWHERE, f"node{n:03d}"]
        argv = [*flow, "serve", "-w", self.root, "--workers", str(self.cfg.workers)]
        argv += ["--lease", self.cfg.lease]
        if self.cfg.pools > 1:
            argv += ["--pool", "default"]
            for i in range(1, self.cfg.pools):
                argv += ["--pool", f"p{i}"]
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

    def _kill_manager(self, p: subprocess.Popen[bytes] | None = None) -> bool:
        """SIGKILL a manager (frozen or not); with cfg.nodes, its node dies: its attempts
        die with it."""
        if p is None:
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
        if p.pid in self.frozen:
            self._record_thaw(self.frozen.pop(p.pid), killed=True)
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

    def _freeze(self, p: subprocess.Popen[bytes] | None = None, *, aimed: bool = False) -> bool:
        """SIGSTOP a manager for freeze_leases x the lease (an aimed freeze: long enough for
        its work to be taken over); it is SIGCONTed by _thaw."""
        if p is None:
            # a manager whose id is known (it is serving) and that is not frozen already
            ready = [q for q in self.procs if q.pid not in self.frozen and self._run_of(q).id]
            if not ready:
                return False
            p = self.rng.choice(ready)
        run = self._run_of(p)
        lo, hi = self.cfg.freeze_leases
        if aimed:
            lo = max(lo, self.factor + 0.5)
            hi = max(hi, lo)
        seconds = self.rng.uniform(lo, hi) * self.lease
        start = time.time()
        p.send_signal(signal.SIGSTOP)
        _wait_stopped(p.pid)
        try:
            beat: float | None = os.stat(heartbeat_path(self.ws, run.id)).st_mtime
        except OSError:
            beat = None
        self.frozen[p.pid] = _Frozen(run, start, beat, time.monotonic() + seconds, aimed)
        return True

    def _record_thaw(self, f: _Frozen, *, killed: bool = False) -> None:
        self.report.freezes.append(
            Freeze(f.run.id, f.start, f.heartbeat, time.time(), aimed=f.aimed, killed=killed)
        )

    def _thaw(self, now: float, *, every: bool = False) -> None:
        for pid, f in list(self.frozen.items()):
            if every or f.until <= now:
                del self.frozen[pid]
                with contextlib.suppress(ProcessLookupError):
                    f.run.proc.send_signal(signal.SIGCONT)
                self._record_thaw(f)

    def _take_from_plan(self, kinds: tuple[str, ...]) -> str | None:
        """Take the latest unfired kill or freeze of the first of `kinds` left in the plan."""
        for kind in kinds:
            left = [k for k in self.plan if k.kind == kind]
            if left:
                unarmed = [k for k in left if k.due is None] or left
                self.plan.remove(max(unarmed, key=lambda k: k.at))
                return kind
        return None

    def _aim(self) -> None:
        """A kill or a freeze of the manager that holds a big fan-out's commit (the parent
        is committing: the children are being registered), once per committing marker."""
        base = os.path.join(self.root, ".flow", "state", State.COMMITTING.value)
        for placement, key in self.bigfans:
            if self.aims >= self.aim_budget:
                return
            if self.aimed_at[key] >= self.aim_each:
                continue
            try:
                entries = os.listdir(os.path.join(base, placement))
            except OSError:
                continue
            for name in entries:
                m = names.Marker.parse_or_none(name)
                if m is None or m.key != key or (key, m.generation) in self.aimed:
                    continue
                self.aimed.add((key, m.generation))
                try:
                    holder = self.ws.reader.read(m.ref).get("by")
                except (OSError, FlowError):
                    continue
                p = next(
                    (q for q in self.procs if self._run_of(q).id == holder),
                    None,
                )
                if p is None or p.pid in self.frozen:
                    continue
                # each big fan-out: a freeze first, then a kill (of whoever resumed it), ...
                first = self.aimed_at[key] % 2 == 0
                prefer = ("freeze", "manager") if first else ("manager", "freeze")
                kind = self._take_from_plan(prefer)
                if kind is None:
                    self.aim_budget = 0
                    return
                self.aims += 1
                self.aimed_at[key] += 1
                self.say(f"  aimed {kind} at {holder}, registering the children of {key}")
                if kind == "freeze":
                    self._freeze(p, aimed=True)
                else:
                    self._kill_manager(p)
                    self.report.kills_aimed += 1

    def _scan(self, elapsed: float) -> bool:
        """Read the whole state tree: count the terminal jobs, and report any job with more
        than one marker (confirmed by reading its placement again). True when every job is
        terminal."""
        t0 = time.monotonic()
        markers = scan_markers(self.root)
        terminal = active = 0
        suspects: dict[str, Placed] = {}
        for key, placed in markers.items():
            for st, _, _ in placed:
                if st.is_terminal:
                    terminal += 1
                else:
                    active += 1
            if len(placed) > 1 and key not in self.report.run_duplicates:
                suspects[key] = placed
        if suspects:
            for key, found in confirmed_duplicates(self.root, suspects).items():
                what = ", ".join(f"{st.value} {n}" for st, n in found)
                self.report.run_duplicates[key] = what
                self.report.violations.append(
                    f"job {key} had {len(found)} markers during the run, {elapsed:.1f} s "
                    f"into it: {what}"
                )
        # children that can no longer be made count as settled (the audit says if rightly)
        unborn = sum(
            1
            for key, parent in self.parent_of.items()
            if key not in markers and any(st.is_terminal for st, _, _ in markers.get(parent, []))
        )
        self.report.scans += 1
        self.report.scan_seconds += time.monotonic() - t0
        self.terminal = terminal
        return terminal + unborn >= self.total and not active

    def run(self) -> None:
        for _ in range(self.cfg.managers):
            self.start_manager()
        start = time.monotonic()
        deadline = start + self.cfg.timeout
        next_scan = 0.0
        next_aim = 0.0
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
            self._thaw(now)
            if now >= next_scan:
                if self._scan(now - start):
                    return
                # every scan_every seconds, but never more than a fifth of the driver's time
                # (a scan of thousands of markers on a loaded machine takes a while)
                took = time.monotonic() - now
                next_scan = now + max(self.cfg.scan_every, 5 * took)
                share = self.terminal / max(1, self.total)
                for k in self.plan:
                    if k.due is None and k.at <= share:
                        k.due = now + self.rng.uniform(0.0, 0.5)
            for k in [k for k in self.plan if k.due is not None and k.due <= now]:
                if k.kind == "manager":
                    fired = self._kill_manager()
                elif k.kind == "attempt":
                    fired = self._kill_attempt()
                else:
                    fired = self._freeze()
                if fired:
                    self.plan.remove(k)
                else:
                    k.due = now + 0.02  # nothing to kill just now: look again shortly
            if self.bigfans and self.aims < self.aim_budget and now >= next_aim:
                next_aim = now + 0.05
                self._aim()
            if self.cfg.verbose and now >= next_say:
                next_say = now + 10
                self.say(
                    f"  {now - start:6.0f} s: {self.terminal}/{self.total} terminal, kills "
                    f"{self.report.kills_manager} managers / {self.report.kills_attempt} "
                    f"attempts, {len(self.report.freezes) + len(self.frozen)} freezes, "
                    f"{len(self.procs) - len(self.frozen)} managers up, "
                    f"{len(self.frozen)} frozen"
                )
            time.sleep(0.01)

    def stop(self) -> None:
        """Thaw every frozen manager, then SIGTERM every manager (a drain); one that does not
        exit in time is a violation."""
        for t in list(self.restarts):
            self.restarts.remove(t)
        self._thaw(time.monotonic(), every=True)
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
        self.ws.close()

    def dead_ids(self) -> set[str]:
        """Managers that died under their work (killed by us, or exited on their own)."""
        return {r.id for r in self.runs if r.ended in ("killed", "exited") and r.id}

    def fenced_after_thaw(self) -> int:
        """Lines of the logs of managers that were frozen saying that an attempt of theirs
        was fenced (its marker had been taken over while they were frozen) or that they
        lost a race for a marker."""
        frozen = {f.manager for f in self.report.freezes}
        n = 0
        for r in self.runs:
            if r.id not in frozen:
                continue
            with contextlib.suppress(OSError):
                n += sum(
                    1
                    for line in r.log.read_text(errors="replace").splitlines()
                    if "fenced" in line or "lost the race" in line
                )
        return n


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


ACTIVE_VALUES = frozenset(st.value for st in ACTIVE_KINDS)
#: the text an EEXIST error renders as: a child created twice meets it
FILE_EXISTS = "File exists"


def _frozen_at(
    frozen: FreezeWindows | None, owner: object, t: object, slack: float
) -> Freeze | None:
    """The freeze of `owner` during which (or within `slack` seconds after which) time t fell."""
    if not frozen or not isinstance(owner, str) or not isinstance(t, int | float):
        return None
    return next((f for f in frozen.get(owner, ()) if f.start <= t <= f.end + slack), None)


def _holder(before: Frame, f: Frame) -> str | None:
    """Who held the work that frame f moves out of an active state: whoever wrote the frame
    before (the committing frame of a commit, the claim, the launch), but the attempt's
    manager for a cancellation (the frame before is the canceller's)."""
    if f.get("from") == State.CANCELLING.value:
        att = before.get("attempt")
        holder = att.get("manager") if isinstance(att, dict) else None
    else:
        holder = before.get("by")
    return holder if isinstance(holder, str) else None


def _ends_commit(f: Frame) -> bool:
    """`committing -> X` (X not committing) or the direct `running -> succeeded`."""
    src, to = f.get("from"), f.get("to")
    return isinstance(src, str) and isinstance(to, str) and ends_commit(State(src), State(to))


def _commits(frames: list[Frame]) -> list[tuple[int, int]]:
    """(index of the frame that entered committing, index of the commit) of every commit
    (`committing -> X`, X not committing; resumed commits enter at their first frame; a
    direct commit `running -> succeeded` enters and ends at the same frame)."""
    out = []
    for i, f in enumerate(frames):
        if not _ends_commit(f):
            continue
        if f.get("from") == State.RUNNING.value:
            out.append((i, i))
            continue
        j = i - 1
        while j > 0 and frames[j].get("from") == State.COMMITTING.value:
            j -= 1
        out.append((j, i))
    return out


def manager_deaths_proof(
    frames: list[Frame],
    dead: set[str] | None,
    frozen: FreezeWindows | None,
    slack: float,
) -> tuple[str | None, str]:
    """Whether a job failed with manager_deaths shows the proof in its frames: its last
    MAX_MANAGER_DEATHS commits (so, consecutive attempts) each began with a takeover of its
    running attempt (running -> committing by another manager than the one that launched it)
    recording evidence other than `stopped`, whose owner had died (killed by the driver, or
    exited by itself) or was frozen then; the first ones re-ran the activation as
    interrupted, and the last is the failure. Returns (None, "killed" or "frozen") when
    it does, else (why not, "")."""
    commits = _commits(frames)
    if not commits or commits[-1][1] != len(frames) - 1:
        return "the failure is not the commit of an attempt", ""
    if len(commits) < MAX_MANAGER_DEATHS:
        return f"only {len(commits)} attempts were committed", ""
    how = "killed"
    last = commits[-MAX_MANAGER_DEATHS:]
    for n, (j, i) in enumerate(last):
        enter, before, end = frames[j], frames[j - 1], frames[i]
        att = enter.get("attempt")
        aid = att.get("id") if isinstance(att, dict) else "?"
        want = MANAGER_DEATHS if n == len(last) - 1 else "interrupted"
        if not str(end.get("why")).startswith(want):
            return f"attempt {aid} was committed as {end.get('why')!r}, not {want!r}", ""
        if enter.get("from") != State.RUNNING.value or enter.get("by") == before.get("by"):
            return f"attempt {aid} was committed by the manager that ran it", ""
        ev = enter.get("evidence")
        if not isinstance(ev, dict) or not ev.get("evidence"):
            return f"the takeover of attempt {aid} records no evidence", ""
        if "stopped" in (ev.get("evidence"), ev.get("owner_evidence")):
            return f"the owner of attempt {aid} stopped cleanly (it did not die)", ""
        owner = ev.get("owner")
        if isinstance(att, dict) and owner != att.get("manager"):
            return f"the takeover of attempt {aid} judged {owner}, not its manager", ""
        if dead is None or owner in dead:
            continue
        if _frozen_at(frozen, owner, enter.get("t"), slack) is not None:
            how = "frozen"
            continue
        return f"the owner {owner} of attempt {aid} was alive (neither killed nor frozen)", ""
    return None, how


def _file_exists(frames: list[Frame]) -> str | None:
    """The first frame that records an error `File exists` (EEXIST), rendered, or None."""
    for f in frames:
        failure = f.get("failure")
        texts = [f.get("why"), f.get("message")]
        if isinstance(failure, dict):
            texts.append(failure.get("message"))
        for text in texts:
            if isinstance(text, str) and FILE_EXISTS in text:
                return f"gen {f.get('gen')} {f.get('from')}->{f.get('to')}: {text[:300]}"
    return None


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
    frozen: FreezeWindows | None = None,
    lease: float | None = None,
    factor: float = 2.0,
    children_died: bool = False,
    silences: list[float] | None = None,
) -> list[str]:
    """Every invariant of one job's history and side effects; returns the violations.

    What is counted as a commit: a frame `committing -> X` with X not committing, or a
    direct commit `running -> succeeded`. Its activation is the `act` of the frame before
    it (the committing frame, or the running one). A commit whose `why` starts
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
      and only `retry` jobs call flow_retry, once at most;
    - a child (of a fan-out) executed its step at most once per activation, plus once per
      re-run of that activation the journal committed (a kill, an interruption);
    - no frame records an error `File exists` (a child registered twice meets it);
    - a takeover of a frozen manager's work came no sooner than lease x takeover_factor
      after its last heartbeat (`frozen`: its freezes, with that heartbeat's mtime), its
      evidence is about the manager that held the work, and that manager never moved the
      job for that attempt again (it was fenced);
    - a failure with code manager_deaths is the program's ending only with its proof
      (manager_deaths_proof); the commits before it are then a prefix of the program's,
      and a parent whose child failed so (`children_died`) may fail with
      dependency_failure after its wait.
    """
    v: list[str] = []
    who = f"{exp.kind} job {exp.key}"
    tally["frames"] += len(frames)
    slack = (lease or 2.0) * factor
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
    failure = frames[-1].get("failure") if frames else None
    code = failure.get("code") if isinstance(failure, dict) else None
    # a job failed because its managers died under 3 consecutive attempts: only with proof
    died = False
    if state is State.FAILED and code == MANAGER_DEATHS:
        why_not, how = manager_deaths_proof(frames, dead, frozen, slack)
        if why_not is None:
            died = True
            tally["manager_deaths"] += 1
            tally[f"manager_deaths_{how}"] += 1
        else:
            v.append(
                f"{who}: failed with manager_deaths without the proof of "
                f"{MAX_MANAGER_DEATHS} consecutive attempts taken over from dead owners: "
                f"{why_not}"
            )
    # a parent whose join became impossible because a child failed so
    orphaned = children_died and state is State.FAILED and code == "dependency_failure"
    if orphaned:
        tally["dependency_failures_after_manager_deaths"] += 1
    # the end state the program dictates
    if died or orphaned:
        pass
    elif state is not exp.state:
        last = frames[-1] if frames else {}
        v.append(
            f"{who}: ended {state.value}, expected {exp.state.value} "
            f"({last.get('failure') or last.get('why')})"
        )
    elif exp.failure_code is not None and code != exp.failure_code:
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
    rerun_acts: Counter[int] = Counter()
    committing = State.COMMITTING.value
    for before, f in itertools.pairwise(frames):
        if not _ends_commit(f):
            continue
        tally["commits"] += 1
        if f.get("from") == State.RUNNING.value:
            tally["direct_commits"] += 1
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
            rerun_acts[act] += 1
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
    if died:
        # the activations before the failure ended as the program says; then it failed
        done = endings[:-1]
        if done != exp.commits[: len(done)] or not endings or endings[-1][2] != MANAGER_DEATHS:
            v.append(
                f"{who}: activations committed as {endings}, expected a prefix of "
                f"{exp.commits} and then the manager_deaths failure"
            )
    elif orphaned:
        if endings != exp.commits[:1]:
            v.append(f"{who}: activations committed as {endings}, expected {exp.commits[:1]}")
    elif endings != exp.commits:
        v.append(f"{who}: activations committed as {endings}, expected {exp.commits}")
    if reruns["process_failure"] > kills:
        v.append(
            f"{who}: {reruns['process_failure']} process failures but only {kills} attempt kills"
        )
    if reruns["retry_requested"] > (1 if exp.kind == "retry" else 0):
        v.append(f"{who}: flow_retry committed {reruns['retry_requested']} times")
    # no error `File exists` anywhere in the history (a child registered twice meets it)
    eexist = _file_exists(frames)
    if eexist is not None:
        v.append(f"{who}: a frame records `{FILE_EXISTS}`: {eexist}")
    # takeovers: a move out of an active state by another actor than the previous move
    for before, f in itertools.pairwise(frames):
        src = f.get("from")
        if src not in ACTIVE_VALUES or f.get("by") == before.get("by"):
            continue
        ev = f.get("evidence")
        label = f"{src}->{f.get('to')}"
        if exp.big and src == committing:
            tally["bigfan_commit_takeovers"] += 1
        if isinstance(ev, dict) and ev.get("evidence"):
            recoveries[f"{label} {ev['evidence']}"] += 1
            owner = ev.get("owner")
            t = f.get("t")
            # the evidence must be about the manager that held the work
            holder = _holder(before, f)
            if holder is not None and owner != holder:
                v.append(
                    f"{who}: {label} by {f.get('by')} took over work held by {holder} on "
                    f"evidence about another manager, {owner} ({ev['evidence']})"
                )
            fz = _frozen_at(frozen, owner, t, slack)
            if fz is not None:
                tally["takeovers_of_frozen"] += 1
                if (
                    silences is not None
                    and fz.heartbeat is not None
                    and isinstance(t, int | float)
                    and t <= fz.end
                ):
                    silences.append(t - fz.heartbeat)
                if (
                    lease is not None
                    and fz.heartbeat is not None
                    and isinstance(t, int | float)
                    and t <= fz.end
                    and t - fz.heartbeat < lease * factor - 0.05
                ):
                    v.append(
                        f"{who}: {label} by {f.get('by')} took over from {owner} "
                        f"{t - fz.heartbeat:.2f} s after its last heartbeat, while it was "
                        f"frozen: before lease x takeover_factor = {lease * factor:.1f} s"
                    )
            lease_evidence = "lease_expired" in (ev["evidence"], ev.get("owner_evidence"))
            if dead is not None and owner not in dead and not lease_evidence and fz is None:
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
    # fencing: once an attempt (or its commit) was taken over from a manager, that manager
    # never moves the job for that attempt again (a thawed manager's renames all fail),
    # unless it takes the work over in its turn, on evidence about the then holder
    taken: dict[str, set[str]] = defaultdict(set)
    for before, f in itertools.pairwise(frames):
        raw = f.get("attempt")
        if not isinstance(raw, dict):
            continue
        aid, by = str(raw.get("id")), f.get("by")
        ev = f.get("evidence")
        holder = _holder(before, f) if f.get("from") in ACTIVE_VALUES else None
        if holder is not None and by != before.get("by") and isinstance(ev, dict):
            if ev.get("owner") == holder:
                taken[aid].discard(str(by))  # a takeover of its own, with evidence
            taken[aid].add(holder)
        if by in taken[aid]:
            v.append(
                f"{who}: {by} moved it {f.get('from')}->{f.get('to')} (gen "
                f"{f.get('gen')}) for attempt {aid} after it was taken over from it: not fenced"
            )
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
    if exp.parent is not None:
        # a child ran once per activation, and again only after a re-run the journal shows
        for (step, line_act), n in sorted(per_activation.items()):
            allowed = 1 + (rerun_acts[int(line_act)] if line_act.isdigit() else 0)
            if n > allowed:
                v.append(
                    f"{who}: step {step} ran {n} times in activation {line_act}, but the "
                    f"journal re-ran that activation only {allowed - 1} times"
                )
        tally["child_executions"] += len(lines)
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
            elif placement and (e.name in layout.JOB_INTERNALS or layout.is_attempt_name(e.name)):
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
    frozen: FreezeWindows | None = None,
) -> None:
    """Check every invariant; violations and figures go into the report.

    - every job is terminal, in the state its program dictates (check_job), or failed
      with manager_deaths with the proof in its frames (then a fan-out parent that failed
      before its wait spawned no children, and one whose child failed so may fail with
      dependency_failure);
    - each activation is committed exactly once (check_job);
    - exactly the expected jobs exist: one marker per job id, children of each parent
      exactly as spawned, no job directory without a marker, no marker without a
      payload whose job.json parses; a job with more than one marker has each of its
      histories read (for an error `File exists`);
    - every side effect belongs to a launched attempt and every committed outcome's step
      ran; a child ran at most once per activation and re-run (check_job);
    - no takeover of a frozen manager's work before lease x takeover_factor (check_job);
    - every finished job's `flow logs` is what its last attempt printed (audit_output);
    - `flow fsck` is clean (exit 0).
    """
    v = report.violations
    by_key = {e.key: e for e in expected}
    # markers: one per job, each of the grammar, each with its payload
    markers: dict[str, list[tuple[State, str, names.Marker]]] = defaultdict(list)
    base = os.path.join(root, ".flow", "state")
    class_dirs = Workspace.open(root).class_dirs
    for st in State:
        top = os.path.join(base, st.value)
        for d, _, files in os.walk(top):
            placement = os.path.relpath(d, top)
            head, _, last = placement.rpartition("/")
            in_class = last[1:] if last.startswith("@") else ""
            if in_class:
                placement = head
            for name in files:
                m = names.Marker.parse_or_none(name)
                if m is None:
                    v.append(f"not a marker: {os.path.join(d, name)}")
                    continue
                if in_class != (m.service if st is State.READY and class_dirs else ""):
                    v.append(f"a marker outside its class directory: {os.path.join(d, name)}")
                markers[m.key].append((st, placement, m))
    ws = Workspace.open(root)
    try:
        lease, factor = report.config.lease_seconds, ws.policy.takeover_factor
        slack = lease * factor
        for key, found in markers.items():
            if len(found) > 1:
                v.append(f"job {key} has {len(found)} markers: {[f[0].value for f in found]}")
                # every marker has a history of its own: read the others' too
                for st, placement, m in found[:-1]:
                    try:
                        other = jobs.history_json(ws, JobHandle(st, placement, m))
                    except FlowError:
                        continue
                    eexist = _file_exists(other)
                    if eexist is not None:
                        v.append(
                            f"job {key}: the history of its marker {st.value} g{m.generation} "
                            f"records `{FILE_EXISTS}`: {eexist}"
                        )
            if key not in by_key:
                v.append(f"job {key} was never submitted nor spawned (in {found[0][1]})")
        # histories
        histories: dict[str, tuple[State, list[Frame]]] = {}
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
            try:
                histories[key] = (st, jobs.history_json(ws, JobHandle(st, placement, m)))
            except FlowError as e:
                v.append(f"job {key}: history unreadable: {e.render()}")
    finally:
        ws.close()
    # jobs failed with manager_deaths, with the proof: a parent that failed so before its
    # wait spawned nothing, and a parent whose child failed so may fail its join
    died: set[str] = set()
    for key, (st, frames) in histories.items():
        failure = frames[-1].get("failure") if frames else None
        code = failure.get("code") if isinstance(failure, dict) else None
        if (
            st is State.FAILED
            and code == MANAGER_DEATHS
            and manager_deaths_proof(frames, dead, frozen, slack)[0] is None
        ):
            died.add(by_key[key].id)
    unborn: set[str] = set()
    for x in expected:
        if x.id not in died or not x.kids or x.key not in histories:
            continue
        frames = histories[x.key][1]
        if not any(frames[i].get("why") == "wait" for _, i in _commits(frames)):
            unborn.add(x.id)
    excused = {x.key for x in expected if x.parent in unborn}
    orphans = {x.parent for x in expected if x.id in died and x.parent is not None}
    for key in by_key.keys() - markers.keys() - excused:
        v.append(f"{by_key[key].kind} job {key} has no marker (lost)")
    # payloads: exactly the expected job directories, children inside their parent
    dirs = set(job_dirs(root))
    want = {(e.placement, e.key) for e in expected if e.key not in excused}
    for placement, key in sorted(dirs - want):
        v.append(f"job directory {placement}/{key} is no expected job (orphan or duplicate child)")
    for placement, key in sorted(want - dirs):
        v.append(f"job directory {placement}/{key} is missing")
    for key, (st, frames) in histories.items():
        exp = by_key[key]
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
                frozen=frozen,
                lease=lease,
                factor=factor,
                children_died=exp.id in orphans,
                silences=report.frozen_silences,
            )
        )
    audit_output(root, v)
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


def audit_output(root: str, v: list[str]) -> None:
    """`flow logs` of every finished job gives back what its last attempt printed, its
    attempt id (wherever the output is: its files, beside job.json, a log record): a
    succeeded job's exactly, another's that or nothing (a kill may land before it
    printed), never another attempt's or job's output."""
    ws = Workspace.open(root)
    try:
        for st in (State.SUCCEEDED, State.FAILED, State.CANCELLED):
            for h in walk_all(ws, st):
                runs = view(ws, h).attempts
                if not runs:
                    continue
                want = f"{runs[-1].record.id}\n".encode()
                try:
                    got = b"".join(read_log(ws, h))
                except FlowError as e:
                    v.append(f"flow logs {h.key}: {e.render()}")
                    continue
                if got != want and (st is State.SUCCEEDED or got != b""):
                    v.append(f"flow logs {h.key} ({st.value}) gave {got[:200]!r}, not {want!r}")
    finally:
        ws.close()


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
    root = make_workspace(
        work / "ws", durable=cfg.durable, persistent_takeover=cfg.nodes, logs=cfg.logs
    )
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
        driver = Driver(cfg, root, str(audit_dir), logs, expected, rng, report, say)
        try:
            driver.run()
        finally:
            driver.stop()
            # nothing of the workspace may still run once its managers are gone; what they
            # killed may not have been scheduled to exit yet on a busy machine: a process
            # with a SIGKILL pending, or already exiting, is dead, however long it takes
            for pid, state, _, jid in list(workspace_processes(root)):
                if state not in ("Z", "X") and not _dying(pid):
                    report.violations.append(f"attempt process {pid} of job {jid} still runs")
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
    report.run_seconds = time.monotonic() - t_run

    t_audit = time.monotonic()
    report.expected, report.audit_dir = expected, str(audit_dir)
    report.killed_jobs, report.dead_managers = driver.killed_jobs, driver.dead_ids()
    report.fenced_after_thaw = driver.fenced_after_thaw()
    audit(
        root,
        str(audit_dir),
        expected,
        driver.killed_jobs,
        report,
        driver.dead_ids(),
        frozen=report.frozen,
    )
    report.audit_seconds = time.monotonic() - t_audit
    report.wall_seconds = time.monotonic() - t0
    return report


#: the options that set the ChaosConfig field of their name, of its type and with its default,
#: and the help of those whose name does not say it all
CONFIG_OPTIONS: dict[str, str | None] = {
    "jobs": None,
    "kills": None,
    "freezes": "SIGSTOPs of a manager, each SIGCONTed after 1-5 x the lease (random)",
    "managers": None,
    "seed": None,
    "workers": None,
    "lease": None,
    "manager_share": None,
    "long_share": "jobs whose steps last 0-2 s",
    "bigfan_share": "the share of the jobs that are big fan-outs (at least one when above 0)",
    "bigfan_children": "children of each big fan-out",
    "aimed": "kills and freezes (of --kills and --freezes) aimed at the manager registering a "
    "big fan-out's children (default: 2 per big fan-out)",
    "pools": "pools the jobs are spread over (every manager serves them all)",
    "scan_every": "seconds between two reads of the whole state tree during the run",
    "timeout": None,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", required=True, help="an empty (or new) directory")
    ap.add_argument("--json", dest="json_out", help="also write the figures here")
    defaults = ChaosConfig()
    for name, text in CONFIG_OPTIONS.items():
        default = getattr(defaults, name)
        flag = "--" + name.replace("_", "-")
        ap.add_argument(flag, type=type(default), default=default, help=text)
    ap.add_argument("--durable", action="store_true", help="fsync everything (policy)")
    ap.add_argument("--logs", choices=("files", "stream"), default="files", help="output policy")
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
        **{name: getattr(a, name) for name in CONFIG_OPTIONS},
        workdir=a.workdir,
        durable=a.durable,
        logs=a.logs,
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
