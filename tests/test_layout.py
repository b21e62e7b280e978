"""layout: the paths the protocol documents (docs/protocol.md §1) come from one module,
and so do the FLOW_* environment variable names; a scan keeps it that way."""

from __future__ import annotations

import pathlib
import re

import pytest

from httk_flow.protocol import layout, logstream
from httk_flow.protocol.jobs import find_attempt_dir
from httk_flow.protocol.names import Marker, class_dir
from httk_flow.protocol.states import State
from httk_flow.protocol.workspace import Workspace

ROOT = pathlib.Path(__file__).resolve().parent.parent
PKG = ROOT / "httk_flow"
WS = "<ws>"
JOB = layout.job_dir(WS, "<placement>", "<job-key>")
ATTEMPT = "<attempt>"

#: every path docs/protocol.md §1 lists, as layout builds it (a trailing / marks a directory)
DOCUMENTED = {
    layout.format_file(WS),
    layout.marker_path(WS, "<kind>", "<placement>", "<marker>"),
    layout.marker_path(WS, "ready", "<placement>", "<marker>", class_dir("<class>")),
    layout.segment_path(layout.journal_dir(WS), "<writer>", 0).replace("/0.", "/<n>."),
    f"{logstream.writer_dir(WS, '<writer>')}/{logstream.segment_name(0)}".replace("/0.", "/<n>."),
    layout.program_path(WS, "<sha256>"),
    layout.bundle_dir(WS, "<sha256>") + "/",
    layout.class_file(WS, "<class>"),
    layout.heartbeat_file(layout.manager_dir(WS, "<id>")),
    layout.stopped_file(layout.manager_dir(WS, "<id>")),
    layout.tmp_dir(WS) + "/",
    layout.batch_file(WS, "<batch>"),
    layout.maintenance_file(WS),
    layout.fsck_lock(WS),
    layout.lost_found(WS) + "/",
    layout.requests_new(WS) + "/<request>",
    layout.requests_claimed(WS, "<manager>") + "/<request>",
    layout.requests_done(WS) + "/<request>",
    layout.allocations_dir(WS) + "/",
    layout.allocation_file(WS, "<token>"),
    layout.reconciler_lease(WS),
    layout.allocations_paused(WS),
    layout.allocations_unpaused(WS),
    layout.allocation_logs(WS) + "/",
    layout.local_allocation_file(WS, "<token>"),
    layout.group_file(WS, "<digest>"),
    layout.after_set_dir(WS, "<set>") + "/",
    layout.watch_member(WS, "<key>") + "/",
    layout.after_hint(JOB),
    layout.job_file(JOB),
    layout.files_dir(JOB) + "/",
    layout.run_dir(JOB) + "/",
    layout.kept_output(JOB, 1, "stdout").replace("a0001", "aNNNN"),
    layout.kept_output(JOB, 1, "stderr").replace("a0001", "aNNNN"),
    layout.attempt_dir(JOB, 1).replace("a0001", "aNNNN") + "/",
    layout.attempts_dir(JOB) + "/aNNNN/",
    layout.job_dir(JOB, "", "<child-key>") + "/",
    layout.context_file(ATTEMPT),
    layout.stdout_file(ATTEMPT),
    layout.stderr_file(ATTEMPT),
    layout.exec_failed_file(ATTEMPT),
    layout.work_dir(ATTEMPT) + "/",
    layout.children_list(ATTEMPT),
    layout.outcome_line(ATTEMPT),
    layout.outcome_again(ATTEMPT),
    layout.outcome_file(layout.outcome_ready(ATTEMPT)),
    layout.children_file(layout.outcome_ready(ATTEMPT)),
}


def _documented_paths() -> set[str]:
    text = (ROOT / "docs" / "protocol.md").read_text()
    section = text.split("## 1. Layout", 1)[1].split("\n## ", 1)[0]
    block = section.split("```", 2)[1]
    return {line.split()[0] for line in block.splitlines() if line.strip()}


def test_the_protocol_documents_exactly_the_paths_layout_builds() -> None:
    documented = _documented_paths()
    assert documented - DOCUMENTED == set(), "documented, but not what layout builds"
    assert DOCUMENTED - documented == set(), "built by layout, but not documented"


def test_an_attempt_is_found_where_its_revision_made_it(tmp_path: pathlib.Path) -> None:
    """aNNNN/ beside job.json (revision 6), else attempts/aNNNN/ (revisions up to 5), never
    through a linked attempts/; the revision-6 place when neither exists."""
    job = tmp_path / "k"
    (job / "attempts" / "a0001").mkdir(parents=True)
    (job / "a0002").mkdir()
    (job / "attempts" / "a0003").mkdir()
    (job / "a0003").mkdir()
    assert find_attempt_dir(str(job), 1) == str(job / "attempts" / "a0001")
    assert find_attempt_dir(str(job), 2) == str(job / "a0002")
    assert find_attempt_dir(str(job), 3) == str(job / "a0003")
    assert find_attempt_dir(str(job), 4) == str(job / "a0004")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "attempts").symlink_to(job / "attempts")
    assert find_attempt_dir(str(linked), 1) == str(linked / "a0001")


def test_the_paths_are_the_ones_on_disk() -> None:
    assert layout.state_dir("/w", "ready") == "/w/.flow/state/ready"
    assert layout.state_dir("/w", "ready", "jobs/ab") == "/w/.flow/state/ready/jobs/ab"
    assert layout.attempt_dir("/w/jobs/ab/k", 12) == "/w/jobs/ab/k/a0012"
    assert find_attempt_dir("/w/jobs/ab/k", 12) == "/w/jobs/ab/k/a0012"  # neither exists
    assert layout.attempts_dir("/w/jobs/ab/k") == "/w/jobs/ab/k/attempts"
    assert layout.attempt_dir("/w/k", 12345) == "/w/k/a12345"
    names = ("a0001", "a12345", "a0000")
    assert all(layout.is_attempt_name(n) for n in names)
    for not_one in ("a", "a1", "a001", "a0001.stdout", "a\u0661\u0662\u0663\u0664", "b0001", "run"):
        assert not layout.is_attempt_name(not_one), not_one
    assert layout.kept_output("/w/jobs/ab/k", 3, "stderr") == "/w/jobs/ab/k/a0003.stderr"
    assert layout.outcome_line("/a") == "/a/outcome.line"
    assert layout.outcome_again("/a") == "/a/outcome.duplicate"
    assert layout.outcome_tmp("/a", "1.ff") == "/a/outcome.tmp.1.ff"
    assert layout.duplicate_file(layout.outcome_ready("/a")) == "/a/outcome.ready/duplicate"
    assert layout.requests_claimed("/w") == "/w/.flow/requests/claimed"
    assert layout.local_allocations("/w") == "/w/.flow/allocations/local"
    subs = ("tmp", "programs", "managers", "requests", "journal", "allocations")
    assert layout.init_dirs("/w") == tuple(f"/w/.flow/{d}" for d in subs)
    assert layout.env_param("x") == "FLOW_PARAM_x"


@pytest.mark.parametrize("n", [1, 9, 10, 9999, 10000])
def test_attempt_names_read_back(n: int) -> None:
    name = layout.attempt_name(n)
    assert layout.is_attempt_name(name) and layout.attempt_number(name) == n
    assert layout.segment_number(layout.segment_name(n)) == n


@pytest.mark.parametrize("name", ["", "a", "b0001", "a00x1", "context.json"])
def test_other_entries_are_no_attempts(name: str) -> None:
    assert not layout.is_attempt_name(name)


def test_workspace_paths_are_layouts(tmp_path: pathlib.Path) -> None:
    ws = Workspace.create(str(tmp_path / "w"))
    root = ws.root
    assert ws.flow == layout.flow_dir(root)
    assert (ws.state_root, ws.tmp, ws.journal_dir) == (
        layout.state_root(root),
        layout.tmp_dir(root),
        layout.journal_dir(root),
    )
    assert (ws.programs, ws.managers, ws.requests) == (
        layout.programs_dir(root),
        layout.managers_dir(root),
        layout.requests_dir(root),
    )
    marker = Marker.from_name(f"{'a' * 32}.p500.g0.w1-0-0")
    assert ws.marker_path(State.READY, "jobs/aa", marker) == layout.marker_path(
        root, "ready", "jobs/aa", marker.name
    )
    assert ws.state_dir(State.READY, "jobs/aa") == layout.state_dir(root, "ready", "jobs/aa")
    assert ws.job_dir("jobs/aa", "k") == layout.job_dir(root, "jobs/aa", "k")
    for d in layout.init_dirs(root):
        assert pathlib.Path(d).is_dir()


# -- the rule, as a scan of the package source ---------------------------------------------

#: files the scan skips: layout itself
EXEMPT = ("protocol/layout.py",)
#: lines where a layout word is a command's name (`flow allocations`), not a path: its
#: click declaration, and cli/main.py's tables of command names (the registry and the
#: help's sections)
COMMAND_NAME = re.compile(
    r"""click\.command\(|^\s*"[a-z-]+": "cmd_\w+:\w+",$|^\s*"[A-Z][a-z]+": \(("[a-z-]+",? ?)+\),$"""
)
#: a JSON member read by name (`d.get("attempts", 0)`: a count in a heartbeat), not a path
KEY_READ = re.compile(r"""\.get\(\s*["'](?:attempts|allocations)["']""")
#: an environment name as a string literal ("FLOW_X", f"FLOW_X_{k}"), or as a keyword
#: argument (dict(FLOW_X=...), env.update(FLOW_X=...))
ENV_LITERAL = re.compile(r"""["']FLOW_[A-Z_]|\bFLOW_[A-Z_]+=(?!=)""")
#: a path component layout owns, quoted or between slashes in a string ("attempts",
#: f"{d}/.flow/x", "a/allocations/b"); a quoted dict key ("attempts": n) is no path
PATH_LITERAL = re.compile(
    r"""(?<=["'/])(?:\.flow|allocations|attempts|job\.json|format\.json|heartbeat\.json"""
    r"""|context\.json|outcome\.json|children\.jsonl|outcome\.ready|reconciler\.lease"""
    r"""|maintenance\.json|fsck\.lock|u?n?paused\.json)(?=["'/])(?!["']\s*:)"""
)
#: prose names paths freely: docstrings and other triple-quoted strings, and comments
PROSE = re.compile(r'"""[\s\S]*?"""|\'\'\'[\s\S]*?\'\'\'|#[^\n]*')


def _offences(pattern: re.Pattern[str]) -> list[str]:
    found = []
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG).as_posix()
        if rel.startswith(EXEMPT):
            continue
        code = PROSE.sub(lambda m: "\n" * m.group().count("\n"), p.read_text())
        for i, line in enumerate(code.splitlines(), 1):
            if pattern.search(line) and not (COMMAND_NAME.search(line) or KEY_READ.search(line)):
                found.append(f"{rel}:{i}: {line.strip()}")
    return found


def test_no_flow_environment_name_is_spelt_outside_layout() -> None:
    assert _offences(ENV_LITERAL) == []


def test_no_layout_path_component_is_joined_outside_layout() -> None:
    assert _offences(PATH_LITERAL) == []


def test_the_scan_sees_what_it_forbids() -> None:
    """The patterns catch the spellings they are for (a regex that matches nothing passes
    every scan)."""
    for bad in (
        'env["FLOW_JOB_DIR"] = d',
        'env[f"FLOW_PARAM_{k}"] = v',
        "env.update(FLOW_STEP=step)",
        "os.environ.get('FLOW_CRASH_AT')",
    ):
        assert ENV_LITERAL.search(bad), bad
    for fine in ("x = layout.ENV_JOB_DIR", 'f"export {name}=1"', "FLOW_DIR == d"):
        assert not ENV_LITERAL.search(fine), fine
    for bad in (
        'os.path.join(job_dir, "attempts", name)',
        'os.path.join(ws.flow, "allocations", "logs")',
        'f"{root}/.flow/state"',
        'os.path.join(d, "job.json")',
        'os.path.join(self.dir, "paused.json")',
    ):
        assert PATH_LITERAL.search(bad), bad
    for fine in ('{"attempts": self.attempts}', '"is not a workspace (no .flow/format.json)"'):
        assert not PATH_LITERAL.search(fine), fine
