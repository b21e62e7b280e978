"""Programs with their files, end to end: `flow submit --bundle DIR` runs a program inside
a stored copy of its directory (a bash script sourcing its sibling, a Python program
importing its sibling module), `FLOW_PROGRAM_SOURCE` tells a stored program where it came
from, and `--in-place` runs a program where it is, refusing one that changed since."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from helpers import attempt_output
from manager.support import PRELUDE, Managers, dump, job

from httk_flow.cli.main import cli
from httk_flow.protocol import layout
from httk_flow.protocol.bundles import scan
from httk_flow.protocol.states import State


def write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def submit(runner: CliRunner, root: str, *args: str) -> list[str]:
    r = runner.invoke(cli, ["-w", root, "submit", *args])
    assert r.exit_code == 0, r.output
    return r.stdout.split()


def refused(runner: CliRunner, root: str, *args: str) -> str:
    """The error of a submission that must fail with exit 2 and leave nothing behind."""
    r = runner.invoke(cli, ["-w", root, "submit", *args])
    assert r.exit_code == 2, r.output
    assert r.stdout == ""
    assert os.listdir(Path(root) / ".flow" / "tmp") == []
    assert "Traceback" not in r.stderr
    return r.stderr


def output(root: str, jid: str, n: int = 1) -> str:
    return attempt_output(job(root, jid).job_dir(root), n)


def bash_app(base: Path) -> Path:
    """run.sh sources lib.sh beside it and reads data/ beside it."""
    write(
        base / "run.sh",
        '#!/bin/bash\nset -eu\nsource "$(dirname "$0")/lib.sh"\n'
        'greet "$(cat "$(dirname "$0")/data/who")"\n'
        'echo "bundle $FLOW_BUNDLE_DIR"\necho "source $FLOW_PROGRAM_SOURCE"\n'
        'echo "index ${FLOW_ARRAY_INDEX:-none}"\n',
        0o755,
    )
    write(base / "lib.sh", 'greet() { echo "hello, $1 (from lib.sh)"; }\n')
    write(base / "data" / "who", "world\n")
    return base


def test_a_bundled_bash_program_finds_the_file_it_sources(
    runner: CliRunner, root: str, tmp_path: Path, managers: Managers
) -> None:
    src = bash_app(tmp_path / "app")
    [jid] = submit(runner, root, "--bundle", str(src), str(src / "run.sh"))
    assert managers.run(root) == 0, dump(root)
    stored = layout.bundle_dir(root, scan(str(src)).digest)
    assert output(root, jid) == (
        f"hello, world (from lib.sh)\nbundle {stored}\nsource {src}/run.sh\nindex none\n"
    )
    definition = orjson.loads((job(root, jid).job_dir(root) / "job.json").read_bytes())
    assert definition["program"] == {
        "bundle": scan(str(src)).digest,
        "path": "run.sh",
        "name": "run.sh",
        "source": f"{src}/run.sh",
    }


def test_a_bundled_python_program_imports_the_module_beside_it(
    runner: CliRunner, root: str, tmp_path: Path, managers: Managers
) -> None:
    src = tmp_path / "pyapp"
    write(
        src / "main.py",
        f"#!{sys.executable}\n"
        "import os, sys\n"
        "import helper\n"
        "from httk_flow.runner import Runner\n"
        "flow = Runner()\n"
        "print(helper.answer(), sys.path[0] == flow.bundle_dir, flow.program_source)\n",
        0o755,
    )
    write(src / "helper.py", "def answer():\n    return 42\n")
    [jid] = submit(runner, root, "--bundle", str(src), str(src / "main.py"))
    assert managers.run(root) == 0, dump(root)
    assert output(root, jid) == f"42 True {src}/main.py\n"
    # Python's caches never enter the tree, wherever the interpreter writes them
    assert scan(str(src)).digest == job_bundle(root, jid)


def job_bundle(root: str, jid: str) -> str:
    definition = orjson.loads((job(root, jid).job_dir(root) / "job.json").read_bytes())
    return str(definition["program"]["bundle"])


def test_an_array_and_a_jsonl_file_share_one_stored_bundle(
    runner: CliRunner,
    root: str,
    tmp_path: Path,
    managers: Managers,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    src = bash_app(tmp_path / "app")
    monkeypatch.chdir(tmp_path)  # DIR and PROGRAM relative to where flow submit runs
    ids = submit(runner, root, "--bundle", "app", "--array", "1-3", "./app/run.sh")
    deck = write(tmp_path / "deck.jsonl", '{"bundle": "app", "program": "app/run.sh"}\n')
    ids += submit(runner, root, "--from", str(deck))
    assert os.listdir(layout.bundles_dir(root)) == [scan(str(src)).digest]
    assert managers.run(root) == 0, dump(root)
    assert [output(root, j).splitlines()[3] for j in ids] == [
        "index 1",
        "index 2",
        "index 3",
        "index none",
    ]


def test_a_bundled_parents_children_run_inside_its_bundle(
    runner: CliRunner, root: str, tmp_path: Path, managers: Managers
) -> None:
    src = tmp_path / "fam"
    write(
        src / "run.sh",
        PRELUDE + 'source "$(dirname "$0")/lib.sh"\n'
        'case "$FLOW_STEP" in\n'
        '  main) publish \'{"action":"wait","step":"done"}\' '
        '\'{"label":"k1","tag":"kid","step":"kid"}\' ;;\n'
        '  kid) say kid; publish \'{"action":"succeed"}\' ;;\n'
        '  done) say parent; publish \'{"action":"succeed"}\' ;;\n'
        "esac\n",
        0o755,
    )
    write(src / "lib.sh", 'say() { echo "$1 in $FLOW_BUNDLE_DIR"; }\n')
    [jid] = submit(runner, root, "--bundle", str(src), str(src / "run.sh"))
    assert managers.run(root) == 0, dump(root)
    stored = layout.bundle_dir(root, scan(str(src)).digest)
    assert output(root, jid, 2) == f"parent in {stored}\n"
    kids = list(job(root, jid).job_dir(root).glob("kid--*/job.json"))
    assert [attempt_output(k.parent, 1) for k in kids] == [f"kid in {stored}\n"]


def test_what_a_bundle_refuses_is_said_plainly(
    runner: CliRunner, root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = bash_app(tmp_path / "app")
    write(tmp_path / "elsewhere.sh", "#!/bin/sh\n", 0o755)
    monkeypatch.chdir(tmp_path)
    assert refused(runner, root, "--bundle", "app", "./elsewhere.sh") == (
        f"flow: error: program './elsewhere.sh': is not inside the bundle directory 'app' "
        f"({src}); give the program as a path inside the bundle directory\n"
    )
    assert refused(runner, root, "--bundle", "app", "run.sh") == (
        f"flow: error: program 'run.sh': is not inside the bundle directory 'app' ({src}); "
        "did you mean 'app/run.sh'? (PROGRAM is a path from here, not from DIR)\n"
    )
    seen = 6 + len((src / "lib.sh").read_bytes())  # data/who, then lib.sh: past the cap
    assert refused(runner, root, "--bundle", "app", "--bundle-max", "10", "app/run.sh") == (
        f"flow: error: bundle 'app': holds more than the 10 B a bundle may (at least {seen} B); "
        "a bundle is the program and the small files it needs; give data with --input, "
        "or leave it on shared storage and pass its path as a parameter; or raise the cap "
        "with --bundle-max SIZE\n"
    )
    assert refused(runner, root, "--bundle", "app", "--in-place", "app/run.sh") == (
        "flow: error: --bundle 'app': cannot be combined with --in-place; a bundle runs a "
        "stored copy of the directory; --in-place runs the file where it is\n"
    )
    (src / "lib.sh").chmod(0o755)
    (src / "run.sh").chmod(0o644)
    assert refused(runner, root, "--bundle", "app", "app/run.sh") == (
        "flow: error: program 'app/run.sh': is not executable; run `chmod +x app/run.sh`\n"
    )
    assert not os.path.exists(layout.bundles_dir(root))


def test_a_program_saved_with_windows_line_endings_is_refused_at_submission(
    runner: CliRunner, root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A #! line ending in a carriage return names an interpreter no system has: every
    attempt would fail far from the editor that saved it, so submission says how to fix it.
    A carriage return later in the file (data, a here-document) is the program's own."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "win.sh", "#!/bin/bash\r\necho hi\r\n", 0o755)
    write(tmp_path / "app" / "run.sh", "#!/usr/bin/env bash\r\n", 0o755)
    fix = "and submit again\n"
    for args, shown, line in (
        (["./win.sh"], "./win.sh", "/bin/bash"),
        (["--in-place", "./win.sh"], "./win.sh", "/bin/bash"),
        (["--array", "1-3", "./win.sh"], "./win.sh", "/bin/bash"),
        (["--bundle", "app", "app/run.sh"], "app/run.sh", "/usr/bin/env bash"),
    ):
        assert refused(runner, root, *args) == (
            f"flow: error: program '{shown}': has Windows line endings: its #! line "
            f"('{line}') ends in a carriage return, so no system can find its interpreter; "
            f"convert it with `dos2unix {shown}` (or `sed -i 's/\\r$//' {shown}`) {fix}"
        ), args
    jsonl = write(tmp_path / "jobs.jsonl", '{"program": "./win.sh"}\n')
    assert "has Windows line endings" in refused(runner, root, "--from", str(jsonl))
    assert not os.path.exists(layout.bundles_dir(root))
    # only the #! line matters: a body with carriage returns, or none at all, is submitted
    write(tmp_path / "data.py", "#!/usr/bin/env python3\nprint('a\\r')\r\n", 0o755)
    write(tmp_path / "bare.sh", "echo hi\r\n", 0o755)
    assert len(submit(runner, root, "./data.py")) == 1
    assert len(submit(runner, root, "./bare.sh")) == 1


# -- the stored copy and FLOW_PROGRAM_SOURCE -------------------------------------------------


def test_a_stored_program_is_told_where_it_was_submitted_from(
    runner: CliRunner, root: str, tmp_path: Path, managers: Managers
) -> None:
    src = tmp_path / "tool"
    write(
        src / "run.sh",
        '#!/bin/bash\necho "$0"\nsource "$(dirname "$FLOW_PROGRAM_SOURCE")/lib.sh"\n'
        'echo "bundle: ${FLOW_BUNDLE_DIR-none}"\ncp "$FLOW_CONTEXT" "$FLOW_WORKDIR/seen.json"\n',
        0o755,
    )
    write(src / "lib.sh", "echo sourced from the original directory\n")
    [jid] = submit(runner, root, str(src / "run.sh"))
    assert managers.run(root) == 0, dump(root)
    digest = hashlib.sha256((src / "run.sh").read_bytes()).hexdigest()
    assert output(root, jid) == (
        f"{layout.program_path(root, digest)}\nsourced from the original directory\nbundle: none\n"
    )
    definition = orjson.loads((job(root, jid).job_dir(root) / "job.json").read_bytes())
    assert definition["program"] == {"digest": digest, "name": "run.sh", "source": f"{src}/run.sh"}
    job_dir = job(root, jid).job_dir(root)
    seen = orjson.loads((job_dir / "run" / "seen.json").read_bytes())
    assert (seen["program_source"], seen["bundle_dir"]) == (f"{src}/run.sh", None)
    # the attempt's own context.json was tidied away at its commit
    assert not (job_dir / "a0001" / "context.json").exists()


# -- in place ----------------------------------------------------------------------------------


def test_an_unchanged_in_place_program_runs_from_where_it_is_at_every_attempt(
    runner: CliRunner, root: str, tmp_path: Path, managers: Managers
) -> None:
    prog = write(
        tmp_path / "here" / "run.sh",
        '#!/bin/bash\necho "$0 $FLOW_ATTEMPT $FLOW_PROGRAM_SOURCE" >> "$FLOW_WORKDIR/log"\n'
        "exit 1\n",
        0o755,
    )
    [jid] = submit(runner, root, "--in-place", "--retries", "2", str(prog))
    assert managers.run(root) == 1
    info = job(root, jid)
    assert info.state is State.FAILED and info.failure_code == "budget_exhausted", dump(root)
    assert (info.job_dir(root) / "run" / "log").read_text() == "".join(
        f"{prog} {n} {prog}\n" for n in (1, 2, 3)
    )
    assert os.listdir(Path(root) / ".flow" / "programs") == []


def test_an_in_place_program_edited_between_attempts_is_refused_and_never_runs(
    runner: CliRunner, root: str, tmp_path: Path, managers: Managers
) -> None:
    prog = tmp_path / "here" / "run.sh"
    # the first attempt asks for a retry and, meanwhile, the program is edited (by the
    # attempt itself, so that the edit surely lands between the two attempts)
    write(
        prog,
        PRELUDE + 'echo "first version, attempt $FLOW_ATTEMPT"\n'
        '{ cp "$0" "$0.new"; echo \'touch "$FLOW_WORKDIR/edited-ran"\' >> "$0.new"\n'
        '  mv "$0.new" "$0"; publish \'{"action":"retry","reason":"again"}\'; exit; }\n',
        0o755,
    )
    submitted = hashlib.sha256(prog.read_bytes()).hexdigest()
    [jid] = submit(runner, root, "--in-place", "--retries", "5", str(prog))
    assert managers.run(root) == 1
    info = job(root, jid)
    assert info.state is State.FAILED, dump(root)
    assert info.failure_code == "program_changed"
    now = hashlib.sha256(prog.read_bytes()).hexdigest()
    assert info.last["failure"] == {
        "code": "program_changed",
        "message": f"the in-place program {prog} changed since it was submitted (sha256 "
        f"{submitted}, now {now}); the changed code was not run: resubmit to run it, or "
        "submit without --in-place to run a stored copy",
        "retryable": False,
    }
    # one attempt ran; the second was claimed and failed before it started
    assert output(root, jid) == "first version, attempt 1\n"
    assert not (info.job_dir(root) / "a0002").exists()
    assert not (info.job_dir(root) / "run" / "edited-ran").exists()
    assert [f["to"] for f in info.frames][-2:] == ["claimed", "failed"]
    assert info.last["last"] == "program_changed"
    shown = runner.invoke(cli, ["-w", root, "show", jid]).stdout
    assert f"failure     program_changed: the in-place program {prog} changed" in shown


def test_in_place_needs_a_file(runner: CliRunner, root: str) -> None:
    assert refused(runner, root, "--in-place", "true") == (
        "flow: error: program 'true': is not a file; --in-place runs a file where it is; "
        "give its path (e.g. ./run.sh); a command on PATH runs without --in-place\n"
    )


def test_an_in_place_program_that_is_gone_fails_at_once(
    runner: CliRunner, root: str, tmp_path: Path, managers: Managers
) -> None:
    prog = write(tmp_path / "gone.sh", "#!/bin/sh\nexit 0\n", 0o755)
    [jid] = submit(runner, root, "--in-place", str(prog))
    digest = hashlib.sha256(prog.read_bytes()).hexdigest()
    prog.unlink()
    assert managers.run(root) == 1
    info = job(root, jid)
    assert info.failure_code == "program_changed", dump(root)
    assert info.last["failure"]["message"] == (
        f"the in-place program {prog} is gone (it was submitted with sha256 {digest}); "
        "resubmit it, or submit without --in-place to run a stored copy"
    )
