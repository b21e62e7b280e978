"""Python scripts the benchmarks run in a fresh interpreter (python -c SCRIPT ARGS...)."""

#: registers every submitted job through the package API (as a manager's register pass would)
REGISTER_SCRIPT = """
import sys
from httk_flow.protocol.discovery import walk_all
from httk_flow.protocol.jobs import register
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace

ws = Workspace.open(sys.argv[1])
# list first: markers renamed out of a directory being scanned may be skipped or repeated
handles = list(walk_all(ws, State.SUBMITTED))
for h in handles:
    register(ws, h, actor="bench")
ws.close()
print(len(handles))
"""

#: the filesystem work of a submission without the engine: per job a payload directory
#: published by rename and an empty marker, one journal write per 512 jobs; with "1",
#: the fsyncs of durable mode (file, its directory, the parents before each batch's markers)
FLOOR_SCRIPT = """
import os, sys, uuid

root, n, durable = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
def fsync_dir(p):
    fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    os.close(fd)
for d in ("tmp", "journal", "jobs", "state/submitted/jobs"):
    os.makedirs(os.path.join(root, d))
journal = os.open(os.path.join(root, "journal", "0.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
payload, frame = b"j" * 500, b"f" * 230 + b"\\n"
made = set()
for start in range(0, n, 512):
    ids = [uuid.uuid4().hex for _ in range(min(512, n - start))]
    parents, marker_dirs = set(), set()
    for i in ids:
        tmp = os.path.join(root, "tmp", i)
        os.mkdir(tmp)
        fd = os.open(os.path.join(tmp, "job.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        os.write(fd, payload)
        if durable:
            os.fsync(fd)
        os.close(fd)
        if durable:
            fsync_dir(tmp)
        parent = os.path.join(root, "jobs", i[:3])
        if parent not in made:
            os.makedirs(parent, exist_ok=True)
            made.add(parent)
        os.rename(tmp, os.path.join(parent, i))
        parents.add(parent)
    if durable:
        for p in parents:
            fsync_dir(p)
    os.write(journal, frame * len(ids))
    if durable:
        os.fsync(journal)
    for i in ids:
        d = os.path.join(root, "state", "submitted", "jobs", i[:3])
        if d not in made:
            os.makedirs(d, exist_ok=True)
            made.add(d)
        marker = os.path.join(d, i + ".p500.g0.x-0-0")
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        marker_dirs.add(d)
    if durable:
        for d in marker_dirs:
            fsync_dir(d)
"""
