"""child_ended: one waitid tells the reap whether any child ended, reaping nothing."""

from __future__ import annotations

import os
import subprocess
import sys

_PROBE = """
import os, signal, sys, time
sys.path.insert(0, sys.argv[1])
from httk_flow.manager.launcher import child_ended
seen = [child_ended()]  # no child at all: cannot tell, so True
pid = os.posix_spawn("/bin/sleep", ["/bin/sleep", "30"], {})
seen.append(child_ended())  # running: False
os.kill(pid, signal.SIGTERM)
deadline = time.monotonic() + 10
while not child_ended() and time.monotonic() < deadline:
    time.sleep(0.01)
seen.append(child_ended())  # ended, a zombie: True
seen.append(child_ended())  # and still there: waitid reaped nothing
done, status = os.waitpid(pid, os.WNOHANG)
seen.append(done == pid and os.waitstatus_to_exitcode(status) == -signal.SIGTERM)
print(seen)
"""


def test_child_ended_sees_an_ended_child_and_leaves_it_for_its_poll() -> None:
    # in a fresh interpreter: pytest's own process may have children of its own
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, root], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[True, False, True, True, True]"
