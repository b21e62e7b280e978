"""A field test: a real simulation code through real Slurm allocations shorter than the
campaign, with one manager killed and another frozen under running work.

The campaign is tests/field/eos.sh, an equation-of-state scan of silicon with Quantum
ESPRESSO's pw.x (Debian's quantum-espresso and quantum-espresso-data): a parent spawns one
child per lattice constant, each child writes its input (`prepare`) and runs one SCF
(`scf`), and the parent collects the energies into eos.csv (`aggregate`). Managers run
only inside one-minute Slurm allocations told to drain 10 s before their walltime:

1. `flow sbatch`: its manager is `kill -9`ed in the middle of an SCF;
2. `flow sbatch` twice: one of them takes that SCF over (the dead manager's process is
   gone), and the manager holding the next SCF is frozen (SIGSTOP) until its allocation's
   drain signal arrives (slurmstepd sends SIGCONT with it). On its own host a manager
   lives as long as its process (docs/protocol.md §8), so nobody takes that SCF over
   meanwhile and the campaign cannot end before that allocation's walltime drain;
3. `flow scale --backend slurm --max 1` keeps one more allocation coming while work
   remains, from the freeze on, and ends it once the queue is empty.

The same inputs run directly (pw.x serially in a temporary directory, no engine) beside
the campaign; every energy of the campaign must equal the direct run's, character for
character.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from helpers import ends_a_commit
from manager.support import JobInfo, all_jobs, children_of, dump, flow, fsck_report, job
from slurm.support import LIVE, Cluster, run

from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace
from httk_flow.scale.allocations import AllocationRecord, AllocationStore

from .conftest import PSEUDO_DIR

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
PROGRAM = HERE / "eos.sh"
TEMPLATE = HERE / "si.scf.in.template"
#: the scan: N lattice constants (celldm(1), bohr) from A_MIN to A_MAX, ends included
N, A_MIN, A_MAX = 8, 10.0, 10.5
#: the workspace's lease: a silent manager elsewhere is taken over after 2 x LEASE
LEASE = "4s"
#: every allocation: Slurm's shortest walltime, told to drain 10 s before it (Slurm
#: sends the signal 20-50 s after the start: it looks every 30 s), one CPU
ALLOCATION = ["--time", "1m", "--drain", "10s", "--sbatch-arg=--cpus-per-task=1"]
SERVE = ["--workers", "1", "--kill-grace", "2s"]
#: Slurm's drain signal comes at the latest this long after an allocation starts
SIGNAL_BY = 50.0
#: the whole campaign, from its submission to its aggregate
DEADLINE = 240.0


def lattice_constants() -> list[str]:
    """The scan as eos.sh computes it (awk's printf %.4f of the same expression)."""
    return [f"{A_MIN + (A_MAX - A_MIN) * i / (N - 1):.4f}" for i in range(N)]


def scf_input(alat: str) -> str:
    """The input eos.sh's step prepare writes for `alat`."""
    text = TEMPLATE.read_text()
    return text.replace("@ALAT@", alat).replace("@PSEUDO_DIR@", str(PSEUDO_DIR))


@dataclass(frozen=True)
class Direct:
    alat: str
    line: str  # pw.x's "!    total energy" line as printed
    seconds: float


def direct_run(pwx: str, alat: str, work: Path) -> Direct:
    """One SCF with no engine: pw.x serially in a directory of its own."""
    d = work / alat
    d.mkdir(parents=True)
    (d / "scf.in").write_text(scf_input(alat))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t = time.monotonic()
    p = subprocess.run(
        [pwx, "-in", "scf.in"], cwd=d, capture_output=True, text=True, env=env, timeout=600
    )
    seconds = time.monotonic() - t
    assert p.returncode == 0, f"direct pw.x for alat={alat}: {p.stderr[-2000:]}"
    assert "convergence has been achieved" in p.stdout, p.stdout[-2000:]
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("!")]
    assert len(lines) == 1, lines
    return Direct(alat, lines[0], seconds)


def energy_of(line: str) -> str:
    """The number of a total energy line, as printed."""
    words = line.split()
    assert words[:4] == ["!", "total", "energy", "="] and words[5] == "Ry", line
    return words[4]


# -- the workspace and the processes as the test watches them ---------------------------


def heartbeats(root: str) -> dict[str, dict[str, Any]]:
    """manager id -> its heartbeat body (pid, allocation token, ...), stopped ones too."""
    out: dict[str, dict[str, Any]] = {}
    for path in (Path(root) / ".flow" / "managers").glob("*/heartbeat.json"):
        with contextlib.suppress(OSError, ValueError):
            body = orjson.loads(path.read_bytes())
            out[str(body["id"])] = body
    return out


def pid_of(root: str, manager: str) -> int:
    """The pid of a live manager, from `flow managers --json`."""
    p = flow("managers", "-w", root, "--json")
    assert p.returncode == 0, p.stderr
    for m in orjson.loads(p.stdout)["managers"]:
        if m["id"] == manager:
            assert m["alive"], m
            return int(m["pid"])
    raise AssertionError(f"manager {manager} not in `flow managers`: {p.stdout}")


def mid_scf(info: JobInfo, root: str) -> bool:
    """A child running step scf whose pw.x has started and not yet converged."""
    if info.state is not State.RUNNING:
        return False
    attempt = info.last.get("attempt") or {}
    if attempt.get("step") != "scf":
        return False
    try:
        out = (info.job_dir(root) / "run" / "scf.out").read_text(errors="replace")
    except FileNotFoundError:
        return False
    return "Self-consistent Calculation" in out and "convergence has been achieved" not in out


def jobs_now(root: str) -> list[JobInfo]:
    """Every job once while managers move them: a walk of one state kind after another lists
    a job that moves into a later kind twice (the later place is kept)."""
    return list({info.handle.key: info for info in all_jobs(root)}.values())


def takeovers(root: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(job key, dead owner) -> (taker, evidence), over every job's history."""
    out: dict[tuple[str, str], tuple[str, str]] = {}
    for info in jobs_now(root):
        for f in info.frames:
            ev = f.get("evidence")
            if isinstance(ev, dict) and ev.get("owner"):
                taker = (str(f.get("by")), str(ev.get("evidence")))
                out.setdefault((info.handle.key, str(ev["owner"])), taker)
    return out


def commits(root: str) -> list[tuple[str, str, str]]:
    """(job key, committing manager, why) of every finished commit."""
    return [
        (info.handle.key, str(f.get("by")), str(f.get("why")))
        for info in jobs_now(root)
        for f in info.frames
        if ends_a_commit(f)
    ]


def process_state(pid: int) -> str:
    """The state letter of process `pid` (T: stopped), "" once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return ""
    return stat.rsplit(")", 1)[1].split()[0]


def term_pending(pid: int) -> bool:
    """SIGTERM waits on process `pid` (sent while it was stopped)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except FileNotFoundError:
        return False
    masks = [int(ln.split()[1], 16) for ln in lines if ln.startswith(("ShdPnd:", "SigPnd:"))]
    return any(m & (1 << (signal.SIGTERM - 1)) for m in masks)


def slurm_time(value: str) -> float:
    """A Slurm timestamp (local time, 2026-12-01T20:49:02) as a unix time."""
    return datetime.fromisoformat(value).timestamp()


class Campaign:
    """The workspace, and every Slurm job this test submitted (only those are cancelled)."""

    def __init__(self, root: str, cluster: Cluster) -> None:
        self.root = root
        self.cluster = cluster
        self.parent_id = ""
        self.sbatched: dict[str, str] = {}  # token -> Slurm job id
        self.scaling = False
        self.passes = 0
        self.events: list[str] = []
        #: allocations seen ended while the parent had not finished
        self.ended_mid: set[str] = set()
        self._last_pass = self._last_look = 0.0

    def sbatch(self) -> str:
        p = flow("sbatch", "-w", self.root, *ALLOCATION, "--json", "--", *SERVE)
        assert p.returncode == 0, p.stderr
        doc = orjson.loads(p.stdout)
        self.sbatched[doc["token"]] = str(doc["job_id"])
        return str(doc["token"])

    def scale(self) -> dict[str, Any]:
        argv = ["scale", "-w", self.root, "--backend", "slurm", "--max", "1", "--once"]
        argv += [*ALLOCATION, "--json"]
        argv += [f"--serve-arg={a}" for a in ("--workers=1", "--kill-grace=2s")]
        p = flow(*argv)
        assert p.returncode == 0, p.stderr
        self.passes += 1
        report: dict[str, Any] = orjson.loads(p.stdout.splitlines()[-1])
        return report

    def records(self) -> list[AllocationRecord]:
        ws = Workspace.open(self.root)
        try:
            return AllocationStore(ws).load_all()
        finally:
            ws.close()

    def scaled(self) -> dict[str, str]:
        return {r.token: r.handle or "" for r in self.records()}

    def allocations(self) -> dict[str, str]:
        """token -> Slurm job id ('' while unknown) of every allocation of this test."""
        out = {**self.sbatched, **self.scaled()}
        queue = {j.name: j.id for j in self.cluster.jobs()}
        for token, job_id in out.items():
            if not job_id and f"flow-{token}" in queue:
                out[token] = str(queue[f"flow-{token}"])
        return out

    def live(self) -> dict[str, str]:
        states = {str(j.id): j.state for j in self.cluster.jobs()}
        return {t: j for t, j in self.allocations().items() if j and states.get(j, "") in LIVE}

    def cancel(self, timeout: float = 90) -> None:
        live = self.live()
        if live:
            run("scancel", *live.values())
        deadline = time.monotonic() + timeout
        while self.live() and time.monotonic() < deadline:
            time.sleep(0.5)

    def managers_of(self, tokens: set[str]) -> set[str]:
        return {m for m, hb in heartbeats(self.root).items() if hb.get("allocation") in tokens}

    def log(self, token: str) -> str:
        job_id = self.allocations().get(token, "")
        path = Path(self.root) / ".flow" / "allocations" / "logs" / f"flow-{token}-{job_id}.out"
        return path.read_text(errors="replace") if path.exists() else f"(no {path})"

    def parent(self) -> JobInfo:
        # by the engine's lookup: a job moving while a walk lists it is seen twice or not at all
        return job(self.root, self.parent_id)

    def done(self) -> bool:
        return self.parent().state.is_terminal

    def tick(self) -> None:
        """Every 2 s: note the allocations that ended; every 3 s once scaling: one pass."""
        now = time.monotonic()
        if now - self._last_look >= 2:
            self._last_look = now
            if not self.done():  # `flow scale` ends nothing before the queue is empty
                live = self.live()
                self.ended_mid |= {t for t, j in self.allocations().items() if j and t not in live}
        if self.scaling and now - self._last_pass >= 3:
            self._last_pass = now
            self.scale()

    def wait(
        self, what: str, predicate: Callable[[], Any], timeout: float, every: float = 0.5
    ) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout:.0f} s\n{dump(self.root)}")
            self.tick()
            time.sleep(every)


def test_an_eos_scan_through_short_allocations_with_a_kill_and_a_freeze_matches_direct_runs(
    pwx: str, field_cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t_test = time.monotonic()
    alats = lattice_constants()
    # the direct runs go on beside the campaign (they share the machine's CPUs with it)
    pool = ThreadPoolExecutor(1)
    reference = [pool.submit(direct_run, pwx, a, tmp_path / "direct") for a in alats]

    p = flow("init", str(tmp_path / "ws"), "--lease", LEASE, "--json")
    assert p.returncode == 0, p.stderr
    root = str(orjson.loads(p.stdout)["workspace"])
    c = Campaign(root, field_cluster)
    frozen_pid: int | None = None
    try:
        argv = ["submit", "-w", root, "--name", "eos", "--step", "scan", "--json"]
        argv += ["--param", f"n={N}", "--param", f"a_min={A_MIN}", "--param", f"a_max={A_MAX}"]
        argv += ["--param", f"pwx={pwx}", "--input", str(TEMPLATE), str(PROGRAM)]
        p = flow(*argv)
        assert p.returncode == 0, p.stderr
        t0 = time.monotonic()
        [c.parent_id] = [j["id"] for j in orjson.loads(p.stdout)["jobs"]]

        def scf_held_by(managers: dict[str, int]) -> tuple[str, str] | None:
            for info in jobs_now(root):
                manager = (info.last.get("attempt") or {}).get("manager")
                if manager in managers and mid_scf(info, root):
                    return info.handle.key, str(manager)
            return None

        def managers_up(tokens: set[str]) -> dict[str, int] | None:
            """manager id -> pid of the managers of these allocations, once all are up."""
            ids = c.managers_of(tokens)
            return {m: pid_of(root, m) for m in ids} if len(ids) == len(tokens) else None

        # 1. the first allocation's manager is killed (SIGKILL) while its pw.x runs
        a1 = c.sbatch()
        pids = c.wait("the first allocation's manager", lambda: managers_up({a1}), 120)
        killed_job, killed = c.wait(
            "an SCF in the first allocation", lambda: scf_held_by(pids), 120, 0.05
        )
        os.kill(pids[killed], signal.SIGKILL)
        c.events.append(f"kill -9 during the SCF of {killed_job.split('--')[0]}")

        # 2. two more: one takes that SCF over; the next SCF's manager is frozen until
        # its allocation's drain signal comes, and `flow scale` starts
        a2, a3 = c.sbatch(), c.sbatch()
        c.wait(
            "the killed manager's SCF taken over",
            lambda: (killed_job, killed) in takeovers(root),
            120,
        )
        pids = c.wait("the managers of the next two", lambda: managers_up({a2, a3}), 120)
        frozen_job, frozen = c.wait(
            "an SCF in a later allocation", lambda: scf_held_by(pids), 120, 0.05
        )
        frozen_pid = pids[frozen]
        os.kill(frozen_pid, signal.SIGSTOP)
        t_freeze = time.monotonic()
        frozen_token = str(heartbeats(root)[frozen]["allocation"])
        started = slurm_time(field_cluster.job(c.allocations()[frozen_token])["StartTime"])
        before = len([m for _, m, _ in commits(root) if m != frozen])
        c.scaling = True
        pid = frozen_pid
        c.wait(
            "the frozen manager thawed by its drain signal",
            lambda: process_state(pid) != "T" or time.time() > started + SIGNAL_BY + 5,
            SIGNAL_BY + 30,
            0.2,
        )
        thawed_by_slurm = process_state(pid) != "T"
        signalled = thawed_by_slurm or term_pending(pid)
        if not thawed_by_slurm:
            os.kill(pid, signal.SIGCONT)
        frozen_pid = None
        frozen_for = time.monotonic() - t_freeze
        taken_while_frozen = [k for k in takeovers(root) if k[1] == frozen]
        others = len([m for _, m, _ in commits(root) if m != frozen]) - before
        c.events.append(
            f"SIGSTOP for {frozen_for:.0f} s during the SCF of {frozen_job.split('--')[0]}, "
            f"SIGCONT by {'Slurm with its drain signal' if thawed_by_slurm else 'the test'}, "
            f"{others} commits by others meanwhile"
        )
        assert signalled, f"no drain signal within {SIGNAL_BY:.0f} s of the start"
        assert taken_while_frozen == [], dump(root)  # its process lived: no evidence
        assert others > 0, dump(root)  # the campaign went on without it

        # 3. `flow scale` keeps one allocation coming until the parent has aggregated
        c.wait("the campaign finished", c.done, DEADLINE - (time.monotonic() - t0))
        campaign = time.monotonic() - t0

        # the queue is empty: the next passes end scale's allocations; the rest are drained
        c.wait("scale's allocations ended", lambda: not set(c.live()) & set(c.scaled()), 90)
        c.scaling = False
        for token, job_id in c.live().items():
            if token in c.sbatched:
                field_cluster.signal_drain(job_id)
        c.wait("every allocation ended", lambda: not c.live(), 90)
        c.scale()  # one more pass: the records of scale's allocations see them ended
        refs = [r.result(timeout=600) for r in reference]
    finally:
        if frozen_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(frozen_pid, signal.SIGCONT)
        c.cancel()
        pool.shutdown(wait=True, cancel_futures=True)

    # -- the results: every child, the CSV, the energies against the direct runs -----------
    parent = c.parent()
    assert parent.state is State.SUCCEEDED, dump(root)
    children = children_of(root, parent)
    assert len(children) == N, dump(root)
    assert [ch.state for ch in children] == [State.SUCCEEDED] * N, dump(root)
    by_alat = {r.alat: r for r in refs}
    rows = (parent.job_dir(root) / "eos.csv").read_text().splitlines()
    assert rows[0] == "alat,energy_ry", rows
    assert [r.split(",")[0] for r in rows[1:]] == alats, rows
    for row in rows[1:]:
        alat, energy = row.split(",")
        assert energy == energy_of(by_alat[alat].line), (row, by_alat[alat])
    for child in children:
        d = child.job_dir(root)
        alat = child.handle.key.split("--")[0].removeprefix("a").replace("p", ".")
        assert (d / "run" / "scf.in").read_text() == scf_input(alat), alat
        assert (d / "energy.line").read_text() == by_alat[alat].line + "\n", alat
    report = fsck_report(root)
    assert report["clean"], report

    # -- what the allocations went through ----------------------------------------------
    taken = takeovers(root)
    assert taken.get((killed_job, killed), ("", ""))[1] == "process_gone", taken
    assert [k for k in taken if k[1] == frozen] == [], taken
    # the frozen SCF was committed by its own manager once thawed, in its drain (done:
    # the SCF ended while it was frozen; interrupted: the drain stopped it)
    ends = {why for key, m, why in commits(root) if key == frozen_job and m == frozen}
    assert ends & {"succeed", "interrupted"}, dump(root, [frozen_job])
    assert "draining (signal SIGTERM)" in c.log(frozen_token), c.log(frozen_token)
    beats = heartbeats(root)
    used = {str(hb.get("allocation")) for hb in beats.values()} - {""}
    every = c.allocations()
    assert used <= set(every) and len(used) >= 3, (used, every)
    records = c.records()
    assert records and all(r.phase.ended for r in records), records
    for token in every:
        row = field_cluster.job(every[token])
        assert row["JobState"] != "TIMEOUT", (token, row, c.log(token))
        if token in used and token != a1:
            assert (row["JobState"], row["ExitCode"]) == ("COMPLETED", "0:0"), (row, c.log(token))
    # drained by Slurm's walltime signal while the campaign ran: the frozen one (it held an
    # SCF nobody else could take), and those seen ended before the parent finished
    mid = (c.ended_mid - {a1}) | {frozen_token}
    walltime = [t for t in mid if "draining (signal SIGTERM)" in c.log(t)]
    lifetimes = [
        slurm_time(r["EndTime"]) - slurm_time(r["StartTime"])
        for r in (field_cluster.job(every[t]) for t in used)
    ]
    interrupted = [
        (i.handle.key, f.get("attempt", {}).get("id"))
        for i in all_jobs(root)
        for f in i.frames
        if f.get("why") == "interrupted" and f.get("to") == State.READY.value
    ]

    mean = statistics.mean(r.seconds for r in refs)
    with capsys.disabled():
        print(
            f"\nfield: {N} pw.x SCFs ({mean:.1f} s each, direct) equal to the direct runs; "
            f"campaign {campaign:.0f} s through {len(used)} one-minute allocations "
            f"({len(every)} submitted, {c.passes} scale passes; longest {max(lifetimes):.0f} s), "
            f"{len(walltime)} drained at their walltime mid-campaign; {len(taken)} takeover(s); "
            f"{len(interrupted)} interrupted attempt(s); {'; '.join(c.events)}; "
            f"test {time.monotonic() - t_test:.0f} s"
        )
