"""The signals a job starts with are those of a direct run from a shell: the manager's
Python ignores SIGPIPE and SIGXFSZ, and an ignored signal stays ignored across exec (bash
cannot even trap one that was ignored when it started), so each launcher gives the program
their defaults back and blocks nothing. A pipeline such as `yes | head -n 1` then ends its
producer by SIGPIPE (status 141), exactly as when the script is run by hand."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from httk_flow.protocol.states import State

from .support import Managers, dump, job, log_of, submit, write_program

#: prints the pending-signal words of /proc and what `yes | head` ends with
PROBE = """
grep -E '^(SigIgn|SigBlk):' /proc/self/status
yes | head -n 1 > /dev/null
echo "pipeline ${PIPESTATUS[*]}"
"""

SHEBANGS = {"bash": "#!/usr/bin/env bash", "sh": "#!/bin/bash -e"}


def _words(text: str) -> dict[str, str]:
    return {line.split()[0].rstrip(":"): line.split(None, 1)[1] for line in text.splitlines()}


def _bit(mask: str, sig: int) -> bool:
    return bool(int(mask, 16) >> (sig - 1) & 1)


@pytest.mark.parametrize("launcher", ["bash", "sh"])
def test_a_job_starts_with_the_signals_of_a_direct_run(
    root: str, scripts: Path, managers: Managers, launcher: str
) -> None:
    # `#!/bin/bash -e` is not taken by the bash launcher (an option): it goes through /bin/sh
    prog = write_program(scripts, "probe.sh", SHEBANGS[launcher] + "\n" + PROBE)
    direct = _words(subprocess.run([prog], capture_output=True, text=True, check=True).stdout)
    [jid] = submit(root, prog)
    assert managers.run(root) == 0, log_of(managers.procs[-1])
    info = job(root, jid)
    assert info.state is State.SUCCEEDED, dump(root, [jid])
    got = _words((info.job_dir(root) / "a0001.stdout").read_text())
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        assert not _bit(got["SigIgn"], sig), (sig, got)
        assert _bit(got["SigIgn"], sig) == _bit(direct["SigIgn"], sig)
    assert int(got["SigBlk"], 16) == 0, got
    # the producer is ended by SIGPIPE (128 + 13), as in the direct run
    assert got["pipeline"] == "141 0" == direct["pipeline"]
