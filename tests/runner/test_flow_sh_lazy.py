"""shell/flow-children.sh: the children functions of the bash API, which flow.sh sources
beside itself (after flow-more.sh) the first time flow_spawn, flow_wait or flow_children is
called.

A job that never spawns never reads it; one that does gets the functions defined once, and
only from a file of flow.sh's own version.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import published_outcome

import httk_flow
from httk_flow.protocol.states import State

from .support import BASH, FLOW_SH, REPO, Bench, bash

CHILDREN_SH = FLOW_SH.parent / "flow-children.sh"
MORE_SH = FLOW_SH.parent / "flow-more.sh"
LAZY = {"flow_spawn": "_flow_do_spawn", "flow_wait": "_flow_do_wait"}
LAZY_ALL = {**LAZY, "flow_children": "_flow_do_children"}

FAMILY = r"""set -euo pipefail
flow_steps spawn child collect
step_spawn() {
    flow_spawn --step child --param n=1
    flow_spawn --step child --param n=2 --label two
    flow_wait collect --all-succeeded
}
step_child() {
    printf '%s\n' "$(flow_param n)" >"$FLOW_JOB_DIR/result"
    flow_succeed "child $(flow_param n)"
}
step_collect() {
    local label id state path sum=0 n
    while read -r label id state path; do
        [[ $state == succeeded ]] || flow_fail "child $label is $state"
        read -r n <"$path/result"
        sum=$((sum + n))
    done < <(flow_children)
    flow_succeed "sum $sum"
}
flow_main "$@"
"""

NO_SPAWN = r"""set -euo pipefail
flow_steps main
step_main() { flow_succeed "no children, $(flow_param greeting hello)"; }
flow_main "$@"
"""


def version_of(path: Path, var: str) -> str:
    found = re.findall(rf"^{var}=(\S+)$", path.read_text(), flags=re.M)
    assert len(found) == 1, (path, var, found)
    return str(found[0])


def definitions(path: Path) -> list[str]:
    """Names of the functions a file defines (`name() {` at the start of a line)."""
    return re.findall(r"^([A-Za-z_][A-Za-z0-9_]*)\(\) \{", path.read_text(), flags=re.M)


def api_copy(tmp: Path, *, children: str | None) -> Path:
    """flow.sh and flow-more.sh in a directory of their own, with flow-children.sh beside
    them (text `children`) or none; returns the copy of flow.sh."""
    d = tmp / "api"
    d.mkdir()
    shutil.copyfile(FLOW_SH, d / "flow.sh")
    shutil.copyfile(MORE_SH, d / "flow-more.sh")
    if children is not None:
        (d / "flow-children.sh").write_text(children)
    return d / "flow.sh"


def fake_attempt(tmp: Path) -> Path:
    d = tmp / "attempt"
    d.mkdir()
    return d


def source_and_run(api: Path, attempt: Path, script: str) -> subprocess.CompletedProcess[bytes]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "FLOW_CONTROL_DIR": str(attempt),
        "FLOW_STEP": "main",
    }
    return subprocess.run(
        [BASH, "-c", f'source "$1"\n{script}', "flow-test", str(api)],
        capture_output=True,
        env=env,
        cwd=str(attempt),
        timeout=60,
    )


# -- the files ----------------------------------------------------------------------------


def test_both_files_carry_the_package_version() -> None:
    assert version_of(FLOW_SH, "_FLOW_API_VERSION") == httk_flow.__version__
    assert version_of(CHILDREN_SH, "_FLOW_CHILDREN_VERSION") == httk_flow.__version__


def test_the_package_symlinks_point_at_the_shell_files() -> None:
    pkg = REPO / "httk_flow" / "shell"
    for name in ("flow.sh", "flow-more.sh", "flow-children.sh"):
        link = pkg / name
        assert link.is_symlink() and os.readlink(link) == f"../../shell/{name}"
        assert link.resolve() == (REPO / "shell" / name).resolve()


def test_no_function_is_defined_in_both_files_or_twice_in_one() -> None:
    head, tail, more = definitions(FLOW_SH), definitions(CHILDREN_SH), definitions(MORE_SH)
    assert len(head) == len(set(head)) and len(tail) == len(set(tail))
    assert len(more) == len(set(more))
    assert not set(head) & set(tail) and not set(more) & (set(head) | set(tail))
    assert set(LAZY_ALL) <= set(head) and set(LAZY_ALL.values()) == set(tail)
    # flow.sh no longer reads itself
    assert "eval" not in re.sub(r"#.*", "", FLOW_SH.read_text())


def test_loading_adds_the_children_functions_and_redefines_none(tmp_path: Path) -> None:
    attempt = fake_attempt(tmp_path)
    script = """
        names_before=$(declare -F | cut -d' ' -f3)
        dump() { local f; for f in $names_before; do declare -f "$f"; done; }
        before=$(dump)
        flow_children >/dev/null 2>&1
        status=$?
        after=$(dump)
        printf '%s\\n' "$status" >status
        printf '%s\\n' "$names_before" >names_before
        declare -F | cut -d' ' -f3 >names_after
        [[ $after == "$before" ]] || { echo "a function changed"; exit 3; }
    """
    done = source_and_run(FLOW_SH, attempt, script)
    assert done.returncode == 0, done.stdout + done.stderr
    # no children file in this attempt: flow_children's own answer, not a load failure
    assert (attempt / "status").read_text() == "1\n"
    before = (attempt / "names_before").read_text().split()
    after = (attempt / "names_after").read_text().split()
    assert set(before) >= set(LAZY_ALL) and not set(before) & set(LAZY_ALL.values())
    # flow-more.sh first (the children functions use its helpers), then flow-children.sh
    loaded = set(LAZY_ALL.values()) | set(definitions(MORE_SH))
    assert set(after) - set(before) - {"dump"} == loaded


# -- a real manager -----------------------------------------------------------------------


def test_spawn_wait_and_children_work_after_the_lazy_load(bench: Bench) -> None:
    ident = bench.submit(bench.script("family.sh", FAMILY), step="spawn")
    assert bench.run() == 0
    job = bench.job(ident)
    assert job.state is State.SUCCEEDED, job.describe()
    assert job.message == "sum 3"
    assert [f.get("step") for f in job.commits()] == ["spawn", "collect"]


def test_a_job_that_never_spawns_runs_without_the_children_file(
    bench: Bench, tmp_path: Path
) -> None:
    api = api_copy(tmp_path, children=None)
    prelude = f'#!/usr/bin/env bash\nsource "{api}"\n'
    quiet = bench.submit(bench.script("quiet.sh", NO_SPAWN, prelude=prelude))
    family = bench.submit(bench.script("family.sh", FAMILY, prelude=prelude), step="spawn")
    bench.run()
    job = bench.job(quiet)
    assert job.state is State.SUCCEEDED, job.describe()
    assert job.message == "no children, hello"
    # the one that spawns cannot, and says why
    job = bench.job(family)
    assert job.state is State.FAILED, job.describe()
    assert job.code == "protocol_error"
    assert "flow_spawn: cannot load" in job.reason and "flow-children.sh" in job.reason


# -- version mixing -----------------------------------------------------------------------


def test_a_children_file_of_another_version_is_refused(tmp_path: Path) -> None:
    text = CHILDREN_SH.read_text()
    other = text.replace(
        f"_FLOW_CHILDREN_VERSION={httk_flow.__version__}\n", "_FLOW_CHILDREN_VERSION=9.9.9\n"
    )
    assert other != text
    api = api_copy(tmp_path, children=other)
    attempt = fake_attempt(tmp_path)
    script = """
        flow_steps main
        flow_spawn --step main
        printf '%s\\n' "$?" >spawn_status
        declare -F _flow_do_spawn >/dev/null && echo defined >defined
        flow_wait main
        printf '%s\\n' "$?" >wait_status
    """
    done = source_and_run(api, attempt, script)
    assert done.returncode == 0, done.stderr
    err = done.stderr.decode()
    v = httk_flow.__version__
    assert (
        f"flow_spawn: cannot load {api.parent}/flow-children.sh (version 9.9.9) for flow.sh "
        f"(version {v}): the two ship together and one job never mixes versions"
    ) in err
    assert (attempt / "spawn_status").read_text() == "2\n"
    assert (attempt / "wait_status").read_text() == "2\n"
    assert not (attempt / "defined").exists(), "a refused file defines nothing"
    # flow_wait still ends the attempt: a fail naming the first misuse
    out = published_outcome(attempt)
    assert out["action"] == "fail" and out["code"] == "protocol_error"
    assert out["message"].startswith("step main: flow_spawn: cannot load ")
    assert "(version 9.9.9)" in out["message"]


def test_a_children_file_that_does_not_say_its_version_is_refused(tmp_path: Path) -> None:
    api = api_copy(tmp_path, children="_flow_do_spawn() { echo impostor; }\n")
    attempt = fake_attempt(tmp_path)
    done = source_and_run(api, attempt, "flow_spawn; echo $? >status")
    assert (attempt / "status").read_text() == "2\n"
    assert b"impostor" not in done.stdout
    assert b"(version unknown) for flow.sh" in done.stderr


def test_a_spawning_step_without_the_children_file_ends_as_a_protocol_error(
    tmp_path: Path,
) -> None:
    api = api_copy(tmp_path, children=None)
    attempt = fake_attempt(tmp_path)
    script = "set -e; flow_steps main; step_main() { flow_spawn; flow_wait main; }; flow_main"
    source_and_run(api, attempt, script)
    out = published_outcome(attempt)
    assert out["action"] == "fail" and out["code"] == "protocol_error"
    assert f"cannot load {api.parent}/flow-children.sh (version unknown)" in out["message"]


def test_the_children_file_is_found_beside_flow_sh_not_on_path(tmp_path: Path) -> None:
    # a decoy on PATH and in the working directory must not be picked up
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (decoy / "flow-children.sh").write_text("echo decoy >&2\n")
    attempt = fake_attempt(tmp_path)
    shutil.copyfile(decoy / "flow-children.sh", attempt / "flow-children.sh")
    done = bash(
        "flow_spawn --label x && flow_wait main --all-done; echo $?",
        env={
            "PATH": f"{decoy}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "FLOW_CONTROL_DIR": str(attempt),
            "FLOW_STEP": "main",
        },
        cwd=str(attempt),
    )
    assert done.stdout == b"0\n", done.stderr
    assert b"decoy" not in done.stderr


# -- the package --------------------------------------------------------------------------


@pytest.mark.slow
def test_pip_install_ships_both_files(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist")
    for name in ("httk_flow", "shell"):
        shutil.copytree(REPO / name, src / name, symlinks=True, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copyfile(REPO / name, src / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    # the venv's own httk_flow, not this tree's (a PYTHONPATH naming it would win)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", str(src)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    where = subprocess.run(
        [str(py), "-c", "import os, httk_flow; print(os.path.dirname(httk_flow.__file__))"],
        capture_output=True,
        text=True,
        cwd=str(tmp_path),
        check=True,
        env=env,
    )
    shell = Path(where.stdout.strip()) / "shell"
    assert shell.parent != REPO / "httk_flow"
    # flow-gate.sh too: the launcher of a bash program sources it from the package
    for name in ("flow.sh", "flow-more.sh", "flow-children.sh", "flow-gate.sh"):
        installed = shell / name
        assert installed.is_file() and not installed.is_symlink(), installed
        assert installed.read_bytes() == (REPO / "shell" / name).read_bytes()
    # the installed flow.sh finds the installed flow-children.sh
    attempt = fake_attempt(tmp_path)
    run = source_and_run(shell / "flow.sh", attempt, "flow_spawn && flow_wait main; echo $?")
    assert run.stdout == b"0\n", run.stderr
    assert published_outcome(attempt)["action"] == "wait"
