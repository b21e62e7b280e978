"""Fixtures of the manager tests: one job served by `flow serve` until its first attempt runs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import wait_for

from .support import ManagerProcess, Managers, job, log_of, submit, write_script

#: the job of serve_one_job unless it is given another: its first attempt sleeps until it is
#: stopped; any later attempt notes "$FLOW_IS_RESTART $FLOW_UNCLEAN_RESTART" in
#: $FLOW_WORKDIR/restart and succeeds at once
SLEEPER = """
if [ "$(bump main)" -eq 1 ]; then
    touch "$FLOW_WORKDIR/started"
    sleep 30
fi
echo "$FLOW_IS_RESTART $FLOW_UNCLEAN_RESTART" > "$FLOW_WORKDIR/restart"
publish '{"action":"succeed"}'
"""


@pytest.fixture
def serve_one_job(
    root: str, scripts: Path, managers: Managers
) -> Callable[..., tuple[str, Path, ManagerProcess]]:
    """`serve_one_job(*args, body=None, env=None)`: submit one job running `body` (after
    support.PRELUDE; SLEEPER when None) and start `flow serve ARGS` on it, with `env`, until
    the job's first attempt has touched $FLOW_WORKDIR/started: (job id, workdir, manager)."""

    def serve(
        *args: str, body: str | None = None, env: dict[str, str] | None = None
    ) -> tuple[str, Path, ManagerProcess]:
        [jid] = submit(root, write_script(scripts, "job.sh", body or SLEEPER))
        p = managers.start(root, *args, command="serve", env=env)
        workdir = job(root, jid).job_dir(root) / "run"
        wait_for(lambda: (workdir / "started").exists() or p.poll() is not None, 20)
        assert p.poll() is None, log_of(p)
        return jid, workdir, p

    return serve
