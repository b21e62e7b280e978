"""`flow status --watch`: the package yields snapshots at an interval (ops.status.watch),
the CLI renders each one; off a terminal, one plain block (or JSON line) per snapshot."""

from __future__ import annotations

import functools
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from httk_flow.cli import cmd_status
from httk_flow.cli.main import cli
from httk_flow.ops import status
from httk_flow.protocol.workspace import Workspace

REPO = Path(__file__).resolve().parents[2]


class FakeTime:
    """A monotonic clock that only moves when slept on (or told to), recording sleeps."""

    def __init__(self, scan: float = 0.0) -> None:
        self.now = 100.0
        self.scan = scan  # how long each look at the workspace takes
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(round(s, 6))
        self.now += s


def test_watch_yields_a_snapshot_at_once_then_one_per_interval_until_told(ws: str) -> None:
    t = FakeTime()
    snaps = list(
        status.watch(
            Workspace.find(ws),
            every=2.0,
            until=lambda s: s.elapsed >= 6.0,
            clock=t.clock,
            sleep=t.sleep,
        )
    )
    assert [s.elapsed for s in snaps] == [0.0, 2.0, 4.0, 6.0]
    assert t.sleeps == [2.0, 2.0, 2.0]
    assert all(s.report.total == 0 and s.rate == 0.0 and s.eta is None for s in snaps)


def test_a_look_slower_than_the_interval_is_followed_at_once_without_catching_up(
    ws: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = FakeTime()
    real = status.workspace_status
    slow = iter([5.0, 0.5, 0.5])

    def look(*a: object, **k: object) -> status.StatusReport:
        t.now += next(slow)
        return real(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(status, "workspace_status", look)
    gen = status.watch(Workspace.find(ws), every=2.0, clock=t.clock, sleep=t.sleep)
    snaps = [next(gen), next(gen), next(gen)]
    gen.close()
    # the first look took 5 s: no sleep before the second, then the interval again
    assert [s.elapsed for s in snaps] == [5.0, 5.5, 7.5]
    assert t.sleeps == [1.5]


def interrupted_after(n: int) -> Callable[..., object]:
    """ops.status.watch whose n-th sleep is a Ctrl-C."""
    calls = [0]

    def sleep(_s: float) -> None:
        calls[0] += 1
        if calls[0] >= n:
            raise KeyboardInterrupt

    return functools.partial(status.watch, sleep=sleep)


def test_off_a_terminal_each_snapshot_is_the_status_text_a_pace_line_and_a_blank(
    runner: CliRunner, ws: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner.invoke(cli, ["submit", "-w", ws, "/bin/true"])
    once = runner.invoke(cli, ["status", "-w", ws]).stdout
    monkeypatch.setattr(cmd_status, "watch", interrupted_after(3))
    r = runner.invoke(cli, ["status", "-w", ws, "--watch", "1"])
    assert r.exit_code == 0, r.output
    block = once + "throughput: 0.0 jobs/s\n\n"
    assert r.stdout == block * 3
    assert "\x1b[" not in r.stdout


def test_watch_with_json_prints_one_status_document_per_line(
    runner: CliRunner, ws: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    once = orjson.loads(runner.invoke(cli, ["status", "-w", ws, "--json"]).stdout)
    monkeypatch.setattr(cmd_status, "watch", interrupted_after(2))
    r = runner.invoke(cli, ["status", "-w", ws, "--watch", "1", "--json"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert len(lines) == 2
    for line in lines:
        doc = orjson.loads(line)
        assert doc.pop("jobs_per_second") == 0.0 and doc.pop("eta") is None
        assert isinstance(doc.pop("elapsed"), float)
        assert doc == once


def test_watch_into_a_pipe_prints_each_block_as_it_comes_and_stops_on_ctrl_c(ws: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    p = subprocess.Popen(
        [sys.executable, "-m", "httk_flow", "status", "-w", ws, "--watch", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert p.stdout is not None
    out = b""
    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + 60
    try:
        while out.count(b"throughput: ") < 2 and time.monotonic() < deadline:
            if sel.select(timeout=1.0):
                chunk = os.read(p.stdout.fileno(), 65536)
                if not chunk:
                    break
                out += chunk
        assert out.count(b"throughput: ") >= 2, out
        p.send_signal(signal.SIGINT)
        rest, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    assert err == b""
    assert (out + rest).startswith(f"workspace {Workspace.find(ws).root}: 0 jobs\n".encode())
