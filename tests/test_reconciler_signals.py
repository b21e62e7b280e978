"""`flow scale` as a script stops it: SIGTERM (or SIGHUP) ends a looping reconciler after
its pass, releases its lease (a next `flow scale` is not refused) and exits 128 + the
signal. The lease records the holder's loop interval, and every reader judges the holder
by it (3 × interval + 30 s), not by its own --interval; a lease without one (an older
release's) is judged as before, by the reader's own."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from manager.support import FLOW, flow, make_workspace, submit, write_script

from httk_flow.protocol import layout
from httk_flow.protocol.workspace import Workspace
from httk_flow.scale import stopping
from httk_flow.scale.allocations import AllocationStore, AllocPhase, Reconciler, ScaleSettings
from httk_flow.scale.backends.base import (
    AllocationRequest,
    Observation,
    Outcome,
    Phase,
    SubmitResult,
)

HINT = "stop it (on SIGTERM it ends its pass and releases the lease) or wait"


@pytest.fixture
def root(tmp_path: Path) -> str:
    return make_workspace(tmp_path / "ws")


def lease_file(root: str) -> Path:
    return Path(layout.reconciler_lease(root))


def when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def renewed_ago(stderr: str, low: int, high: int) -> int:
    """The age the refusal gives the lease (whole seconds, as it was read), in bounds."""
    m = re.search(r"last renewed (\d+)s ago", stderr)
    assert m is not None, stderr
    assert low <= int(m.group(1)) <= high, stderr
    return int(m.group(1))


@pytest.fixture
def holders() -> Iterator[list[subprocess.Popen[str]]]:
    """Looping `flow scale` processes a test starts; killed if a test leaves one."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def start_holder(
    root: str, holders: list[subprocess.Popen[str]], interval: str
) -> subprocess.Popen[str]:
    """A looping `flow scale` (local backend, nothing queued), once it holds the lease."""
    p = subprocess.Popen(
        [*FLOW, "-w", root, "scale", "--backend", "local", "--interval", interval],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    holders.append(p)
    assert p.stdout is not None
    # its first pass is done once it says so, and it holds the lease from before it
    assert p.stdout.readline() == "desired 0, active 0\n"
    assert lease_file(root).exists()
    return p


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_signal_ends_a_looping_flow_scale_at_once_and_releases_its_lease(
    root: str, holders: list[subprocess.Popen[str]], sig: signal.Signals, code: int
) -> None:
    p = start_holder(root, holders, "10m")
    t0 = time.monotonic()
    p.send_signal(sig)
    assert p.wait(10) == code
    assert time.monotonic() - t0 < 5  # not at the end of its 10-minute wait
    assert p.stderr is not None and p.stderr.read() == (
        f"flow scale: stopped by {sig.name}; the reconciler lease is released\n"
    )
    assert not lease_file(root).exists()
    again = flow("-w", root, "scale", "--backend", "local", "--once")
    assert (again.returncode, again.stdout, again.stderr) == (0, "desired 0, active 0\n", "")


def test_a_live_holder_is_judged_by_its_own_interval_not_the_readers(
    root: str, holders: list[subprocess.Popen[str]]
) -> None:
    p = start_holder(root, holders, "60s")
    record = orjson.loads(lease_file(root).read_bytes())
    assert record["interval"] == 60.0 and record["pid"] == p.pid
    renewed = lease_file(root).stat().st_mtime
    refused = flow("-w", root, "scale", "--backend", "local", "--once", "--interval", "1s")
    ago = renewed_ago(refused.stderr, 1, 10)
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == (
        "flow: error: flow scale: another `flow scale` is reconciling this workspace: "
        f"pid {p.pid} on {socket.gethostname()}, looping every 1m since "
        f"{when(record['since'])}, last renewed {ago}s ago; stale if not renewed by "
        f"{when(renewed + 210)} (3 × its interval + 30s); {HINT}\n"
    )
    # 40 s without renewal: stale by a 1 s reader's own rule (30 s), not by the holder's
    # (3 × 60 s + 30 s): still refused
    past = time.time() - 40
    os.utime(lease_file(root), (past, past))
    refused = flow("-w", root, "scale", "--backend", "local", "--once", "--interval", "1s")
    assert refused.returncode == 2 and "looping every 1m" in refused.stderr, refused.stderr
    assert orjson.loads(lease_file(root).read_bytes())["pid"] == p.pid
    # past 3 × 60 s + 30 s without renewal it is stale, whatever the reader's interval
    past = time.time() - 211
    os.utime(lease_file(root), (past, past))
    taken = flow("-w", root, "scale", "--backend", "local", "--once", "--interval", "1h")
    assert (taken.returncode, taken.stdout, taken.stderr) == (0, "desired 0, active 0\n", "")
    assert not lease_file(root).exists()  # the one-pass taker released it in turn
    p.send_signal(signal.SIGTERM)
    assert p.wait(10) == 143


def test_a_lease_of_an_older_release_is_judged_by_the_readers_interval(root: str) -> None:
    lease = lease_file(root)
    lease.parent.mkdir(parents=True, exist_ok=True)
    lease.write_bytes(orjson.dumps({"owner": "rold", "pid": 4242, "t": time.time()}))
    past = time.time() - 20
    os.utime(lease, (past, past))
    # 20 s old, younger than max(30 s, 3 × 1 s): held
    refused = flow("-w", root, "scale", "--backend", "local", "--once", "--interval", "1s")
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == (
        "flow: error: flow scale: another `flow scale` is reconciling this workspace: "
        f"pid 4242, last renewed {renewed_ago(refused.stderr, 20, 25)}s ago; stale if not "
        f"renewed by {when(past + 30)} "
        f"(it records no interval: 3 × this command's --interval, at least 30s); {HINT}\n"
    )
    # a reader looping every 10 s allows it 30 s too; one every 20 s, 60 s
    assert flow("-w", root, "scale", "--once", "--interval", "20s").returncode == 2
    past = time.time() - 31
    os.utime(lease, (past, past))
    assert flow("-w", root, "scale", "--once", "--interval", "20s").returncode == 2
    taken = flow("-w", root, "scale", "--backend", "local", "--once", "--interval", "1s")
    assert (taken.returncode, taken.stdout, taken.stderr) == (0, "desired 0, active 0\n", "")
    assert not lease.exists()


class SignalledBackend:
    """A backend whose submission is interrupted by stop signals sent from inside it (as a
    script's `kill`s land while sbatch runs), and that knows its submissions by token."""

    name = "signalled"
    signal_margin = 0.0

    def __init__(self, signals: int) -> None:
        self.signals = signals
        self.submitted: list[str] = []

    def submit(self, request: AllocationRequest) -> SubmitResult:
        self.submitted.append(request.token)
        for _ in range(self.signals):
            os.kill(os.getpid(), signal.SIGTERM)
        return SubmitResult(Outcome.CREATED, handle=f"h-{request.token}")

    def observe(self, handles: list[str]) -> dict[str, Observation]:
        return {h: Observation(Phase.PENDING) for h in handles}

    def find_by_token(self, workspace: str, token: str) -> str | None:
        return f"h-{token}" if token in self.submitted else None

    def cancel(self, handle: str) -> None:
        pass

    def diagnostics(self) -> dict[str, str]:
        return {}

    def allocation_end(self) -> float | None:
        return None


def run_until_stopped(root: str, backend: SignalledBackend) -> tuple[Reconciler, list[str]]:
    """`flow scale`'s loop in this process (every 5 s) until a signal stops it: after its
    first pass, not after a wait (the loop would give up after 30 s, should it not stop)."""
    ws = Workspace.open(root)
    try:
        rec = Reconciler(ws, backend, ScaleSettings(max=1, jobs_per_manager=100))
        before = signal.getsignal(signal.SIGTERM)
        t0 = time.monotonic()
        rec.run(interval=5, once=False, should_stop=lambda: time.monotonic() - t0 > 30)
        assert time.monotonic() - t0 < 4
        assert signal.getsignal(signal.SIGTERM) is before  # its handler is gone again
        return rec, [r.phase.value for r in AllocationStore(ws).load_all()]
    finally:
        ws.close()


def test_one_signal_lets_the_pass_finish_and_a_second_ends_it_where_it_is(
    root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    submit(root, write_script(tmp_path / "scripts", "ok.sh", "exit 0\n"))
    # one TERM in the middle of a submission: the pass records the answer, then it stops
    first = SignalledBackend(signals=1)
    rec, phases = run_until_stopped(root, first)
    assert rec.stopped_by == signal.SIGTERM and phases == ["pending"]
    assert not lease_file(root).exists()

    # a second TERM (past the repeat window, made 0 here) ends the pass inside the
    # submission: the record stays `requested`, and the next pass adopts it by token
    ws = Workspace.open(root)
    try:
        AllocationStore(ws).save(
            replace(AllocationStore(ws).load_all()[0], phase=AllocPhase.CANCELLED)
        )
    finally:
        ws.close()
    monkeypatch.setattr(stopping, "REPEAT_WINDOW", 0.0)
    second = SignalledBackend(signals=2)
    rec, phases = run_until_stopped(root, second)
    assert rec.stopped_by == signal.SIGTERM and phases == ["cancelled", "requested"]
    assert not lease_file(root).exists()
    ws = Workspace.open(root)
    try:
        report = Reconciler(ws, second, ScaleSettings(max=1, jobs_per_manager=100)).tick()
    finally:
        ws.close()
    assert report.adopted == second.submitted and report.submitted == []
