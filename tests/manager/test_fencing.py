"""Child births are fenced: a fan-out's children are registered once, whoever registers them.

Real scenes: a bash parent (bash API: flow_spawn, flow_wait, flow_children) fans out
thousands of children; the manager registering them is SIGKILLed or SIGSTOPped in the
middle, other managers take the commit over, and the stopped one wakes up again. At every
look each child has exactly one marker, every child runs once, the parent joins and
succeeds, and only a dead (or silent) holder of the commit is ever displaced. A live
registration holds its lease however long it takes.

On one host a manager lives exactly as long as its process; managers that must judge one
another by their heartbeats alone run as if on other hosts (their gethostname lies).
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from helpers import wait_for

from httk_flow.protocol.journal import RawFrame as Frame
from httk_flow.protocol.names import Marker
from httk_flow.protocol.states import State

from .support import (
    ManagerProcess,
    Managers,
    MarkerWatch,
    children_of,
    dump,
    fsck_report,
    job,
    leased_workspace,
    locate,
    log_of,
    manager_up,
    marker_keys,
    markers_at,
    submit,
    takeovers,
    whole_log,
    write_program,
)

#: the parent waits for a `go` file (so the test picks the managers that are up when it
#: registers), spawns $kids no-op children and joins them; collect checks every child
FANOUT = r"""#!/usr/bin/env bash
set -euo pipefail
source "$FLOW_BASH_API"

flow_steps main child collect

step_main() {
    local i n
    flow_param -v n kids
    while [[ ! -e $FLOW_WORKDIR/go ]]; do sleep 0.05; done
    for ((i = 1; i <= n; i++)); do
        flow_spawn --label "k$i" --step child
    done
    flow_wait collect --all-succeeded
}

step_child() { flow_succeed; }

step_collect() {
    local label id state path n=0 ok=0 want
    flow_param -v want kids
    while read -r label id state path; do
        n=$((n + 1))
        if [[ $state == succeeded ]]; then ok=$((ok + 1)); fi
    done < <(flow_children)
    if ((n != want || ok != want)); then
        flow_fail "saw $n children, $ok succeeded, expected $want" bad_count
        return
    fi
    flow_succeed "collected $n"
}

flow_main "$@"
"""

LEASE = 1.0
EVIDENCE = {"process_gone", "lease_expired", "stopped", "no_heartbeat"}
TERMINAL = {State.SUCCEEDED, State.FAILED, State.CANCELLED}


class Scene:
    """One fan-out parent, claimed by a first manager before any other manager starts."""

    def __init__(self, tmp_path: Path, managers: Managers, kids: int) -> None:
        self.managers = managers
        self.kids = kids
        self.root = leased_workspace(tmp_path / "ws", f"{LEASE:g}s")
        program = write_program(tmp_path / "scripts", "fanout.sh", FANOUT)
        [self.pid] = submit(self.root, program, params={"kids": kids}, tag="fan")
        handle = job(self.root, self.pid).handle
        self.placement, self.key = handle.placement, handle.key
        #: where the children's markers live
        self.kids_at = f"{self.placement}/{self.key}"
        self.dir = Path(self.root) / self.placement / self.key

    def serve(self, host: str | None = None) -> ManagerProcess:
        lease = f"{LEASE:g}s"
        return self.managers.start(self.root, "--lease", lease, command="serve", host=host)

    def state(self) -> tuple[State, Marker]:
        # a listing may miss a marker renamed from a kind not yet listed to one already listed
        for _ in range(5):
            found = locate(self.root, self.placement, self.key)
            if found is not None:
                break
        assert found is not None, f"the parent has no marker:\n{dump(self.root, [self.pid])}"
        return found[0], Marker.from_name(found[1])

    def registrar(self, host: str | None = None) -> tuple[ManagerProcess, str]:
        """The first manager, once it runs the parent's first attempt."""
        first = self.serve(host)
        first_id = manager_up(self.root, first)
        wait_for(lambda: self.state()[0] is State.RUNNING or first.poll() is not None, 30)
        assert first.poll() is None, log_of(first)
        return first, first_id

    def go(self) -> None:
        (self.dir / "run" / "go").touch()

    def wait_registration_started(self, timeout: float = 60.0) -> int:
        """Poll until some child has a marker; returns how many had one at that look."""
        seen = wait_for(lambda: len(markers_at(self.root, self.kids_at)), timeout, 0.002)
        assert isinstance(seen, int)
        return seen

    def wait_until(self, targets: set[State], timeout: float, procs: list[ManagerProcess]) -> State:
        """Wait for the parent to reach one of `targets`; on a timeout, say where things are.
        (The timeouts are generous: they catch a hang, they do not time the engine.)"""
        try:
            wait_for(lambda: self.state()[0] in targets, timeout, 0.2)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.account(procs)}") from None
        return self.state()[0]

    def account(self, procs: list[ManagerProcess]) -> str:
        """The parent's history, its children per state, and the managers' problems."""
        base = Path(self.root) / ".flow" / "state"
        kids = markers_at(self.root, self.kids_at)
        per_state = Counter(Path(p).relative_to(base).parts[0] for ps in kids.values() for p in ps)
        doubled = sum(1 for ps in kids.values() if len(ps) > 1)
        lines = [
            dump(self.root, [self.pid]),
            f"children: {len(kids)} keys, {doubled} with several markers, per state "
            f"{dict(per_state)}",
        ]
        for p in procs:
            tail = log_of(p).strip().splitlines()[-5:]
            lines.append(f"manager pid {p.pid} (exit {p.poll()}): " + " | ".join(tail))
        return "\n".join(lines)

    def check_children(self, watch: MarkerWatch, logs: list[ManagerProcess]) -> None:
        """One marker per child at every look and at the end, each child succeeded and ran
        exactly once, and no manager met a child directory or marker that already existed."""
        assert not watch.duplicates, f"children with two markers at once: {watch.duplicates}"
        kids = markers_at(self.root, self.kids_at)
        assert len(kids) == self.kids
        whole = marker_keys(self.root)
        assert {k: n for k, n in whole.items() if n != 1} == {}, "keys with several markers"
        base = Path(self.root) / ".flow" / "state"
        states = {Path(paths[0]).relative_to(base).parts[0] for paths in kids.values()}
        assert states == {State.SUCCEEDED.value}, f"children not all succeeded: {states}"
        # a claim given back before its launch (a busy manager briefly judged gone) never
        # ran: its gate never opened. What must hold is one launch per child
        launched = children_of(self.root, job(self.root, self.pid))
        twice = sorted(i.handle.key for i in launched if _launches(i.frames) != 1)
        assert not twice, f"{len(twice)} children launched other than once:\n" + dump(
            self.root, twice[:3]
        )
        for p in logs:
            assert "File exists" not in whole_log(p), log_of(p)
        # one chain per child, from one submission, through one run
        infos = children_of(self.root, job(self.root, self.pid))
        assert len(infos) == self.kids
        for info in infos:
            assert [f["gen"] for f in info.frames] == list(range(len(info.frames)))
            moves = Counter(str(f["to"]) for f in info.frames)
            assert moves["submitted"] == moves["running"] == 1, dump(self.root, [info.handle.key])

    def check_takeovers(self, displaceable: set[str]) -> list[str]:
        """Every committing -> committing of the parent displaced a manager of
        `displaceable` (dead or stopped), named as the holder in the takeover's evidence."""
        parent = job(self.root, self.pid)
        out = []
        for before, f in takeovers(parent.frames):
            ev = f.get("evidence")
            assert isinstance(ev, dict), f"takeover without evidence: {f}"
            assert ev.get("evidence") in EVIDENCE, ev
            assert ev.get("owner") == before["by"], (
                f"the evidence names {ev.get('owner')}, but the holder of the commit was "
                f"{before['by']} (who wrote the latest committing frame)"
            )
            assert before["by"] in displaceable, (
                f"{f['by']} displaced {before['by']}, a live holder of the commit, "
                f"{f['t'] - before['t']:.2f} s after it took the commit"
            )
            out.append(str(before["by"]))
        return out


def stop(procs: list[ManagerProcess]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        p.wait(60)


@pytest.mark.slow
def test_a_registration_killed_midway_leaves_one_marker_per_child(
    tmp_path: Path, managers: Managers
) -> None:
    scene = Scene(tmp_path, managers, kids=5000)
    first, first_id = scene.registrar()
    # each on a host of its own: they judge one another by heartbeats alone, so a taker
    # that let its lease lapse while it registers would be displaced
    others = [scene.serve(host=f"node{i}") for i in (1, 2, 3)]
    for p in others:
        manager_up(scene.root, p)
    with MarkerWatch(scene.root, scene.kids_at, interval=0.1) as watch:
        scene.go()
        seen = scene.wait_registration_started()
        first.kill()
        first.wait()
        assert seen < scene.kids, "the registration ended before the kill"
        end = scene.wait_until(TERMINAL, 240, [first, *others])
        stop(others)
    assert end is State.SUCCEEDED, scene.account([first, *others])
    parent = job(scene.root, scene.pid)
    assert parent.last.get("message") == f"collected {scene.kids}"
    displaced = scene.check_takeovers({first_id})
    assert 1 <= len(displaced) <= 2, displaced
    scene.check_children(watch, [first, *others])
    assert fsck_report(scene.root)["clean"], fsck_report(scene.root)


@pytest.mark.slow
def test_a_registrar_stopped_past_its_lease_wakes_without_registering_twice(
    tmp_path: Path, managers: Managers
) -> None:
    scene = Scene(tmp_path, managers, kids=1000)
    # on its own host a manager lives as long as its process, stopped or not: only a peer
    # on another host judges it by its heartbeat, which a stopped manager no longer writes
    first, first_id = scene.registrar(host="elsewhere")
    other = scene.serve()
    manager_up(scene.root, other)
    with MarkerWatch(scene.root, scene.kids_at) as watch:
        scene.go()
        scene.wait_registration_started()
        first.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            st, marker = scene.state()
            assert st is State.COMMITTING, f"the commit ended before the stop: {st.value}"
            # the other manager takes the commit over while the registrar is stopped
            wait_for(lambda: scene.state()[1].generation > marker.generation, 30, 0.05)
            assert first.poll() is None
            time.sleep(max(0.0, stopped + 4 * LEASE - time.monotonic()))  # the stop: 4 leases
        finally:
            first.send_signal(signal.SIGCONT)
        end = scene.wait_until(TERMINAL, 120, [first, other])
        stop([first, other])
    assert end is State.SUCCEEDED, scene.account([first, other])
    displaced = scene.check_takeovers({first_id})
    assert displaced, "nobody took the commit of the stopped manager over"
    scene.check_children(watch, [first, other])
    assert fsck_report(scene.root)["clean"], fsck_report(scene.root)


@pytest.mark.slow
def test_a_long_registration_holds_its_lease_against_a_live_peer(
    tmp_path: Path, managers: Managers, capsys: pytest.CaptureFixture[str]
) -> None:
    scene = Scene(tmp_path, managers, kids=20000)
    # on another host than its peer: judged by its heartbeat alone, not by its process
    first, first_id = scene.registrar(host="elsewhere")
    other = scene.serve()
    manager_up(scene.root, other)
    with MarkerWatch(scene.root, scene.kids_at, interval=0.5) as watch:
        scene.go()
        scene.wait_until(set(State) - {State.RUNNING, State.COMMITTING}, 240, [first, other])
        stop([first, other])
    parent = job(scene.root, scene.pid)
    assert parent.state is State.WAITING, scene.account([first, other])
    started = next(f for f in parent.frames if f.get("to") == State.COMMITTING.value)
    waited = next(f for f in parent.frames if f.get("to") == State.WAITING.value)
    with capsys.disabled():
        print(
            f"\n20,000-child registration (lease {LEASE:g} s, a second manager up): "
            f"{waited['t'] - started['t']:.2f} s from running -> committing to waiting"
        )
    taken = [
        f"{f['by']} took it from {before['by']} {f['t'] - started['t']:.2f} s into the "
        f"commit on evidence {f.get('evidence')}"
        for before, f in takeovers(parent.frames)
    ]
    assert taken == [], "a live registration was taken over: " + "; ".join(taken)
    assert started["by"] == waited["by"] == first_id
    assert not watch.duplicates, f"children with two markers at once: {watch.duplicates}"
    kids = markers_at(scene.root, scene.kids_at)
    assert len(kids) == scene.kids
    assert {k: n for k, n in marker_keys(scene.root).items() if n != 1} == {}
    launched = children_of(scene.root, job(scene.root, scene.pid))
    assert all(_launches(i.frames) <= 1 for i in launched)
    for p in (first, other):
        assert "File exists" not in whole_log(p), log_of(p)
    assert fsck_report(scene.root)["clean"], fsck_report(scene.root)


def _launches(frames: list[Frame]) -> int:
    """How many attempts of a job were launched (claimed -> running)."""
    return sum(1 for f in frames if (f.get("from"), f.get("to")) == ("claimed", "running"))
