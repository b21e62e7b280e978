"""A job directory deleted (rm -rf) under a running attempt: the manager keeps serving the
other jobs, and the job ends failed (or is reported), never succeeded and never a crash."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import wait_for
from manager.support import Managers, OrphanReaper, job, make_workspace, submit, write_script

from httk_flow.protocol.states import State

from .support import current, job_now, problems

#: waits until its job directory is gone, then ends as $FLOW_PARAM_end says
DOOMED = r"""
if [ "$FLOW_ATTEMPT_ID" != a0001 ]; then publish '{"action":"succeed"}'; exit 0; fi
touch "$FLOW_WORKDIR/started"
for _ in $(seq 200); do [ -d "$FLOW_JOB_DIR" ] || break; sleep 0.05; done
case "$FLOW_PARAM_end" in
publish) publish '{"action":"succeed","message":"into the void"}' ;;
exit0) exit 0 ;;
esac
"""


@dataclass
class Scene:
    root: str
    ids: dict[str, str]
    good: list[str]
    rc: int
    log: str


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    base = tmp_path_factory.mktemp("deleted")
    root = make_workspace(base / "ws")
    prog = write_script(base / "scripts", "doomed.sh", DOOMED)
    ok = write_script(base / "scripts", "ok.sh", "sleep 0.2\n")
    ids = {
        end: submit(root, prog, params={"end": end}, priority=900)[0]
        for end in ("publish", "exit0")
    }
    good = submit(root, ok, count=4)
    with OrphanReaper():
        managers = Managers(base)
        try:
            p = managers.start(root, workers=3)
            dirs = [job_now(root, jid).job_dir(root) for jid in ids.values()]
            wait_for(lambda: all((d / "run" / "started").exists() for d in dirs), 20)
            for d in dirs:
                shutil.rmtree(d)
            rc = p.wait(60)
            assert p.log is not None
            log = p.log.read_text(errors="replace")
        finally:
            managers.close()
    yield Scene(root, ids, good, rc, log)


def test_the_manager_serves_the_other_jobs(scene: Scene) -> None:
    assert "Traceback" not in scene.log, scene.log
    assert scene.rc in (0, 1)
    for jid in scene.good:
        assert job(scene.root, jid).state is State.SUCCEEDED


def test_an_attempt_that_cannot_publish_any_more_fails_its_job(scene: Scene) -> None:
    h, frame = current(scene.root, scene.ids["publish"])
    assert h.state is State.FAILED, frame
    assert frame["failure"]["code"] == "protocol_error"
    msg = frame["failure"]["message"]
    assert ("job.json" in msg and "missing" in msg) or "vanished while it ran" in msg
    assert not (Path(scene.root) / h.placement / h.key).exists(), "nothing recreated it"


def test_a_job_whose_directory_vanished_does_not_end_succeeded(scene: Scene) -> None:
    h, frame = current(scene.root, scene.ids["exit0"])
    reported = [m for o, m in problems(scene.log) if scene.ids["exit0"] in o]
    assert h.state is State.FAILED or reported, frame
