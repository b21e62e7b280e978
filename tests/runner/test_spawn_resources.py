"""Children that state what they hold (cpus, gpus, mem, resources) through a real manager.

A bash parent (flow_spawn --cpus ...) and a Python one (spawn(cpus=...)) each spawn
children that state all, some or none of their request; every child records what its
attempt was given. The parents themselves ask for 2 CPUs, 512M and one licence, so a
child that states nothing is seen to hold exactly that. All jobs share one workspace
and one manager run (a module fixture).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from helpers import published_outcome

from httk_flow.errors import InvalidOutcome
from httk_flow.protocol.outcome import Action, ChildDef, parse_child, read_outcome
from httk_flow.protocol.resources import Request
from httk_flow.protocol.states import State
from httk_flow.runner import Runner, RunnerError

from .support import Bench, Job, bash, flow

MB = 1 << 20

#: each child writes "FLOW_CPUS FLOW_MEM FLOW_RESOURCE_LICENCE FLOW_GPUS" into env.txt
BASH = r"""set -euo pipefail
flow_steps main kid collect bad_cpus zero_cpus bad_mem bad_resource

step_main() {
    flow_spawn --label full --step kid --cpus 2 --mem 1G --resource licence=1
    flow_spawn --label some --step kid --cpus=01 --mem 256
    flow_spawn --label plain --step kid
    flow_spawn --label unlicensed --step kid --resource licence=0
    flow_wait collect
}

step_kid() {
    printf '%s %s %s %s\n' "$FLOW_CPUS" "${FLOW_MEM-unset}" \
        "${FLOW_RESOURCE_LICENCE-unset}" "${FLOW_GPUS:-none}" >"$FLOW_JOB_DIR/env.txt"
    flow_succeed
}

step_collect() {
    flow_children >"$FLOW_JOB_DIR/children.txt"
    flow_succeed joined
}

step_bad_cpus() {
    flow_spawn --step kid --cpus x
    flow_wait collect
}

step_zero_cpus() {
    flow_spawn --step kid --cpus 0
    flow_wait collect
}

step_bad_mem() {
    flow_spawn --step kid --mem 4Q
    flow_wait collect
}

step_bad_resource() {
    flow_spawn --step kid --resource licence
    flow_wait collect
}

flow_main "$@"
"""

PYTHON = """#!/usr/bin/env python3
import os

from httk_flow.runner import Runner

flow = Runner()


@flow.step
def main(flow: Runner) -> None:
    flow.spawn(label="full", step="kid", cpus=2, mem="1G", resources={"licence": 1})
    flow.spawn(label="some", step="kid", cpus=1, mem=256)
    flow.spawn(label="plain", step="kid")
    flow.spawn(label="unlicensed", step="kid", resources={})
    flow.wait("collect")


@flow.step
def kid(flow: Runner) -> None:
    e = os.environ
    seen = [e["FLOW_CPUS"], e.get("FLOW_MEM", "unset"), e.get("FLOW_RESOURCE_LICENCE", "unset")]
    with open(f"{flow.job_dir}/env.txt", "w") as fh:
        fh.write(" ".join([*seen, e.get("FLOW_GPUS") or "none"]) + "\\n")
    flow.succeed()


@flow.step
def collect(flow: Runner) -> None:
    with open(f"{flow.job_dir}/children.txt", "w") as fh:
        fh.writelines(f"{c.label} {c.id} {c.state} {c.path}\\n" for c in flow.children())
    flow.succeed("joined")


@flow.step
def zero_cpus(flow: Runner) -> None:
    flow.spawn(step="kid", cpus=0)
    flow.wait("collect")


raise SystemExit(flow.run())
"""

#: what the parents ask for; what their children inherit
PARENT = ["--cpus", "2", "--mem", "512M", "--resource", "licence=1"]
#: label: (what `flow show --json` says the child holds, what its environment says)
EXPECTED: dict[str, tuple[dict[str, Any], str]] = {
    "full": ({"cpus": 2, "gpus": 0, "mem": 1024 * MB, "custom": {"licence": 1}}, "2 1024 1 none"),
    # states cpus and mem: the licence is the parent's
    "some": ({"cpus": 1, "gpus": 0, "mem": 256 * MB, "custom": {"licence": 1}}, "1 256 1 none"),
    # states nothing: all of it is the parent's
    "plain": ({"cpus": 2, "gpus": 0, "mem": 512 * MB, "custom": {"licence": 1}}, "2 512 1 none"),
    # states its site resources: none, in place of the parent's licence
    "unlicensed": ({"cpus": 2, "gpus": 0, "mem": 512 * MB, "custom": {}}, "2 512 unset none"),
}
BAD_BASH = ["bad_cpus", "zero_cpus", "bad_mem", "bad_resource"]


@dataclass
class Family:
    bench: Bench
    ids: dict[str, str]
    rc: int

    def job(self, case: str) -> Job:
        return self.bench.job(self.ids[case])


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Family]:
    # the cases read the outcomes the runners published: the workspace keeps them
    bench = Bench(tmp_path_factory.mktemp("spawn-resources"), keep_files=True)
    sh = bench.script("parent.sh", BASH)
    py = bench.script("parent.py", PYTHON, prelude="")
    ids = {"bash": bench.submit(sh, options=PARENT), "python": bench.submit(py, options=PARENT)}
    for case in BAD_BASH:
        ids[case] = bench.submit(sh, step=case, options=PARENT)
    ids["py_zero_cpus"] = bench.submit(py, step="zero_cpus", options=PARENT)
    rc = bench.run("--cpus", "2", "--mem", "4G", "--resource", "licence=1", workers=4, timeout=120)
    yield Family(bench, ids, rc)
    bench.close()


def _children(parent: Job) -> dict[str, str]:
    """label -> child id, from what the parent's collect step wrote."""
    rows = [line.split(" ") for line in (parent.dir / "children.txt").read_text().splitlines()]
    return {r[0]: r[1] for r in rows}


def test_the_run_reports_the_failed_parents(family: Family) -> None:
    assert family.rc == 1


@pytest.mark.parametrize("runner", ["bash", "python"])
def test_each_child_holds_what_it_stated_and_the_parents_request_for_the_rest(
    family: Family, runner: str
) -> None:
    parent = family.job(runner)
    assert parent.state is State.SUCCEEDED, parent.describe()
    kids = _children(parent)
    assert sorted(kids) == sorted(EXPECTED)
    for label, (resources, env) in EXPECTED.items():
        child = family.bench.job(kids[label])
        assert child.state is State.SUCCEEDED, child.describe()
        shown = flow("show", "-w", family.bench.root, kids[label], "--json")
        assert shown.returncode == 0, shown.stderr
        assert orjson.loads(shown.stdout)["resources"] == resources, label
        assert (child.dir / "env.txt").read_text() == env + "\n", label


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        # what bash checks itself: the parent's misuse
        ("bad_cpus", "step bad_cpus: flow_spawn: --cpus 'x' is not a whole number"),
        ("bad_resource", "step bad_resource: flow_spawn: --resource needs NAME=N, got 'licence'"),
        (
            "py_zero_cpus",
            "step zero_cpus: spawn: cpus must be a whole number from 1 to 1048576, not 0",
        ),
    ],
)
def test_a_request_the_runner_refuses_fails_the_parent_naming_it(
    family: Family, case: str, reason: str
) -> None:
    job = family.job(case)
    assert (job.state, job.code, job.reason) == (State.FAILED, "protocol_error", reason)
    # what was published is that fail, with no children beside it
    assert published_outcome(job.attempt_dirs()[0])["action"] == "fail"
    assert not (job.attempt_dirs()[0] / "outcome.ready" / "children.jsonl").exists()


@pytest.mark.parametrize(
    ("case", "problem"),
    [
        # digits pass flow_spawn: the range is the manager's to check
        ("zero_cpus", "cpus must be a whole number from 1 to 1048576, not 0"),
        # a size is read by the manager alone
        ("bad_mem", 'mem must be a size such as 4G, 512M or 2048 (megabytes), not "4Q"'),
    ],
)
def test_a_child_line_the_manager_refuses_fails_the_parent_naming_line_and_key(
    family: Family, case: str, problem: str
) -> None:
    job = family.job(case)
    line = job.attempt_dirs()[0] / "outcome.ready" / "children.jsonl"
    assert (job.state, job.code, job.reason) == (
        State.FAILED,
        "protocol_error",
        f"{line}:1: {problem}",
    ), job.describe()
    assert len(job.commits()) == 1
    # no child was registered
    kids = [j for j in family.bench.all_jobs() if j.handle.placement.endswith(job.handle.key)]
    assert kids == []


def test_the_children_file_carries_only_the_keys_a_spawn_stated(family: Family) -> None:
    lines = (family.job("bash").attempt_dirs()[0] / "outcome.ready" / "children.jsonl").read_text()
    assert [orjson.loads(line) for line in lines.splitlines()] == [
        {"label": "full", "step": "kid", "cpus": 2, "mem": "1G", "resources": {"licence": 1}},
        {"label": "some", "step": "kid", "cpus": 1, "mem": "256"},
        {"label": "plain", "step": "kid"},
        {"label": "unlicensed", "step": "kid", "resources": {"licence": 0}},
    ]


# -- the spawn line itself, without a manager ---------------------------------------------

ATTEMPT_ENV = {"FLOW_STEP": "main", "FLOW_DURABLE": "0"}


@pytest.fixture
def attempt(tmp_path: Path) -> Path:
    d = tmp_path / "attempt"
    d.mkdir()
    return d


def _spawned(attempt: Path) -> list[ChildDef]:
    out = read_outcome(str(attempt))
    assert out is not None and out.action is Action.WAIT
    return list(out.children)


def test_flow_spawn_writes_the_request_the_manager_reads(tmp_path: Path, attempt: Path) -> None:
    # a PATH of mkdir and mv alone: the request is built with no other process
    only = tmp_path / "bin"
    only.mkdir()
    for cmd in ("mkdir", "mv"):
        found = shutil.which(cmd)
        assert found is not None
        os.symlink(found, only / cmd)
    script = r"""
        flow_spawn --label a --gpus=003 --cpus 4 --cpus 8 --mem 1.5G
        flow_spawn --label b --resource scratch=2 --resource=licence=01 --gpus 0
        flow_spawn --label c --mem 2048
        flow_wait main
    """
    env = {**ATTEMPT_ENV, "FLOW_CONTROL_DIR": str(attempt), "PATH": str(only)}
    done = bash(script, env=env, cwd=str(attempt))
    assert done.returncode == 0, done.stderr
    assert b"command not found" not in done.stderr
    parent = Request(2, 1, 512 * MB, (("licence", 1),))
    a, b, c = (k.request_over(parent) for k in _spawned(attempt))
    # the last --cpus wins, as for every option of flow_spawn
    assert a == Request(8, 3, 1536 * MB, (("licence", 1),))
    assert b == Request(2, 0, 512 * MB, (("licence", 1), ("scratch", 2)))
    assert c == Request(2, 1, 2048 * MB, (("licence", 1),))


@pytest.mark.parametrize(
    ("call", "problem"),
    [
        ("--cpus ''", "--cpus '' is not a whole number"),
        ("--gpus -1", "--gpus '-1' is not a whole number"),
        ("--cpus 2.5", "--cpus '2.5' is not a whole number"),
        ("--mem ''", "--mem needs a size such as 4G, 512M or 2048 (megabytes)"),
        (
            "--resource 'a b=1'",
            "resource name 'a b' is not valid (1-128 letters, digits and "
            "'_.+-', starting with a letter or digit)",
        ),
        ("--resource licence=one", "--resource licence=one: 'one' is not a whole number"),
        ("--resource x=1 --resource x=2", "resource 'x' is given twice"),
        ("--cpus", "option --cpus needs a value"),
    ],
)
def test_flow_spawn_refuses_what_bash_can_check(attempt: Path, call: str, problem: str) -> None:
    env = {**ATTEMPT_ENV, "FLOW_CONTROL_DIR": str(attempt)}
    done = bash(f"flow_spawn {call}; echo rc=$?; flow_wait main", env=env, cwd=str(attempt))
    assert done.stdout.decode().split() == ["rc=2"]
    out = published_outcome(attempt)
    assert (out["action"], out["code"]) == ("fail", "protocol_error")
    assert out["message"] == f"step main: flow_spawn: {problem}"


def test_flow_spawn_leaves_a_size_and_reserved_names_to_the_manager(attempt: Path) -> None:
    env = {**ATTEMPT_ENV, "FLOW_CONTROL_DIR": str(attempt)}
    done = bash(
        """flow_spawn --mem '4"G'; flow_spawn --resource CPUs=1; flow_wait main""",
        env=env,
        cwd=str(attempt),
    )
    assert done.returncode == 0, done.stderr
    where = attempt / "outcome.ready" / "children.jsonl"
    lines = where.read_bytes().splitlines()
    assert [orjson.loads(x) for x in lines] == [
        {"label": "c1", "mem": '4"G'},
        {"label": "c2", "resources": {"CPUs": 1}},
    ]
    with pytest.raises(InvalidOutcome) as e:
        read_outcome(str(attempt))
    assert e.value.render() == (
        f'{where}:1: mem must be a size such as 4G, 512M or 2048 (megabytes), not "4\\"G"'
    )
    with pytest.raises(InvalidOutcome) as e:
        parse_child(lines[1], "children.jsonl:2")
    assert e.value.render() == "children.jsonl:2: resource 'CPUs' has a key of its own: cpus"


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"cpus": "2"}, 'cpus must be a whole number from 1 to 1048576, not "2"'),
        ({"cpus": True}, "cpus must be a whole number from 1 to 1048576, not true"),
        ({"gpus": 2_000_000}, "gpus must be a whole number from 0 to 1048576, not 2000000"),
        ({"mem": 1.5}, "mem must be a size such as 4G, 512M or 2048 (megabytes), not 1.5"),
        ({"mem": "lots"}, 'mem must be a size such as 4G, 512M or 2048 (megabytes), not "lots"'),
        (
            {"resources": ["licence"]},
            'resources must be an object such as {"licence": 1}, not ["licence"]',
        ),
        (
            {"resources": {"licence": -1}},
            "resource 'licence' must be a whole number from 0 to 1048576, not -1",
        ),
        ({"resources": {"gpu": 1}}, "resource 'gpu' has a key of its own: gpus"),
        ({"cpus": {2}}, "cpus must be a whole number from 1 to 1048576, not {2}"),
    ],
)
def test_python_spawn_refuses_a_bad_request_at_the_call(
    attempt: Path, kwargs: dict[str, Any], problem: str
) -> None:
    env = {**ATTEMPT_ENV, "FLOW_CONTROL_DIR": str(attempt)}

    def main(flow: Runner) -> None:
        with pytest.raises(RunnerError) as e:
            flow.spawn(**kwargs)
        assert e.value.render() == f"spawn: {problem}"
        flow.spawn()
        flow.wait("main")

    assert Runner({"main": main}, env=env).run() == 0
    out = published_outcome(attempt)
    assert (out["action"], out["message"]) == ("fail", f"step main: spawn: {problem}")


def test_python_spawn_writes_only_what_it_was_given(attempt: Path) -> None:
    env = {**ATTEMPT_ENV, "FLOW_CONTROL_DIR": str(attempt)}
    r = Runner({"main": lambda f: None}, env=env)
    r.spawn(label="a", gpus=1, resources={"licence": 2})
    r.spawn(label="b")
    r.wait("main")
    a, b = _spawned(attempt)
    assert (a.resources, a.stated) == (Request(1, 1, 0, (("licence", 2),)), {"gpus", "custom"})
    assert (b.resources, b.stated) == (None, frozenset())
    parent = Request(4, 0, 8192 * MB, ())
    assert a.request_over(parent) == Request(4, 1, 8192 * MB, (("licence", 2),))
    assert b.request_over(parent) is parent
