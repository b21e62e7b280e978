"""Commits that cannot complete end, and jobs that kill their manager are stopped.

A commit that fails for a permanent reason (a child program that is gone or never
existed, a grandchild placement deeper than 16 components or longer than 512 characters)
fails its job with `commit_error` naming the cause, and `flow run` exits; placements that
leave no room for a job's children are refused at submission. A transient failure (the
disk full for a moment) is retried by the live owner until the disk has room again. A job
whose program kills its own manager is failed with `manager_deaths` after three such
attempts, each takeover recorded with its evidence and charged to nothing.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import fill_disk, small_tmpfs, wait_for

from httk_flow.protocol.states import State

from .support import (
    Managers,
    children_of,
    dump,
    flow,
    fsck_report,
    job,
    leased_workspace,
    log_of,
    marker_keys,
    markers_at,
    processes_of,
    submit,
    whole_log,
    write_program,
    write_script,
)

LEASE = "1s"
EVIDENCE = {"process_gone", "lease_expired", "stopped", "no_heartbeat"}


@pytest.fixture
def root(tmp_path: Path) -> str:
    return leased_workspace(tmp_path / "ws", LEASE)


def kids_at(placement: str, key: str) -> str:
    """Where the children of the job `key` at `placement` have their markers."""
    return f"{placement}/{key}"


# -- a child program that is gone at commit -----------------------------------------------

#: main writes kid.sh into its job directory, spawns it by a relative --program from there,
#: publishes the wait and (with remove=1) deletes kid.sh before it exits
SPAWNS_ITS_OWN_KID = r"""#!/usr/bin/env bash
set -euo pipefail
source "$FLOW_BASH_API"

flow_steps main collect

step_main() {
    local remove
    flow_param -v remove remove 0
    printf '#!/bin/sh\necho ran > "$FLOW_JOB_DIR/ran"\n' >"$FLOW_JOB_DIR/kid.sh"
    chmod +x "$FLOW_JOB_DIR/kid.sh"
    cd "$FLOW_JOB_DIR"
    flow_spawn --tag kid --program kid.sh
    flow_wait collect
    if [[ $remove == 1 ]]; then rm kid.sh; fi
}

step_collect() {
    local label id state path
    while read -r label id state path; do
        if [[ ! -e $path/ran ]]; then
            flow_fail "child $label did not run" kid_missing
            return
        fi
    done < <(flow_children)
    flow_succeed "the child ran"
}

flow_main "$@"
"""


def failed_commit(root: str, jid: str, managers: Managers, *cause: str) -> None:
    """`flow run` ends (exit 1), the job failed with commit_error naming `cause`, and
    no child of it was registered."""
    assert managers.run(root, "--lease", LEASE) == 1, dump(root)
    info = job(root, jid)
    assert info.state is State.FAILED, dump(root, [jid])
    assert info.failure_code == "commit_error", dump(root, [jid])
    message = info.last["failure"]["message"]
    for c in cause:
        assert c in message, message
    assert markers_at(root, kids_at(info.handle.placement, info.handle.key)) == {}
    assert fsck_report(root)["clean"], fsck_report(root)


def test_a_child_program_deleted_after_the_wait_was_published_fails_the_commit(
    root: str, tmp_path: Path, managers: Managers
) -> None:
    program = write_program(tmp_path / "scripts", "parent.sh", SPAWNS_ITS_OWN_KID)
    [jid] = submit(root, program, params={"remove": 1})
    failed_commit(root, jid, managers, "kid.sh")


def test_a_relative_child_program_is_found_in_the_parents_job_directory(
    root: str, tmp_path: Path, managers: Managers
) -> None:
    program = write_program(tmp_path / "scripts", "parent.sh", SPAWNS_ITS_OWN_KID)
    [jid] = submit(root, program, params={"remove": 0})
    assert managers.run(root, "--lease", LEASE) == 0, dump(root)
    info = job(root, jid)
    assert info.state is State.SUCCEEDED, dump(root, [jid])
    assert info.last.get("message") == "the child ran"
    assert fsck_report(root)["clean"], fsck_report(root)


#: the wait published by hand (the bash API refuses a missing --program when it is
#: spawned): the child's program is a relative path, to be found in the parent's job
#: directory, where main writes it unless told not to
HAND_PUBLISHED = r"""
case "$FLOW_STEP" in
    main)
        if [ "$FLOW_PARAM_write" = true ]; then
            printf '#!/bin/sh\necho ran > "$FLOW_JOB_DIR/ran"\n' > "$FLOW_JOB_DIR/$FLOW_PARAM_kid"
            chmod +x "$FLOW_JOB_DIR/$FLOW_PARAM_kid"
        fi
        publish '{"action":"wait","step":"collect","join":"all_succeeded"}' \
            "{\"label\":\"c1\",\"program\":\"$FLOW_PARAM_kid\"}"
        ;;
    collect) publish '{"action":"succeed","message":"joined"}' ;;
esac
"""


def test_a_relative_child_program_that_does_not_resolve_fails_the_commit(
    root: str, scripts: Path, managers: Managers
) -> None:
    program = write_script(scripts, "parent.sh", HAND_PUBLISHED)
    [jid] = submit(root, program, params={"kid": "nope.sh", "write": False})
    failed_commit(root, jid, managers, "nope.sh")


def test_a_hand_published_relative_child_program_resolves_against_the_job_directory(
    root: str, scripts: Path, managers: Managers
) -> None:
    program = write_script(scripts, "parent.sh", HAND_PUBLISHED)
    [jid] = submit(root, program, params={"kid": "kid.sh", "write": True})
    assert managers.run(root, "--lease", LEASE) == 0, dump(root)
    info = job(root, jid)
    assert info.state is State.SUCCEEDED, dump(root)
    [kid] = children_of(root, info)
    assert (kid.job_dir(root) / "ran").exists()


# -- placements: room for the children's level --------------------------------------------

DEEP_15 = "/".join(f"d{i:02d}" for i in range(1, 16))
LONG_413 = "/".join(["a" * 100, "b" * 100, "c" * 100, "e" * 110])
#: the longest tag: a key of 64 + 2 + 32 = 98 characters
TAG_64 = "t" * 64

#: main spawns $kids children at step $kid_step and joins them whatever they end as; a
#: child at step mid spawns a grandchild of its own; collect lists the children's states
GENERATIONS = r"""#!/usr/bin/env bash
set -euo pipefail
source "$FLOW_BASH_API"

flow_steps main mid leaf settle collect

step_main() {
    local i n step
    flow_param -v n kids 2
    flow_param -v step kid_step leaf
    for ((i = 1; i <= n; i++)); do flow_spawn --step "$step"; done
    flow_wait collect --all-done
}
step_mid() {
    flow_spawn --step leaf
    flow_wait settle
}
step_leaf() { flow_succeed "leaf"; }
step_settle() { flow_succeed "settled"; }
step_collect() {
    local label id state path states=""
    while read -r label id state path; do states+="${states:+ }$state"; done < <(flow_children)
    flow_succeed "children: $states"
}

flow_main "$@"
"""


def test_a_placement_must_leave_room_for_its_jobs_children(
    root: str, tmp_path: Path, managers: Managers
) -> None:
    assert DEEP_15.count("/") + 1 == 15 and len(LONG_413) == 413
    program = write_program(tmp_path / "scripts", "gen.sh", GENERATIONS)
    refused = {
        DEEP_15 + "/d16": "15",  # 16 components: its children would be 17 deep
        LONG_413 + "e": "413",  # 414 characters: a child's placement could pass 512
    }
    for placement, limit in refused.items():
        r = flow("submit", "-w", root, "--placement", placement, "--tag", TAG_64, program)
        assert r.returncode == 2, (placement, r.stdout, r.stderr)
        assert r.stderr.startswith("flow: error:"), r.stderr
        assert limit in r.stderr, r.stderr
    assert marker_keys(root) == {}, "a refused submission left a marker"
    ids = []
    for placement in (DEEP_15, LONG_413):
        r = flow("submit", "-w", root, "--placement", placement, "--tag", TAG_64, program)
        assert r.returncode == 0, r.stderr
        ids.append(r.stdout.strip())
    assert managers.run(root, "--lease", LEASE) == 0, dump(root)
    deepest = set()
    for jid in ids:
        info = job(root, jid)
        assert info.state is State.SUCCEEDED, dump(root, [jid])
        assert info.last.get("message") == "children: succeeded succeeded"
        deepest |= {k.handle.placement for k in children_of(root, info)}
    assert {p.count("/") + 1 for p in deepest} == {16, 5}
    assert max(len(p) for p in deepest) == 512
    assert fsck_report(root)["clean"], fsck_report(root)


@pytest.mark.parametrize(
    ("placement", "limit"),
    [(DEEP_15, "16"), (LONG_413, "512")],
    ids=["17-levels", "longer-than-512"],
)
def test_a_grandchild_fanout_beyond_the_placement_limits_fails_the_committing_child(
    root: str, tmp_path: Path, managers: Managers, placement: str, limit: str
) -> None:
    program = write_program(tmp_path / "scripts", "gen.sh", GENERATIONS)
    options = ["--placement", placement, "--tag", TAG_64, "--param", "kids=1"]
    r = flow("submit", "-w", root, *options, "--param", "kid_step=mid", program)
    assert r.returncode == 0, r.stderr
    jid = r.stdout.strip()
    assert managers.run(root, "--lease", LEASE) == 1, dump(root)  # the child failed
    parent = job(root, jid)
    assert parent.state is State.SUCCEEDED, dump(root)
    assert parent.last.get("message") == "children: failed"
    [kid] = children_of(root, parent)
    assert kid.failure_code == "commit_error", dump(root, [kid.handle.key])
    assert limit in kid.last["failure"]["message"], kid.last["failure"]
    assert markers_at(root, kids_at(kid.handle.placement, kid.handle.key)) == {}
    assert fsck_report(root)["clean"], fsck_report(root)


# -- the disk full for a moment -----------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs, unmounted at teardown."""
    with small_tmpfs(tmp_path / "small", "size=8m") as mnt:
        yield mnt


#: publishes its outcome at once, then holds its attempt open until the gate file exists
HOLDS = r"""#!/usr/bin/env bash
set -euo pipefail
source "$FLOW_BASH_API"

flow_steps main

step_main() {
    local gate
    flow_param -v gate gate
    flow_succeed "held"
    while [[ ! -e $gate ]]; do sleep 0.05; done
}

flow_main "$@"
"""


def test_commits_on_a_full_disk_are_retried_until_it_has_room(
    small_disk: Path, tmp_path: Path, managers: Managers
) -> None:
    # kept files: tidying the first commits would free the room the scene needs to be gone
    root = leased_workspace(small_disk / "ws", "2s", keep_files=True)
    gate = tmp_path / "gate"  # outside the small disk
    program = write_program(tmp_path / "scripts", "hold.sh", HOLDS)
    ids = submit(root, program, 20, params={"gate": str(gate)})
    run = managers.start(root, "--lease", "2s", workers=20)

    def published() -> int:
        # flow_succeed writes outcome.line in place (protocol 2)
        return len(list(Path(root).glob("jobs/*/*/a0001/outcome.line")))

    wait_for(lambda: published() == 20 or run.poll() is not None, 60, 0.05)
    assert run.poll() is None, log_of(run)
    filler = fill_disk(small_disk)
    gate.touch()  # the 20 attempts exit: their commits meet the full disk

    def reported() -> list[str]:
        """The jobs whose commit has met the full disk (reported once per job)."""
        lines = [ln for ln in whole_log(run).splitlines() if "No space left" in ln]
        lines += [ln for ln in whole_log(run).splitlines() if "disk is full" in ln]
        return [jid for jid in ids if any(jid in ln for ln in lines)]

    # the disk stays full until a commit has met it, however slowly the manager gets to its
    # commits; then 1.5 s longer (the scene, not a check): the first commit that met it is
    # retried on the full disk, after 0.5 s and again after 1 s more
    wait_for(lambda: reported() or run.poll() is not None, 60, 0.05)
    assert run.poll() is None, log_of(run)
    time.sleep(1.5)
    filler.unlink()
    assert run.wait(60) == 0, log_of(run)
    for jid in ids:
        assert job(root, jid).state is State.SUCCEEDED, dump(root, [jid])
    # the full disk is reported, but once per job, not at every retry
    full = [
        line
        for line in whole_log(run).splitlines()
        if "disk is full" in line or "No space left" in line
    ]
    per_job = {jid: sum(jid in line for line in full) for jid in ids}
    assert sum(per_job.values()) >= 1, log_of(run)
    assert max(per_job.values()) == 1, log_of(run)
    assert fsck_report(root)["clean"], fsck_report(root)


# -- a job that kills its manager ---------------------------------------------------------

#: notes each start, then kills the manager that launched it, and lives on as an orphan
KILLS_ITS_MANAGER = r"""#!/usr/bin/env bash
set -euo pipefail
source "$FLOW_BASH_API"

flow_steps main

step_main() {
    echo "$FLOW_ATTEMPT_ID $FLOW_ATTEMPT $FLOW_UNCLEAN_RESTART" >>"$FLOW_JOB_DIR/starts"
    kill -9 "$PPID"
    sleep 30
    flow_succeed "outlived its manager"
}

flow_main "$@"
"""


def test_a_job_that_kills_its_manager_fails_after_three_manager_deaths(
    root: str, tmp_path: Path, managers: Managers
) -> None:
    program = write_program(tmp_path / "scripts", "killer.sh", KILLS_ITS_MANAGER)
    [jid] = submit(root, program)
    codes = []
    for _ in range(4):
        codes.append(managers.run(root, "--lease", LEASE))
        if codes[-1] != -signal.SIGKILL:
            break
    deaths = codes.count(-signal.SIGKILL)
    assert codes[:deaths] == [-signal.SIGKILL] * deaths and len(codes) == deaths + 1, (
        f"exit statuses of the flow runs: {codes}\n{dump(root)}"
    )
    assert 1 <= deaths <= 3, codes
    info = job(root, jid)
    assert info.state is State.FAILED, dump(root)
    assert info.failure_code == "manager_deaths", dump(root)
    message = info.last["failure"]["message"]
    assert "manager" in message and str(deaths) in message, message
    # each death was taken over on evidence, the orphan killed first, and nothing charged
    taken = [f for f in info.frames if "evidence" in f]
    assert {f["attempt"]["n"] for f in taken} == set(range(1, deaths + 1)), dump(root)
    for f in taken:
        ev = f["evidence"]
        assert ev["evidence"] in EVIDENCE, ev
        killed = ev.get("killed")
        assert isinstance(killed, dict), f"the orphaned attempt was killed unrecorded: {ev}"
        assert "signal" in killed and killed.get("by") == f["by"], ev
    starts = (info.job_dir(root) / "starts").read_text().split("\n")[:-1]
    assert len(starts) == deaths, starts
    assert [s.split()[1] for s in starts] == ["1"] * deaths, "a takeover was charged a try"
    assert [s.split()[2] for s in starts] == ["0"] + ["1"] * (deaths - 1), starts
    assert not processes_of(root), "an orphaned attempt outlived the last run"
    assert fsck_report(root)["clean"], fsck_report(root)
    # the run that failed the job says so, as after any job it failed
    assert codes[-1] == 1, f"the run that failed the job with manager_deaths exited {codes[-1]}"
