"""A manager whose clock is three hours ahead must not take over a live manager's work:
liveness is the heartbeat's age in the shared filesystem's clock (leases.fs_now), not in
either node's. Once the live manager really dies, the skewed one does take over.

The skewed manager runs with libfaketime preloaded when it is installed (`apt-get install
faketime`) and leaves utime(NULL) to the filesystem, as a shared filesystem's server
stamps it; else under a wrapper that shifts time.time() before importing httk_flow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import wait_for
from manager.support import ManagerProcess, Managers, log_of, submit, write_script

from httk_flow.states import State

from .support import job_now

SKEW = 3 * 3600.0
LEASE = "1s"  # takeover after 2 s of silence (the default takeover factor)

#: flow CLI in a process that believes it runs on host argv[1], its clock shifted by argv[2]
SKEWED_FLOW = (
    "import socket, sys, time\n"
    "host, skew = sys.argv.pop(1), float(sys.argv.pop(1))\n"
    "socket.gethostname = lambda: host\n"
    "if skew:\n"
    "    real = time.time\n"
    "    time.time = lambda: real() + skew\n"
    "from httk_flow.cli.main import main; main()\n"
)

#: the clock a process sees, and the filesystem's stamp of a file it touches just then
PROBE = (
    "import json, os, sys, time\n"
    "p = sys.argv[1]\n"
    "open(p, 'wb').close(); os.utime(p, None)\n"
    "print(json.dumps({'time': time.time(), 'fs': os.stat(p).st_mtime}))\n"
)

#: the first attempt runs long (and counts its runs); a takeover's attempt ends at once
LONG_FIRST = r"""
echo "$FLOW_ATTEMPT_ID" >> "$FLOW_PARAM_runs"
if [ "$FLOW_ATTEMPT_ID" = a0001 ]; then touch "$FLOW_WORKDIR/started"; sleep 60; fi
exit 0
"""


#: where Debian and others install libfaketime's preload library
LIBFAKETIME = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
)


def _skewed_launcher(tmp: Path) -> tuple[list[str], dict[str, str], float]:
    """(argv before SKEWED_FLOW's host argument, environment, skew it passes on).

    libfaketime is preloaded into the manager itself (not through the `faketime` command,
    whose child would outlive a kill of the command); it must leave utime(NULL) to the
    filesystem, as a shared filesystem's server stamps it."""
    probe = tmp / "clock-probe"
    candidates: list[tuple[dict[str, str], float]] = []
    for lib in LIBFAKETIME:
        if os.path.exists(lib):
            for fake_utime in ("1", "0"):
                env = {"LD_PRELOAD": lib, "FAKETIME": f"+{int(SKEW)}", "FAKE_UTIME": fake_utime}
                candidates.append((env, 0.0))
    candidates.append(({}, SKEW))
    for env, skew in candidates:
        shift = f"import time; time.time = (lambda r: lambda: r() + {skew})(time.time)\n"
        r = subprocess.run(
            [sys.executable, "-c", (shift if skew else "") + PROBE, str(probe)],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            timeout=30,
        )
        if r.returncode != 0:
            continue
        seen = json.loads(r.stdout)
        now = time.time()
        if abs(seen["time"] - now - SKEW) < 60 and abs(seen["fs"] - now) < 60:
            return [sys.executable, "-c", SKEWED_FLOW], env, skew
    pytest.fail("no way to run a process with a skewed clock")


def _start(
    managers: Managers, root: str, argv: list[str], env: dict[str, str], *args: str
) -> ManagerProcess:
    managers._n += 1
    log = managers.tmp / f"manager-{managers._n}.log"
    with open(log, "wb") as out:
        p = ManagerProcess(
            [*argv, "serve", "-w", root, "--quiet", "--lease", LEASE, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
        )
    p.log = log
    managers.procs.append(p)
    managers.roots.add(root)
    return p


def _heartbeat(root: str, host: str) -> dict[str, object]:
    base = Path(root) / ".flow" / "managers"
    for d in base.iterdir():
        hb = d / "heartbeat.json"
        if hb.exists():
            info = json.loads(hb.read_text())
            if info["host"] == host:
                return info
    raise AssertionError(f"no heartbeat of {host}")


def test_a_manager_hours_ahead_does_not_take_over_live_work(
    root: str, scripts: Path, managers: Managers, tmp_path: Path
) -> None:
    skewed, skew_env, skew = _skewed_launcher(tmp_path)
    plain = [sys.executable, "-c", SKEWED_FLOW]
    runs = tmp_path / "runs"
    prog = write_script(scripts, "long.sh", LONG_FIRST)
    [long_job] = submit(root, prog, workdir="isolated", params={"runs": str(runs)})
    a = _start(managers, root, [*plain, "node-a", "0"], {}, "--workers", "1")
    wait_for(lambda: job_now(root, long_job).state is State.RUNNING, 20)
    owner = job_now(root, long_job).last["attempt"]["manager"]

    quick = submit(root, write_script(scripts, "ok.sh", "exit 0\n"), count=3)
    b = _start(managers, root, [*skewed, "node-b", str(skew)], skew_env, "--workers", "2")
    wait_for(lambda: all(job_now(root, j).state is State.SUCCEEDED for j in quick), 20)
    b_info = _heartbeat(root, "node-b")
    assert float(b_info["started"]) - time.time() > SKEW - 600, "B's clock is not skewed"
    # B has run for more than the takeover grace of A's lease (2 s) several times over
    time.sleep(4)
    info = job_now(root, long_job)
    assert info.state is State.RUNNING, log_of(b)
    assert info.last["attempt"]["manager"] == owner
    assert not [f for f in info.frames if "evidence" in f], info.frames
    assert runs.read_text().split() == ["a0001"]
    assert a.poll() is None and b.poll() is None, log_of(a) + log_of(b)

    # control: once A is really gone, B (still skewed) takes its work over on lease age
    a.kill()
    a.wait()
    wait_for(lambda: job_now(root, long_job).state is State.SUCCEEDED, 30)
    evidence = [f["evidence"] for f in job_now(root, long_job).frames if "evidence" in f]
    assert evidence and evidence[0]["owner"] == owner, evidence
    assert evidence[0]["evidence"] == "lease_expired"
