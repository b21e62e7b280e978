"""A committed attempt is tidied: what holds nothing the journal does not goes at its
commit (context.json, outcome.line, outcome.ready/, empty output, then empty directories),
so a finished job that printed nothing is three inodes, and one that printed is five (its
output moved up beside job.json); `flow logs` reads it back; `flow init
--keep-attempt-files` keeps everything."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
from click.testing import CliRunner
from manager.support import Managers, fsck_report, write_program

from httk_flow.cli.main import cli

from .support import Flow

API_SILENT = '#!/usr/bin/env bash\nsource "$FLOW_BASH_API"\nflow_steps main\n'
API_SILENT += 'step_main() { flow_succeed "quiet"; }\nflow_main "$@"\n'

#: three steps, prints only in the last; the first leaves a file in run/ when told to
STEPS = r"""#!/usr/bin/env bash
source "$FLOW_BASH_API"
flow_steps main two three
step_main() {
    [[ $(flow_param keep 0) == 1 ]] && echo kept >checkpoint
    flow_advance two
}
step_two() { flow_advance three; }
step_three() { echo "the answer"; echo "a warning" >&2; flow_succeed; }
flow_main "$@"
"""

#: leaves a process in its group that outlives it (the manager TERMs it)
LEAVES = """#!/bin/sh
sleep 30 &
exit 0
"""

#: the Python runner publishes by renaming outcome.ready/ into place
PYTHON = """#!/usr/bin/env python3
from httk_flow.runner import Runner
r = Runner()
@r.step("main")
def main(ctx):
    return ctx.succeed("from python")
r.run()
"""


def inodes(job_dir: Path) -> list[str]:
    """Every name under a job's directory, relative to it (the directory itself is '.')."""
    found = ["."]
    for base, dirs, files in os.walk(job_dir):
        rel = os.path.relpath(base, job_dir)
        found += [os.path.normpath(os.path.join(rel, n)) for n in dirs + files]
    return sorted(found)


def test_a_job_that_printed_nothing_ends_as_three_inodes(
    flow: Flow, scripts: Path, managers: Managers
) -> None:
    api = flow.submit(write_program(scripts, "api.sh", API_SILENT))
    true = flow.submit("true")
    py = flow.submit(write_program(scripts, "py.py", PYTHON))
    assert managers.run(flow.root) == 0
    for job in (api, true, py):
        assert flow.state(job["key"]) == "succeeded"
        # the job's directory and job.json, and (elsewhere) its one marker
        assert inodes(flow.job_dir(job)) == [".", "job.json"], job
        assert flow.marker(job).is_file()
        assert flow.ok("logs", job["key"]) == ""
        assert flow.ok("logs", "--stderr", job["key"]) == ""
    # what the attempt said is in the journal, and `flow show` tells it as before
    [attempt] = flow.show(api["key"])["attempts"]
    assert attempt["result"]["outcome"] == {"action": "succeed", "message": "quiet"}
    assert flow.show(py["key"])["message"] == "from python"
    assert fsck_report(flow.root)["clean"]


def test_output_is_kept_and_every_step_is_tidied(
    flow: Flow, scripts: Path, managers: Managers
) -> None:
    prog = write_program(scripts, "steps.sh", STEPS)
    plain = flow.submit(prog)
    keeps = flow.submit("--param", "keep=1", prog)
    isolated = flow.submit("--workdir", "isolated", prog)
    assert managers.run(flow.root) == 0
    for job in (plain, keeps, isolated):
        assert flow.state(job["key"]) == "succeeded"
        assert flow.ok("logs", job["key"]) == "the answer\n"
        assert flow.ok("logs", "--stderr", job["key"]) == "a warning\n"
        # the two silent steps left nothing; their attempts' output reads as empty
        assert flow.ok("logs", "--attempt", "1", job["key"]) == ""
    # what the last step printed moved up beside job.json: five inodes with the marker
    kept = ["a0003.stderr", "a0003.stdout"]
    assert inodes(flow.job_dir(plain)) == sorted([".", "job.json", *kept])
    assert inodes(flow.job_dir(isolated)) == sorted([".", "job.json", *kept])
    # a workdir the program wrote to stays, with what it wrote
    assert inodes(flow.job_dir(keeps)) == sorted([".", "job.json", *kept, "run", "run/checkpoint"])
    assert fsck_report(flow.root)["clean"]


def test_output_that_a_leftover_process_may_still_write_to_is_kept(
    flow: Flow, scripts: Path, managers: Managers
) -> None:
    job = flow.submit(write_program(scripts, "leaves.sh", LEAVES))
    assert managers.run(flow.root) == 0
    assert flow.state(job["key"]) == "succeeded"
    # the group's sleeper was there at the end: what it may still use stays (its output
    # files, even empty, its context, the workdir)
    assert inodes(flow.job_dir(job)) == [
        ".",
        "a0001",
        "a0001/context.json",
        "a0001/stderr",
        "a0001/stdout",
        "job.json",
        "run",
    ]


def test_a_symlinked_attempt_directory_is_not_tidied_through(
    flow: Flow, scripts: Path, managers: Managers, tmp_path: Path
) -> None:
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    for name in ("context.json", "outcome.line", "stdout", "stderr"):
        (decoy / name).write_bytes(b"")
    swap = (
        "#!/bin/sh\n"
        'mv "$FLOW_CONTROL_DIR" "$FLOW_CONTROL_DIR.moved"\n'
        f'ln -s {decoy} "$FLOW_CONTROL_DIR"\n'
    )
    job = flow.submit(write_program(scripts, "swap.sh", swap))
    assert managers.run(flow.root) in (0, 1)  # how it ends is not the point
    assert flow.state(job["key"]) in ("succeeded", "failed")
    assert sorted(os.listdir(decoy)) == ["context.json", "outcome.line", "stderr", "stdout"]
    assert (flow.job_dir(job) / "a0001").is_symlink()


def test_keep_attempt_files_keeps_every_file(
    tmp_path: Path, scripts: Path, managers: Managers
) -> None:
    root = str(tmp_path / "kept")
    r = CliRunner().invoke(
        cli,
        ["init", root, "--keep-attempt-files", "--json"],
    )
    assert r.exit_code == 0, r.output
    assert orjson.loads(r.stdout)["keep_attempt_files"] is True
    policy = orjson.loads((Path(root) / ".flow" / "format.json").read_bytes())["policy"]
    assert policy["keep_attempt_files"] is True
    flow = Flow(root, CliRunner())
    job = flow.submit(write_program(scripts, "api.sh", API_SILENT))
    assert managers.run(root) == 0
    assert inodes(flow.job_dir(job)) == [
        ".",
        "a0001",
        "a0001/context.json",
        "a0001/outcome.line",
        "a0001/stderr",
        "a0001/stdout",
        "job.json",
        "run",
    ]


def test_a_default_workspace_does_not_name_the_new_policy_key(root: str) -> None:
    # so a manager of the previous revision still opens it (it refuses unknown keys)
    policy = orjson.loads((Path(root) / ".flow" / "format.json").read_bytes())["policy"]
    assert "keep_attempt_files" not in policy


#: outcomes whose file holds more than the frames: one that is no outcome at all, and one
#: whose message is longer than the frames keep
BAD_LINE = """#!/bin/sh
printf '{"action":"succeed","message":"x","bogus":\\n' >"$FLOW_CONTROL_DIR/outcome.line"
"""
LONG = '#!/usr/bin/env bash\nsource "$FLOW_BASH_API"\nflow_steps main\n'
LONG += 'step_main() { flow_succeed "$(printf "%05000d" 7)"; }\nflow_main "$@"\n'

#: leaves a process in its group that, on TERM, still writes into the workdir
CHECKPOINTS = """#!/bin/bash
( trap 'sleep 0.3; echo ckpt >ckpt' TERM; : >armed; while :; do sleep 0.1; done ) &
while [[ ! -e armed ]]; do sleep 0.02; done  # its trap is set before the attempt ends
exit 0
"""


def test_an_outcome_the_frames_do_not_hold_whole_is_kept(
    flow: Flow, scripts: Path, managers: Managers
) -> None:
    bad = flow.submit("--retries", "0", write_program(scripts, "bad.sh", BAD_LINE))
    long = flow.submit(write_program(scripts, "long.sh", LONG))
    assert managers.run(flow.root) == 1  # the bad one failed
    assert flow.show(bad["key"])["failure"]["code"] == "protocol_error"
    line = flow.job_dir(bad) / "a0001" / "outcome.line"
    assert line.read_bytes() == b'{"action":"succeed","message":"x","bogus":\n'
    assert flow.state(long["key"]) == "succeeded"
    kept = flow.job_dir(long) / "a0001" / "outcome.line"
    assert orjson.loads(kept.read_bytes())["message"] == "0" * 4999 + "7"
    assert not (flow.job_dir(long) / "a0001" / "context.json").exists()


def test_a_workdir_a_leftover_process_still_works_in_is_kept(
    flow: Flow, scripts: Path, managers: Managers
) -> None:
    job = flow.submit(write_program(scripts, "ckpt.sh", CHECKPOINTS))
    assert managers.run(flow.root, "--kill-grace", "5s") == 0
    assert (flow.job_dir(job) / "run" / "ckpt").read_text() == "ckpt\n"
    # and its output stays where the leftover process may still write to it
    assert (flow.job_dir(job) / "a0001" / "stderr").is_file()
