"""`flow` with an NFS model installed: the wrapper multi-process tests start managers with.

    python nfs_flow.py HOST flow-arguments...

$FLOW_TEST_NFS is a JSON object: {"late": s, "late_dirs": {suffix: s}, "linger": s,
"estale": bool, "lying_renames": "markers"|"all"}. HOST is what socket.gethostname()
answers ("" = the real one), so managers on this machine can act as managers on several
nodes.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import faultfs

from httk_flow.protocol.fsio import FileSystem, set_filesystem


def model(spec: dict[str, object]) -> FileSystem:
    bases: list[type] = []
    kw: dict[str, object] = {}
    if spec.get("late"):
        bases.append(faultfs.LateNames)
        kw["late"] = float(spec["late"])  # type: ignore[arg-type]
        kw["late_dirs"] = spec.get("late_dirs", {})
    if spec.get("linger"):
        bases.append(faultfs.LingeringNames)
        kw["linger"] = float(spec["linger"])  # type: ignore[arg-type]
    if spec.get("estale"):
        bases.append(faultfs.StaleHandles)
    if spec.get("lying_renames"):
        bases.append(faultfs.LyingRenames)
        if spec["lying_renames"] == "markers":
            kw["applies"] = faultfs.markers_only
    cls = type("Model", (*bases, FileSystem), {})
    return cls(**kw)  # type: ignore[no-any-return]


def main() -> None:
    host = sys.argv.pop(1)
    if host:
        socket.gethostname = lambda: host  # type: ignore[assignment]
    fault = model(json.loads(os.environ.get("FLOW_TEST_NFS", "{}")))
    set_filesystem(fault)
    # what the model did, for the test to see it was at work
    counters = ("hidden", "ghosts", "stale", "lies")
    atexit.register(
        lambda: print(
            "nfs-model: "
            + json.dumps({c: getattr(fault, c) for c in counters if hasattr(fault, c)}),
            file=sys.stderr,
        )
    )
    from httk_flow.cli.main import main as flow_main

    flow_main()


if __name__ == "__main__":
    main()
