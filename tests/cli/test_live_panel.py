"""What `flow run` shows: into a pipe, exactly the transition lines it always printed;
on a terminal (a tmux pane of a fixed size), one live panel (counts, pace, running jobs)
with the failures above it, transition lines again with -v or TERM=dumb, only the
summary with -q; and `flow status --watch` redrawn in place on a terminal."""

from __future__ import annotations

import io
import itertools
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
from helpers import manager_in_this_process, wait_for
from manager.support import FLOW, Managers, submit, write_script
from rich.console import Console

from httk_flow.cli import live
from httk_flow.manager.config import ManagerConfig
from httk_flow.manager.log import REPORT_EVERY, Progress, ProgressFeed, RunningJob
from httk_flow.manager.loop import Manager
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace

REPO = Path(__file__).resolve().parents[2]

OK = "sleep 0.3\n"
FAIL = """sleep 0.3
publish '{"action":"fail","code":"broken","message":"no"}'
"""
KEY = r"(?:[a-z0-9_.-]+--)?[0-9a-f]{32}"
#: `HH:MM:SS <manager> <key> <from> -> <to>[ (<why>)]`: one transition line
TRANSITION = re.compile(rf"^\d\d:\d\d:\d\d m\w+ {KEY} \w+ -> \w+(?: \(.*\))?$")
SUMMARY = re.compile(r"^\d\d:\d\d:\d\d (m\w+) manager \1 stopped: (\d+) succeeded, (\d+) failed$")
#: a colour in what tmux captures with -e (bold and dim are not colours)
COLOUR = re.compile(r"\x1b\[(?:3[0-7]|9[0-7]|38;5;\d+|38;2;[\d;]+)m")


def env(**extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    return {**e, "PYTHONPATH": str(REPO), **extra}


def jobs(root: str, scripts: Path, ok: int, bad: int = 0) -> None:
    program = write_script(scripts, "ok.sh", OK)
    for i in range(ok):
        submit(root, program, tag=f"ok{i}")
    for i in range(bad):
        submit(root, write_script(scripts, "bad.sh", FAIL), tag=f"bad{i}")


# -- what the manager feeds a reporter ----------------------------------------------------


class Recorder:
    """A reporter that keeps what it is given."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.reports: list[Progress] = []

    def line(self, text: str) -> None:
        self.lines.append(text)

    def progress(self, progress: Progress) -> None:
        self.reports.append(progress)


def test_a_manager_feeds_its_reporter_the_failures_its_news_and_a_last_report(
    ws: str, scripts: Path
) -> None:
    jobs(ws, scripts, ok=3, bad=1)
    workspace = Workspace.open(ws)
    rec = Recorder()
    try:
        m = Manager(workspace, ManagerConfig(workers=2, exit_when_idle=0), reporter=rec)
        with manager_in_this_process():
            assert m.run(install_signals=False) == 1
    finally:
        workspace.close()
    serving, failed, summary = rec.lines
    assert serving.endswith(f" {m.id} manager {m.id} serving {workspace.root} with 2 worker(s)")
    assert TRANSITION.match(failed) and failed.endswith(" committing -> failed (fail: broken)")
    assert SUMMARY.match(summary) and summary.endswith(" 3 succeeded, 1 failed")
    *during, last = rec.reports
    assert last.final and not any(r.final for r in during)
    assert (last.succeeded, last.failed, last.attempts, last.running) == (3, 1, 4, ())
    assert {s: n for s, n in last.counts.items() if n} == {State.SUCCEEDED: 3, State.FAILED: 1}
    # between two counts, the manager's own moves keep the counts whole
    assert all(sum(r.counts.values()) == 4 for r in rec.reports)
    rows = [row for r in during for row in r.running]
    assert rows and all(row.manager == m.id and row.key.startswith(("ok", "bad")) for row in rows)
    gaps = [b.elapsed - a.elapsed for a, b in itertools.pairwise(during)]
    assert all(g >= REPORT_EVERY * 0.99 for g in gaps), gaps


def test_a_report_names_the_jobs_other_managers_run(
    ws: str, scripts: Path, managers: Managers
) -> None:
    submit(ws, write_script(scripts, "long.sh", "sleep 30\n"), tag="long")
    other = managers.start(ws, command="serve", workers=1)
    workspace = Workspace.open(ws)
    rec = Recorder()
    feed = ProgressFeed(workspace, "mhere", 1, rec)

    def running() -> bool:
        feed.send(succeeded=0, failed=0, attempts=0, running=[], draining=False, final=True)
        return bool(rec.reports[-1].running)

    try:
        wait_for(running, 30, interval=0.2)
    finally:
        workspace.close()
    [row] = rec.reports[-1].running
    ids = {m["id"] for m in orjson.loads(flow_json(ws, "managers"))["managers"]}
    assert row.key.startswith("long--") and row.manager in ids and row.manager != "mhere"
    assert 0 <= row.elapsed < 30
    assert rec.reports[-1].counts[State.RUNNING] == 1
    assert other.poll() is None


def flow_json(ws: str, *args: str) -> str:
    return subprocess.run(
        [*FLOW, *args, "-w", ws, "--json"], capture_output=True, text=True, env=env(), timeout=60
    ).stdout


def test_the_panel_shows_counts_pace_and_the_running_jobs_of_every_manager() -> None:
    counts = dict.fromkeys(State, 0) | {State.READY: 20, State.RUNNING: 4, State.SUCCEEDED: 10}
    rows = (
        RunningJob("relax-Si--" + "a" * 32, 3.25, "mhere"),
        RunningJob("b" * 32, 75.0, "mthere"),
    )
    report = Progress("mhere", "/w/campaign", 2, 12.5, counts, 9, 0, 11, rows, False)
    out = Console(width=80, no_color=True, record=True, file=io.StringIO())
    out.print(live.view(report, "run", 0.8, 30.0, 80))
    # with colour off the bar's remainder is blank
    assert out.export_text() == (
        "╭──────────────────── flow run: manager mhere, 2 worker(s) ────────────────────╮\n"
        "│ 20 ready   4 running   10 succeeded                                          │\n"
        "│ ━━━━━━━━━━━━━━━━━━━                                               10/34 done │\n"
        "│ 0.8 jobs/s  ETA 30s  elapsed 12s  here: 9 succeeded, 0 failed, 11 attempts   │\n"
        "│                                                                              │\n"
        "│ RUNNING                                                     ELAPSED  MANAGER │\n"
        "│ relax-Si--aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa                     3.2s  mhere   │\n"
        "│ bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb                              1m15s  mthere  │\n"
        "│ ... and 2 more running                                                       │\n"
        "╰──────────────────────────────── /w/campaign ─────────────────────────────────╯\n"
    )


# -- into a pipe ------------------------------------------------------------------------


def normalised(text: str, tags: dict[str, str]) -> list[str]:
    """The lines with their clock replaced by T, the manager by M, each job by its tag."""
    out = []
    for line in text.splitlines():
        m = re.match(r"\d\d:\d\d:\d\d (m\w+) ", line)
        if m is not None:
            line = "T M " + line[m.end() :].replace(m.group(1), "M")
        out.append(re.sub(KEY, lambda k: tags[k.group(0)], line))
    return out


def test_into_a_pipe_a_run_prints_its_transition_lines_as_it_always_did(
    ws: str, scripts: Path
) -> None:
    ok = write_script(scripts, "ok.sh", "exit 0\n")
    bad = write_script(scripts, "bad.sh", FAIL.replace("sleep 0.3\n", ""))
    # one worker and distinct priorities: the claims come in one order (none launched
    # ahead, which would claim the next job while one runs)
    submit(ws, ok, tag="a", priority=900)
    submit(ws, ok, tag="b", priority=800)
    submit(ws, bad, tag="c", priority=700)
    submit(ws, ok, tag="d", priority=600)
    r = subprocess.run(
        [*FLOW, "run", "-w", ws, "--workers", "1", "--no-launch-ahead"],
        capture_output=True,
        text=True,
        env=env(TERM="xterm-256color"),
        timeout=120,
    )
    assert (r.returncode, r.stdout) == (1, ""), r.stderr
    tags = {k: k.split("--")[0] for k in re.findall(KEY, r.stderr)}
    lines = normalised(r.stderr, tags)
    # registration follows the directory scan: its order is not part of the output
    assert sorted(lines[1:5]) == [f"T M {t} submitted -> ready" for t in "abcd"]
    assert lines[:1] + lines[5:] == [
        f"T M manager M serving {ws} with 1 worker(s)",
        *[
            f"T M {t} {move}"
            for t, moves in [
                ("a", ["ready -> claimed", "claimed -> running (a0001)"]),
                ("a", ["running -> succeeded (exit_0)"]),
                ("b", ["ready -> claimed", "claimed -> running (a0001)"]),
                ("b", ["running -> succeeded (exit_0)"]),
                ("c", ["ready -> claimed", "claimed -> running (a0001)"]),
                ("c", ["running -> committing (fail)", "committing -> failed (fail: broken)"]),
                ("d", ["ready -> claimed", "claimed -> running (a0001)"]),
                ("d", ["running -> succeeded (exit_0)"]),
            ]
            for move in moves
        ],
        "T M manager M stopped: 3 succeeded, 1 failed",
    ]
    assert "\x1b" not in r.stderr


def test_quiet_into_a_pipe_prints_the_summary_alone(ws: str, scripts: Path) -> None:
    jobs(ws, scripts, ok=2)
    r = subprocess.run(
        [*FLOW, "run", "-w", ws, "-q"], capture_output=True, text=True, env=env(), timeout=120
    )
    assert (r.returncode, r.stdout) == (0, "")
    [line] = r.stderr.splitlines()
    assert SUMMARY.match(line) and line.endswith(" 2 succeeded, 0 failed"), line


def test_verbose_and_quiet_exclude_each_other(ws: str) -> None:
    r = subprocess.run(
        [*FLOW, "run", "-w", ws, "-v", "-q"], capture_output=True, text=True, env=env(), timeout=60
    )
    assert (r.returncode, r.stdout, r.stderr) == (
        2,
        "",
        "flow: error: -v/--verbose and -q/--quiet: cannot be given together\n",
    )


# -- on a terminal ----------------------------------------------------------------------

_servers = itertools.count()


def need_tmux() -> str:
    """tmux's path; fails when it is missing on CI (CI=true: .ci/run installs it), skips
    elsewhere."""
    exe = shutil.which("tmux")
    if exe is None:
        why = "the terminal tests run flow in a tmux pane: install tmux (Debian package tmux)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(why)
        pytest.skip(why)
    return exe


class Pane:
    """One command in the one pane of a tmux server of its own, 120 columns by 40 lines;
    after the command, the pane says `[exit N]` and stays."""

    def __init__(self, tmux: str, tmp: Path) -> None:
        self.tmux = tmux
        self.socket = f"flow-test-{os.getpid()}-{next(_servers)}"
        self.conf = tmp / "tmux.conf"
        self.conf.write_text("set -g history-limit 50000\nset -g status off\n")
        self.started = False

    def _run(self, *args: str) -> str:
        r = subprocess.run(
            [self.tmux, "-u", "-L", self.socket, "-f", str(self.conf), *args],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode == 0, r.stderr
        return r.stdout

    def start(self, argv: list[str], **extra: str) -> None:
        """Run `argv` in the pane with this test's environment and `extra`, TERM the pane's
        own (tmux's) unless `extra` says, and neither NO_COLOR nor a size unless it says."""
        unset = [f"-u{k}" for k in ("NO_COLOR", "FORCE_COLOR", "COLUMNS", "LINES")]
        setting = [f"{k}={v}" for k, v in {"PYTHONPATH": str(REPO), **extra}.items()]
        command = (
            shlex.join(["env", *unset, *setting, *argv]) + '; echo "[exit $?]"; exec sleep 600'
        )
        self._run("new-session", "-d", "-x", "120", "-y", "40", "-s", "t", command)
        self.started = True

    def screen(self, *, history: bool = False, escapes: bool = False) -> str:
        args = ["capture-pane", "-p", "-J", "-t", "t"]
        args += ["-S", "-"] * history + ["-e"] * escapes
        return "\n".join(line.rstrip() for line in self._run(*args).splitlines())

    def wait(self, what: Callable[[str], bool], timeout: float = 60.0) -> str:
        """The first screen `what` accepts (captured every 0.1 s)."""
        seen = [""]

        def look() -> str | None:
            seen[0] = self.screen()
            return seen[0] if what(seen[0]) else None

        try:
            return str(wait_for(look, timeout, interval=0.1))
        except AssertionError:
            raise AssertionError(f"the pane never showed what was awaited:\n{seen[0]}") from None

    def exit_status(self, timeout: float = 120.0) -> int:
        text = self.wait(lambda s: "[exit " in s, timeout)
        return int(re.findall(r"\[exit (\d+)\]", text)[-1])

    def keys(self, *keys: str) -> None:
        self._run("send-keys", "-t", "t", *keys)

    def close(self) -> None:
        if self.started:
            subprocess.run(
                [self.tmux, "-L", self.socket, "kill-server"], capture_output=True, timeout=30
            )


@pytest.fixture
def pane(tmp_path: Path) -> Iterator[Pane]:
    p = Pane(need_tmux(), tmp_path)
    yield p
    p.close()


def lines_of(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


#: one running job's row in the panel: its key, how long it has run, its manager
ROW = re.compile(rf"│ {KEY} +\d+\.\ds +m\w+ +│")


def test_on_a_terminal_a_run_shows_one_live_panel_with_the_failures_above_it(
    ws: str, scripts: Path, pane: Pane
) -> None:
    jobs(ws, scripts, ok=29, bad=1)
    pane.start([*FLOW, "run", "-w", ws, "--workers", "2"])

    def running(s: str) -> bool:
        # jobs launched ahead wait claimed beside the two that run
        counts = re.search(r"│ \d+ ready   (\d+ claimed   )?2 running   \d+ succeeded", s)
        return "RUNNING" in s and bool(ROW.search(s)) and counts is not None

    live = pane.wait(running)
    assert re.search(r"\d+\.\d jobs/s +ETA ", live), live
    assert re.search(r"━+.* (\d+)/30 done", live), live
    assert "flow run: manager m" in live and ws in live
    assert COLOUR.search(pane.screen(escapes=True))  # colours, unless NO_COLOR says not
    assert pane.exit_status() == 1
    whole = lines_of(pane.screen(history=True))
    # the whole scrollback: the serving line, the failure, one panel, the summary
    moves = [line for line in whole if " -> " in line]
    assert len(moves) == 1 and TRANSITION.match(moves[0]), whole
    assert re.search(r" bad0--[0-9a-f]{32} committing -> failed \(fail: broken\)$", moves[0])
    tops = [i for i, line in enumerate(whole) if line.startswith("╭")]
    bottoms = [i for i, line in enumerate(whole) if line.startswith("╰")]
    assert len(tops) == len(bottoms) == 1, whole
    panel = "\n".join(whole[tops[0] : bottoms[0] + 1])
    assert whole.index(moves[0]) < tops[0]
    assert "(stopped)" in panel and "29 succeeded   1 failed" in panel and "30/30 done" in panel
    assert "here: 29 succeeded, 1 failed, 30 attempts" in panel
    assert "serving" in whole[0]
    after = whole[bottoms[0] + 1 :]
    assert len(after) == 2 and SUMMARY.match(after[0]), whole
    assert after[0].endswith(" 29 succeeded, 1 failed") and after[1] == "[exit 1]"
    assert len(whole) < 30  # not five lines a job


def test_a_drain_and_a_problem_are_printed_above_the_panel_of_flow_serve(
    ws: str, scripts: Path, pane: Pane
) -> None:
    program = write_script(scripts, "long.sh", "sleep 60\n")
    for _ in range(2):
        submit(ws, program)
    (Path(ws) / ".flow" / "state" / "submitted" / "notes.txt").write_text("not a marker\n")
    pane.start([*FLOW, "serve", "-w", ws, "--workers", "2"])
    pane.wait(lambda s: len(ROW.findall(s)) == 2 and "problem: " in s)
    pane.keys("C-c")
    assert pane.exit_status() == 0
    whole = lines_of(pane.screen(history=True))
    [top] = [i for i, line in enumerate(whole) if line.startswith("╭")]
    [bottom] = [i for i, line in enumerate(whole) if line.startswith("╰")]
    above, panel, below = whole[:top], "\n".join(whole[top : bottom + 1]), whole[bottom + 1 :]
    assert "serving" in above[0]
    assert any(
        line.endswith("notes.txt: is not a marker of the grammar (or not a file)") for line in above
    ), above
    assert above[-1].endswith(" draining (signal SIGINT): no new claims; stopping 2 attempt(s)")
    assert "flow serve: manager m" in panel and "(stopped)" in panel and "2 ready" in panel
    assert len(below) == 2 and below[0].endswith(" stopped: 0 succeeded, 0 failed"), whole
    assert below[1] == "[exit 0]"


def test_no_color_keeps_the_panel_and_drops_its_colours(ws: str, scripts: Path, pane: Pane) -> None:
    jobs(ws, scripts, ok=6)
    pane.start([*FLOW, "run", "-w", ws, "--workers", "2"], NO_COLOR="1")
    pane.wait(lambda s: "RUNNING" in s and bool(ROW.search(s)))
    assert not COLOUR.search(pane.screen(escapes=True))
    assert pane.exit_status() == 0
    assert "6/6 done" in pane.screen()


@pytest.mark.parametrize(
    ("flag", "extra"), [("-v", {}), ("--verbose", {}), (None, {"TERM": "dumb"})]
)
def test_verbose_or_a_dumb_terminal_gives_the_transition_lines(
    ws: str, scripts: Path, pane: Pane, flag: str | None, extra: dict[str, str]
) -> None:
    jobs(ws, scripts, ok=5, bad=1)
    argv = [*FLOW, "run", "-w", ws, "--workers", "2", *([flag] if flag else [])]
    pane.start(argv, **extra)
    assert pane.exit_status() == 1
    whole = lines_of(pane.screen(history=True))
    assert "serving" in whole[0] and whole[-1] == "[exit 1]"
    assert SUMMARY.match(whole[-2]) and whole[-2].endswith(" 5 succeeded, 1 failed"), whole
    assert [line for line in whole[1:-2] if not TRANSITION.match(line)] == []
    # registered, claimed, running, then a success in one move, a failure in two
    assert len(whole[1:-2]) == 5 * 4 + 1 * 5
    assert not any("jobs/s" in line or "╭" in line for line in whole)


def test_quiet_on_a_terminal_shows_no_panel_and_no_transitions_but_the_summary(
    ws: str, scripts: Path, pane: Pane
) -> None:
    jobs(ws, scripts, ok=4, bad=1)
    pane.start([*FLOW, "run", "-w", ws, "--workers", "2", "-q"])
    assert pane.exit_status() == 1
    whole = lines_of(pane.screen(history=True))
    assert len(whole) == 2 and whole[1] == "[exit 1]", whole
    assert SUMMARY.match(whole[0]) and whole[0].endswith(" 4 succeeded, 1 failed")


def test_status_watch_on_a_terminal_redraws_one_view_in_place(
    ws: str, scripts: Path, pane: Pane
) -> None:
    program = write_script(scripts, "ok.sh", OK)
    for _ in range(3):
        submit(ws, program)
    pane.start([*FLOW, "status", "-w", ws, "--watch", "0.2"])
    first = pane.wait(lambda s: f"{ws}: 3 jobs, 0 live managers" in s)
    assert re.search(r"│ submitted +│ +3 │", first), first
    assert "0.0 jobs/s" in first
    for _ in range(2):
        submit(ws, program)
    later = pane.wait(lambda s: f"{ws}: 5 jobs" in s)
    assert re.search(r"│ submitted +│ +5 │", later), later
    assert "blocked: no live manager to register submissions" in later
    whole = pane.screen(history=True)
    # redrawn in place: one title in the whole scrollback, not one per look (as piped)
    assert whole.count(f"{ws}: ") == 1, whole
    pane.keys("C-c")
    assert pane.exit_status(timeout=30) == 0
    assert "Traceback" not in pane.screen(history=True)
