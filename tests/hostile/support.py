"""Helpers of the hostile-input tests: a job script that publishes bad outcomes on request,
one `flow run` over a scene, hand-planted journal frames, and snapshots of directories that
must stay untouched."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import orjson
from manager.support import JobInfo, Managers, OrphanReaper, job

from httk_flow.errors import JobNotFound
from httk_flow.ops import lookup
from httk_flow.protocol import jobs
from httk_flow.protocol.journal import segment_name
from httk_flow.protocol.names import Marker, RecordRef
from httk_flow.protocol.states import State
from httk_flow.protocol.transition import JobHandle
from httk_flow.protocol.workspace import Workspace

#: the writer id of frames planted by hand (never a real writer's: those are random base36)
PLANTED_WRITER = "hostileplanted"

#: a job script (after manager.support.PRELUDE): its first attempt does what $FLOW_PARAM_mode
#: says, every later attempt simply succeeds
HOSTILE = r"""
# outside an attempt (the variable unset or empty) stop here, before any mkdir or mv:
# "$d/outcome.ready" would otherwise be /outcome.ready
d="${FLOW_CONTROL_DIR:?not inside an attempt}"
out="${FLOW_PARAM_out:-/nonexistent}"
# raw NAME: outcome.tmp with outcome.json holding stdin, published as outcome.ready
raw() { mkdir "$d/t"; cat > "$d/t/outcome.json"; }
pub() { mv "$d/t" "$d/outcome.ready"; }
if [ "$FLOW_ATTEMPT_ID" != a0001 ]; then
    publish '{"action":"succeed","message":"later"}'
    exit 0
fi
case "${FLOW_PARAM_mode:-good}" in
good) publish '{"action":"succeed","message":"good"}' ;;
exit0) exit 0 ;;
garbage) printf '\000\377{{not json' | raw; pub ;;
big) { printf '{"action":"succeed","message":"'; head -c 2000000 /dev/zero | tr '\0' x;
       printf '"}'; } | raw; pub ;;
action_int) publish '{"action":5}' ;;
step_int) publish '{"action":"advance","step":7}' ;;
code_list) publish '{"action":"fail","code":["x"]}' ;;
message_obj) publish '{"action":"succeed","message":{"a":1}}' ;;
join_bad) publish '{"action":"wait","step":"two","join":"sometimes"}' '{"label":"a"}' ;;
no_json) mkdir "$d/t"; pub ;;
ready_file) echo '{"action":"succeed"}' > "$d/outcome.ready" ;;
duplicate) printf '{"action":"succeed"}' | raw; : > "$d/t/duplicate"; pub ;;
children_garbage) publish '{"action":"wait","step":"two"}' 'not json at all' ;;
children_none) publish '{"action":"wait","step":"two"}' '' ;;
children_dup) publish '{"action":"wait","step":"two"}' '{"label":"a"}
{"label":"a"}' ;;
children_label_dotdot) publish '{"action":"wait","step":"two"}' '{"label":"../x"}' ;;
children_tag_slash) publish '{"action":"wait","step":"two"}' '{"label":"a","tag":"../x"}' ;;
children_tag_int) publish '{"action":"wait","step":"two"}' '{"label":"a","tag":7}' ;;
children_step_int) publish '{"action":"wait","step":"two"}' '{"label":"a","step":5}' ;;
ready_link) ln -s "$out" "$d/outcome.ready" ;;
json_link) mkdir "$d/t"; ln -s "$out/outcome.json" "$d/t/outcome.json"; pub ;;
children_link) printf '{"action":"wait","step":"two"}' | raw
               ln -s "$out/children.jsonl" "$d/t/children.jsonl"; pub ;;
spawn_dotdot)
    # shellcheck disable=SC1090
    source "$FLOW_BASH_API"
    flow_spawn --label '../x'
    flow_wait two ;;
python_spawn_dotdot)
    exec "$FLOW_PYTHON" - <<'PY'
from httk_flow.runner import Runner
flow = Runner()
@flow.step
def main(flow):
    flow.spawn(label="../x")
    flow.wait("two")
raise SystemExit(flow.run())
PY
    ;;
*) exit 3 ;;
esac
"""


def run_scene(base: Path, root: str, timeout: float) -> tuple[int, str]:
    """One `flow run` (two workers) over the workspace `root`, its log and its orphans kept
    under `base`, all of its processes gone afterwards: its exit status and its log."""
    with OrphanReaper():
        managers = Managers(base)
        try:
            p = managers.start(root, workers=2)
            rc = p.wait(timeout)
            assert p.log is not None
            return rc, p.log.read_text(errors="replace")
        finally:
            managers.close()


#: lines a manager prints for a problem it reports (quiet managers print these too)
PROBLEM = re.compile(r"problem: (?P<obj>\S+?): (?P<msg>.*)$", re.M)


def problems(log: str) -> list[tuple[str, str]]:
    """(object, message) of every problem line of a manager log."""
    return [(m.group("obj"), m.group("msg")) for m in PROBLEM.finditer(log)]


def snapshot(directory: Path) -> dict[str, tuple[int, int, bool]]:
    """Every entry under `directory` (not followed): relative path -> (size, mtime_ns, link)."""
    out: dict[str, tuple[int, int, bool]] = {}
    for d, dirs, files in os.walk(directory):
        for name in [*dirs, *files]:
            p = os.path.join(d, name)
            st = os.lstat(p)
            out[os.path.relpath(p, directory)] = (
                st.st_size,
                st.st_mtime_ns,
                os.path.islink(p),
            )
    return out


def handle_of(ws: Workspace, job_id: str) -> JobHandle:
    return lookup.find(ws, job_id)


def job_json(root: str, ws: Workspace, job_id: str) -> Path:
    h = handle_of(ws, job_id)
    return Path(ws.job_dir(h.placement, h.key)) / "job.json"


def segment_path(ws: Workspace, ref: RecordRef) -> str:
    return os.path.join(ws.journal_dir, ref.writer, segment_name(ref.segment))


def plant_frame(ws: Workspace, job: JobHandle, state: State, **members: Any) -> JobHandle:
    """Move `job` to `state` by hand, its new marker naming a frame written here.

    The frame is a well-formed successor of the job's current frame with `members` on
    top: what a buggy or hostile writer could leave in the journal.
    """
    current = ws.reader.read(job.marker.ref)
    frame = {
        "job": job.job_id,
        "key": job.key,
        "placement": job.placement,
        "from": job.state.value,
        "to": state.value,
        "gen": job.marker.generation + 1,
        "prev": str(job.marker.ref),
        "t": current.get("t", 0),
        "by": "hostile",
        **{k: current[k] for k in ("step", "act", "try", "tries") if k in current},
        **members,
    }
    d = os.path.join(ws.journal_dir, PLANTED_WRITER)
    os.makedirs(d, exist_ok=True)
    seg = os.path.join(d, segment_name(0))
    with open(seg, "ab") as fh:
        offset = fh.tell()
        fh.write(orjson.dumps(frame) + b"\n")
    new = JobHandle(
        state, job.placement, job.marker.successor(RecordRef(PLANTED_WRITER, 0, offset))
    )
    os.makedirs(os.path.dirname(new.path(ws)), exist_ok=True)
    os.rename(job.path(ws), new.path(ws))
    return new


def rename_marker(ws: Workspace, job: JobHandle, marker: Marker) -> JobHandle:
    """Give a job's marker another name by hand (same state, same placement)."""
    new = JobHandle(job.state, job.placement, marker)
    os.rename(job.path(ws), new.path(ws))
    return new


def current(root: str, ident: str) -> tuple[JobHandle, dict[str, Any]]:
    """A job's handle and the frame its marker names (its history may be unreadable)."""
    ws = Workspace.open(root)
    try:
        h = lookup.find(ws, ident)
        return h, ws.reader.read(h.marker.ref)
    finally:
        ws.close()


def handles(root: str) -> list[JobHandle]:
    """Every job's marker (no frame read: some histories are damaged on purpose)."""
    ws = Workspace.open(root)
    try:
        return list(jobs.all_jobs(ws))
    finally:
        ws.close()


def job_now(root: str, ident: str, tries: int = 50) -> JobInfo:
    """manager.support.job for a job a manager may be moving right now.

    lookup.find lists the state kinds one after another, so a job that moves between two
    listings is found twice and refused as ambiguous (see test_find_while_moving.py):
    look again, as a user would.
    """
    for _ in range(tries - 1):
        try:
            return job(root, ident)
        except JobNotFound:
            time.sleep(0.02)
    return job(root, ident)
