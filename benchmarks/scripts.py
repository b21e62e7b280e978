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
#: durable as the engine makes it (group commit): one syncfs(2) of the filesystem once a
#: batch's payloads are written, before any is published, and one once its markers are
FLOOR_SCRIPT = """
import ctypes, os, sys, uuid

root, n, durable = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
libc = ctypes.CDLL(None, use_errno=True)
def syncfs():
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if libc.syncfs(fd) != 0:
            raise OSError(ctypes.get_errno(), "syncfs")
    finally:
        os.close(fd)
for d in ("tmp", "journal", "jobs", "state/submitted/jobs"):
    os.makedirs(os.path.join(root, d))
journal = os.open(os.path.join(root, "journal", "0.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
payload, frame = b"j" * 500, b"f" * 230 + b"\\n"
made = set()
for start in range(0, n, 512):
    ids = [uuid.uuid4().hex for _ in range(min(512, n - start))]
    for i in ids:
        tmp = os.path.join(root, "tmp", i)
        os.mkdir(tmp)
        fd = os.open(os.path.join(tmp, "job.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        os.write(fd, payload)
        os.close(fd)
    os.write(journal, frame * len(ids))
    if durable:
        syncfs()  # every payload and frame whole on disk before any is published
    for i in ids:
        parent = os.path.join(root, "jobs", i[:3])
        if parent not in made:
            os.makedirs(parent, exist_ok=True)
            made.add(parent)
        os.rename(os.path.join(root, "tmp", i), os.path.join(parent, i))
        d = os.path.join(root, "state", "submitted", "jobs", i[:3])
        if d not in made:
            os.makedirs(d, exist_ok=True)
            made.add(d)
        marker = os.path.join(d, i + ".p500.g0.x-0-0")
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    if durable:
        syncfs()  # the batch's markers and renames
"""


#: runs the flow CLI in this interpreter; at exit writes the manager's own rusage and that
#: of the children it reaped (argv: OUT.json, then the flow arguments)
RUSAGE_SCRIPT = """
import atexit, json, resource, sys

out = sys.argv[1]
sys.argv = ["flow", *sys.argv[2:]]

def dump():
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(out, "w") as fh:
        json.dump({"self_cpu": s.ru_utime + s.ru_stime, "self_maxrss_kb": s.ru_maxrss,
                   "children_cpu": c.ru_utime + c.ru_stime}, fh)

atexit.register(dump)
from httk_flow.cli.main import main
main()
"""
