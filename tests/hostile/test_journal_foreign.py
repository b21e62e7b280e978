"""Someone appends to a live manager's journal segment (a stray `echo >> 3.jsonl`, a torn
line without its newline) while it runs 40 jobs: no later frame is shifted, no ref names
a foreign line, every job's `flow show` and `flow history` read back, and `flow fsck`
reports the foreign lines as lines that do not parse, but no damaged job."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from manager.support import Managers, flow, log_of, submit, write_script

from httk_flow.cli.main import cli
from httk_flow.protocol.states import State

from .support import handles

JOBS = 40
#: what a stray writer leaves, in turn: a whole line, and a line torn before its newline
STRAY = (b"a stray line from someone's echo %d\n", b"torn %d, no newline: ")


def _writer_segments(root: str, known: set[str]) -> list[Path]:
    """The newest segment of every journal writer not in `known` (the manager's)."""
    out = []
    for d in (Path(root) / ".flow" / "journal").iterdir():
        if d.name in known:
            continue
        segs = sorted(d.glob("*.jsonl"), key=lambda p: int(p.stem))
        if segs:
            out.append(segs[-1])
    return out


def _succeeded(root: str) -> int:
    return sum(h.state is State.SUCCEEDED for h in handles(root))


def test_stray_lines_in_a_live_segment_damage_no_job(
    root: str, scripts: Path, managers: Managers, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every job waits for the gate, then naps 0.1 s (the scene: jobs that take a while); the
    # gate opens once 20 stray appends have landed, so that many land however fast it runs
    gate = scripts / "gate"
    nap = 'until [ -e "$FLOW_PARAM_gate" ]; do sleep 0.02; done\nsleep 0.1\n'
    prog = write_script(scripts, "nap.sh", nap)
    ids = submit(root, prog, count=JOBS, params={"gate": str(gate)})
    before = {d.name for d in (Path(root) / ".flow" / "journal").iterdir()}
    p = managers.start(root, command="serve", workers=4)

    polluted: dict[Path, int] = {}
    n = 0
    deadline = time.monotonic() + 60
    while _succeeded(root) < JOBS:
        assert p.poll() is None, f"the manager died:\n{log_of(p)}"
        assert time.monotonic() < deadline, f"jobs still not done:\n{log_of(p)}"
        for seg in _writer_segments(root, before):
            with open(seg, "ab") as fh:
                fh.write(STRAY[n % 2] % n)
            polluted[seg] = polluted.get(seg, 0) + 1
            n += 1
        if n >= 20:
            gate.touch()
        time.sleep(0.02)  # the stray writer's pace (the scene)
    assert n >= 20, f"only {n} stray appends landed while the jobs ran"
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 0, log_of(p)
    assert "Traceback" not in log_of(p), log_of(p)

    monkeypatch.setenv("NO_COLOR", "1")
    runner = CliRunner()
    for jid in ids:
        show = runner.invoke(cli, ["-w", root, "show", jid, "--json"])
        assert show.exit_code == 0, show.output
        assert orjson.loads(show.stdout)["state"] == "succeeded"
        history = runner.invoke(cli, ["-w", root, "history", jid, "--json"])
        assert history.exit_code == 0, history.output
        chain = [(t.get("from"), t["to"]) for t in orjson.loads(history.stdout)["transitions"]]
        assert chain[0] == (None, "submitted") and chain[-1][1] == "succeeded", chain
        assert runner.invoke(cli, ["-w", root, "history", jid]).exit_code == 0
    status = orjson.loads(runner.invoke(cli, ["-w", root, "status", "--json"]).stdout)
    assert status["counts"]["succeeded"] == JOBS

    check = flow("fsck", "-w", root, "--json")
    assert check.returncode == 1, check.stdout + check.stderr
    problems = orjson.loads(check.stdout)["problems"]
    assert problems, "the stray lines were not reported"
    assert {q["kind"] for q in problems} == {"unreadable_frame"}, problems
    assert {q["object"] for q in problems} <= {str(s) for s in polluted}, problems
    assert not [q for q in problems if q["object"].startswith("job ")], problems
