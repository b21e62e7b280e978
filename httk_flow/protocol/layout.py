"""Where things are: every path under a workspace's .flow/ and inside a job directory, and
every FLOW_* environment variable name (docs/protocol.md §1, §9).

Pure functions of strings: a workspace root, a job directory, an attempt directory. They
touch no filesystem; `Workspace` keeps the ones it needs on every call precomputed. The
names of temporaries inside .flow/tmp/ are their makers' own (a nonce each).
"""

from __future__ import annotations

import os

# -- environment variables ------------------------------------------------------------

#: the workspace to use when no -w PATH is given
ENV_WORKSPACE = "FLOW_WORKSPACE"
#: a named crash point for the crash tests: <point>[:<nth>]
ENV_CRASH_AT = "FLOW_CRASH_AT"
#: the token of the allocation a manager runs in (it names it in its heartbeat)
ENV_ALLOCATION_TOKEN = "FLOW_ALLOCATION_TOKEN"
#: when the allocation a manager runs in ends (unix seconds): it drains to end by then
ENV_ALLOCATION_END = "FLOW_ALLOCATION_END"
#: the batch job a manager runs in, BACKEND:ID (its heartbeat names it; `flow serve` sets
#: it when a backend recognises its allocation)
ENV_ALLOCATION_ID = "FLOW_ALLOCATION_ID"
#: the text of context.json, handed to the launcher to write (unset before the exec)
ENV_LAUNCH_CONTEXT = "FLOW_LAUNCH_CONTEXT"
#: the arguments of shell/flow-gate.sh (bash sources it as BASH_ENV), unset before the
#: program's first line: output files, context.json, workdir, where it says it cannot run
GATE_OUT = "_FLOW_GATE_OUT"
GATE_ERR = "_FLOW_GATE_ERR"
GATE_CTX = "_FLOW_GATE_CTX"
GATE_CWD = "_FLOW_GATE_CWD"
GATE_FAIL = "_FLOW_GATE_FAIL"
#: what an attempt's program is told: the workspace root
ENV_WORKSPACE_DIR = "FLOW_WORKSPACE_DIR"
#: the job directory
ENV_JOB_DIR = "FLOW_JOB_DIR"
#: the job's id
ENV_JOB_ID = "FLOW_JOB_ID"
#: the job's key ([<tag>--]<id>)
ENV_JOB_KEY = "FLOW_JOB_KEY"
#: the step to run
ENV_STEP = "FLOW_STEP"
#: the attempt's directory name (aNNNN)
ENV_ATTEMPT_ID = "FLOW_ATTEMPT_ID"
#: the try of this activation (1-based)
ENV_ATTEMPT = "FLOW_ATTEMPT"
#: the attempt directory: context.json, outcome publication, output
ENV_CONTROL_DIR = "FLOW_CONTROL_DIR"
#: the directory the program starts in
ENV_WORKDIR = "FLOW_WORKDIR"
#: the path of the attempt's context.json
ENV_CONTEXT = "FLOW_CONTEXT"
#: how the previous try of this activation ended, on a restart
ENV_PREVIOUS_END = "FLOW_PREVIOUS_END"
#: "1" when this attempt restarts an earlier one
ENV_IS_RESTART = "FLOW_IS_RESTART"
#: "1" when the earlier attempt was interrupted rather than ended
ENV_UNCLEAN_RESTART = "FLOW_UNCLEAN_RESTART"
#: "1" in a durable workspace: the program's API fsyncs what it publishes
ENV_DURABLE = "FLOW_DURABLE"
#: the path of the bash API (flow.sh) to source
ENV_BASH_API = "FLOW_BASH_API"
#: the Python interpreter of the manager
ENV_PYTHON = "FLOW_PYTHON"
#: the job's --array index, when it has one
ENV_ARRAY_INDEX = "FLOW_ARRAY_INDEX"
#: the absolute path the job's program was submitted from (a stored copy runs instead)
ENV_PROGRAM_SOURCE = "FLOW_PROGRAM_SOURCE"
#: the stored tree a bundled program runs inside (flow submit --bundle)
ENV_BUNDLE_DIR = "FLOW_BUNDLE_DIR"
#: FLOW_PARAM_<name>: one job parameter, as a string
ENV_PARAM_PREFIX = "FLOW_PARAM_"


def env_param(name: str) -> str:
    """The environment variable that carries job parameter `name`."""
    return ENV_PARAM_PREFIX + name


#: the attempt's own resources (docs/bash-api.md, "Resources"): how many CPUs, their ids,
#: its GPU ids, its memory in megabytes (when the job stated one)
ENV_CPUS = "FLOW_CPUS"
ENV_CPU_LIST = "FLOW_CPU_LIST"
ENV_GPUS = "FLOW_GPUS"
ENV_MEM = "FLOW_MEM"
#: FLOW_RESOURCE_<NAME>: how many units of a site-defined resource the attempt holds
ENV_RESOURCE_PREFIX = "FLOW_RESOURCE_"
#: a node-local directory for the ledger of held GPUs and pinned CPUs (manager/devices.py)
ENV_DEVICE_LEDGER = "FLOW_DEVICE_LEDGER_DIR"


def env_resource(name: str) -> str:
    """The variable that carries the attempt's units of resource `name` (upper case,
    `-` as `_`, so a shell can name it)."""
    return ENV_RESOURCE_PREFIX + name.upper().replace("-", "_")


# -- the workspace's .flow/ directory --------------------------------------------------

FLOW_DIR = ".flow"
_FORMAT = "format.json"
_STATE = "state"
_TMP = "tmp"
_PROGRAMS = "programs"
_BUNDLES = "bundles"
_CLASSES = "classes"
_GROUPS = "groups"
_MANAGERS = "managers"
_REQUESTS = "requests"
_JOURNAL = "journal"
_ALLOCATIONS = "allocations"
#: in .flow/allocations/: the queue is paused (why, since when) / when it was last unpaused
ALLOC_PAUSED = "paused.json"
ALLOC_UNPAUSED = "unpaused.json"


def flow_dir(root: str) -> str:
    """The workspace's own directory: everything that is not a job's payload."""
    return os.path.join(root, FLOW_DIR)


def format_file(root: str) -> str:
    """format.json: format, version, workspace id, policy."""
    return os.path.join(root, FLOW_DIR, _FORMAT)


def init_dirs(root: str) -> tuple[str, ...]:
    """The directories `flow init` makes under .flow/ besides the state tree."""
    return tuple(
        os.path.join(root, FLOW_DIR, d)
        for d in (_TMP, _PROGRAMS, _MANAGERS, _REQUESTS, _JOURNAL, _ALLOCATIONS)
    )


def state_root(root: str) -> str:
    """The state tree: one directory per state kind, holding every job's one marker."""
    return os.path.join(root, FLOW_DIR, _STATE)


def state_dir(root: str, kind: str, placement: str = "") -> str:
    """The markers of one state kind, or of one placement within it."""
    base = os.path.join(state_root(root), kind)
    return os.path.join(base, placement) if placement else base


def state_marker(tree: str, kind: str, placement: str, marker: str, cls_dir: str = "") -> str:
    """A marker's path from a state root `tree`, in class directory `cls_dir` (hot)."""
    if cls_dir:  # placements are validated relative paths, never empty
        return f"{tree}/{kind}/{placement}/{cls_dir}/{marker}"
    return f"{tree}/{kind}/{placement}/{marker}"


def marker_path(root: str, kind: str, placement: str, marker: str, cls_dir: str = "") -> str:
    """Where a job's marker lies while the job is in state `kind`."""
    return state_marker(state_root(root), kind, placement, marker, cls_dir)


def tmp_dir(root: str) -> str:
    """Payloads and files under construction, published from here by rename."""
    return os.path.join(root, FLOW_DIR, _TMP)


def programs_dir(root: str) -> str:
    """The program store: stored executables by content digest."""
    return os.path.join(root, FLOW_DIR, _PROGRAMS)


def program_path(root: str, digest: str) -> str:
    """One stored executable, named by its sha256."""
    return os.path.join(programs_dir(root), digest)


def bundles_dir(root: str) -> str:
    """The bundle store: stored program trees by tree digest (made at the first bundle)."""
    return os.path.join(root, FLOW_DIR, _BUNDLES)


def bundle_dir(root: str, digest: str) -> str:
    """One stored tree, named by its tree digest (docs/protocol.md §6)."""
    return os.path.join(bundles_dir(root), digest)


def classes_dir(root: str) -> str:
    """Service classes, one file per (pool, capabilities)."""
    return os.path.join(root, FLOW_DIR, _CLASSES)


def class_file(root: str, class_id: str) -> str:
    """One service class: its pool and capabilities."""
    return os.path.join(classes_dir(root), f"{class_id}.json")


def groups_dir(root: str) -> str:
    """Job groups, one file per group digest (the marker's `s` field)."""
    return os.path.join(root, FLOW_DIR, _GROUPS)


def group_file(root: str, digest: str) -> str:
    """.flow/groups/<digest>.json: the group's name, when it was made and by whom."""
    return os.path.join(groups_dir(root), f"{digest}.json")


def managers_dir(root: str) -> str:
    """One directory per manager that ever ran here."""
    return os.path.join(root, FLOW_DIR, _MANAGERS)


def manager_dir(root: str, manager_id: str) -> str:
    """One manager's directory: its heartbeat, and `stopped` after a clean exit."""
    return os.path.join(managers_dir(root), manager_id)


def heartbeat_file(manager_dir: str) -> str:
    """A manager's heartbeat (its lease), in its manager directory."""
    return os.path.join(manager_dir, "heartbeat.json")


def stopped_file(manager_dir: str) -> str:
    """Made by a manager that exits cleanly: its lease ends at once."""
    return os.path.join(manager_dir, "stopped")


def requests_dir(root: str) -> str:
    """Operator requests: new/, claimed/<manager>/, done/."""
    return os.path.join(root, FLOW_DIR, _REQUESTS)


def requests_new(root: str) -> str:
    """Requests not yet claimed."""
    return os.path.join(requests_dir(root), "new")


def requests_claimed(root: str, manager: str = "") -> str:
    """Claimed requests, or those claimed by one manager."""
    base = os.path.join(requests_dir(root), "claimed")
    return os.path.join(base, manager) if manager else base


def requests_done(root: str) -> str:
    """Retirement records of requests: applied, or why never."""
    return os.path.join(requests_dir(root), "done")


def journal_dir(root: str) -> str:
    """The journal: one directory of segments per writer process."""
    return os.path.join(root, FLOW_DIR, _JOURNAL)


def writer_dir(journal_dir: str, writer: str) -> str:
    """One writer's segments."""
    return os.path.join(journal_dir, writer)


def segment_name(n: int) -> str:
    """The file name of a writer's segment n."""
    return f"{n}.jsonl"


def segment_number(name: str) -> int | None:
    """The number of a segment by its file name; None when it names no segment."""
    stem = name.removesuffix(".jsonl")
    return int(stem) if stem.isdigit() else None


def segment_path(journal_dir: str, writer: str, n: int) -> str:
    """Segment n of one writer."""
    return os.path.join(journal_dir, writer, segment_name(n))


def maintenance_file(root: str) -> str:
    """The maintenance lock, present while it is held."""
    return os.path.join(root, FLOW_DIR, "maintenance.json")


def fsck_lock(root: str) -> str:
    """The lock one `flow fsck` or `flow gc` on a host holds."""
    return os.path.join(root, FLOW_DIR, "fsck.lock")


def lost_found(root: str) -> str:
    """Where `flow fsck --repair` moves what it cannot put back."""
    return os.path.join(root, FLOW_DIR, "lost+found")


def batches_dir(root: str) -> str:
    """Bulk submission records: one per batch id (made on first use)."""
    return os.path.join(root, FLOW_DIR, "batches")


def batch_file(root: str, key: str) -> str:
    """The record of one bulk submission, by its batch id."""
    return os.path.join(batches_dir(root), f"{key}.json")


def allocations_dir(root: str) -> str:
    """The reconciler's records: one per allocation, the pause, its lease."""
    return os.path.join(root, FLOW_DIR, _ALLOCATIONS)


def allocation_file(root: str, token: str) -> str:
    """The record of one allocation, by its token."""
    return os.path.join(allocations_dir(root), f"{token}.json")


def allocations_paused(root: str) -> str:
    """Present while the allocation queue is paused: why, and since when."""
    return os.path.join(allocations_dir(root), ALLOC_PAUSED)


def allocations_unpaused(root: str) -> str:
    """When the allocation queue was last unpaused."""
    return os.path.join(allocations_dir(root), ALLOC_UNPAUSED)


def reconciler_lease(root: str) -> str:
    """The one reconciler's lease."""
    return os.path.join(allocations_dir(root), "reconciler.lease")


def allocation_logs(root: str) -> str:
    """The output of manager allocations."""
    return os.path.join(allocations_dir(root), "logs")


def local_allocations(root: str) -> str:
    """The local backend's submission records."""
    return os.path.join(allocations_dir(root), "local")


def local_allocation_file(root: str, token: str) -> str:
    """The local backend's record of one allocation: pid and start time."""
    return os.path.join(local_allocations(root), f"{token}.json")


# -- a job directory ---------------------------------------------------------------------

_JOB_FILE = "job.json"
_FILES = "files"
_RUN = "run"
_ATTEMPTS = "attempts"
#: entries of a job directory that are never child job directories (nor is an aNNNN/)
JOB_INTERNALS = frozenset({_ATTEMPTS, _RUN, _FILES})


def job_dir(root: str, placement: str, key: str) -> str:
    """A job's directory: its payload, attempts and children."""
    return os.path.join(root, placement, key)


def job_file(job_dir: str) -> str:
    """job.json: the immutable job definition."""
    return os.path.join(job_dir, _JOB_FILE)


def files_dir(job_dir: str) -> str:
    """Inputs copied at submission."""
    return os.path.join(job_dir, _FILES)


def run_dir(job_dir: str) -> str:
    """The persistent workdir, reused by every attempt."""
    return os.path.join(job_dir, _RUN)


def attempts_dir(job_dir: str) -> str:
    """Where protocol revisions up to 5 made the attempt directories: read, never made."""
    return os.path.join(job_dir, _ATTEMPTS)


def attempt_name(n: int) -> str:
    """The directory name of a job's attempt number n (1-based)."""
    return f"a{n:04d}"


def is_attempt_name(name: str) -> bool:
    """Whether a name (in a job directory, or in attempts/) is an attempt's: aNNNN."""
    digits = name[1:]
    return name[:1] == "a" and len(digits) >= 4 and digits.isascii() and digits.isdigit()


def attempt_number(name: str) -> int:
    """The number of an attempt by its name (is_attempt_name holds)."""
    return int(name[1:])


def attempt_dir(job_dir: str, n: int) -> str:
    """Attempt n's directory (revision 6; jobs.find_attempt_dir also finds those of 5):
    derived from the number, never read from a frame."""
    return os.path.join(job_dir, attempt_name(n))


def kept_output(job_dir: str, n: int, name: str) -> str:
    """aNNNN.stdout / aNNNN.stderr: an output file that tidying moved up (§10)."""
    return os.path.join(job_dir, f"{attempt_name(n)}.{name}")


# -- an attempt directory ----------------------------------------------------------------

#: the published outcome: a directory renamed into place once
OUTCOME_DIR = "outcome.ready"
#: the outcome written in place by the runner itself (protocol 2, §10): one JSON object
#: on one line, created exclusively; whole only when it ends in a newline
OUTCOME_LINE = "outcome.line"
#: a second publication beside outcome.line is said here: the job fails
OUTCOME_AGAIN = "outcome.duplicate"
#: in an outcome directory: the outcome, and a wait's children
OUTCOME_FILE = "outcome.json"
CHILDREN_FILE = "children.jsonl"


def work_dir(attempt_dir: str) -> str:
    """The workdir of an attempt of a job without a persistent one."""
    return os.path.join(attempt_dir, "work")


def context_file(attempt_dir: str) -> str:
    """context.json: what the attempt is (step, try, restart, params, ...)."""
    return os.path.join(attempt_dir, "context.json")


def children_list(attempt_dir: str) -> str:
    """After a join: `label id state path` per child, a line each."""
    return os.path.join(attempt_dir, "children")


def stdout_file(attempt_dir: str) -> str:
    """The program's standard output."""
    return os.path.join(attempt_dir, "stdout")


def stderr_file(attempt_dir: str) -> str:
    """The program's standard error."""
    return os.path.join(attempt_dir, "stderr")


def exec_failed_file(attempt_dir: str) -> str:
    """Written by the launcher when it cannot execute the program (protocol.md §9)."""
    return os.path.join(attempt_dir, "exec.failed")


def outcome_ready(attempt_dir: str) -> str:
    """The published outcome directory."""
    return os.path.join(attempt_dir, OUTCOME_DIR)


def outcome_line(attempt_dir: str) -> str:
    """The outcome written in place (one line, created exclusively)."""
    return os.path.join(attempt_dir, OUTCOME_LINE)


def outcome_again(attempt_dir: str) -> str:
    """Beside outcome.line: what a second publication was (the job fails)."""
    return os.path.join(attempt_dir, OUTCOME_AGAIN)


def outcome_tmp(attempt_dir: str, nonce: str) -> str:
    """An outcome directory a runner builds before renaming it to outcome.ready."""
    return os.path.join(attempt_dir, f"outcome.tmp.{nonce}")


def outcome_file(outcome_dir: str) -> str:
    """outcome.json in an outcome directory."""
    return os.path.join(outcome_dir, OUTCOME_FILE)


def children_file(outcome_dir: str) -> str:
    """children.jsonl (a wait's children) in an outcome directory."""
    return os.path.join(outcome_dir, CHILDREN_FILE)


def duplicate_file(outcome_dir: str) -> str:
    """Made in outcome.ready by a runner that published twice: a protocol error."""
    return os.path.join(outcome_dir, "duplicate")


def after_dir(root: str) -> str:
    """Dependency sets (`flow submit --after`), one directory each (protocol.md §14)."""
    return os.path.join(root, FLOW_DIR, "after")


def after_set_dir(root: str, set_id: str) -> str:
    """One dependency set: set.json, pending/, ended/, dependents, broken, released."""
    return os.path.join(after_dir(root), set_id)


def watch_dir(root: str) -> str:
    """Which sets wait for a job: watch/<member key>/<set>.<policy>, while it has not ended."""
    return os.path.join(root, FLOW_DIR, "watch")


def watch_member(root: str, key: str) -> str:
    """The sets one job's end is counted in."""
    return os.path.join(watch_dir(root), key)


def after_hint(job_dir: str) -> str:
    """`<state> <marker>` of a dependent with unmet dependencies: a hint for its releaser."""
    return os.path.join(job_dir, ".after-marker")
