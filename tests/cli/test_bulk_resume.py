"""A bulk `flow submit` is one resumable batch: a real 20,000-line submission interrupted
by real signals (SIGINT, SIGTERM, a second SIGINT, SIGKILL) and then run again ends with
exactly its 20,000 jobs, no payload without its marker and no staging directory left;
`flow fsck --repair` completes what a SIGKILL left as well."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

FLOW = [sys.executable, "-m", "httk_flow"]
N = 20_000
#: jobs per publish batch (protocol/submit.py BATCH): an interrupt stops at a multiple
BATCH = 512
#: the interrupt points, in jobs already published when the signal is sent: drawn
#: (seeded) across the submission, plus the very first batch (0) and near the end
_DRAWN = sorted(random.Random(20_000).sample(range(BATCH, N - 4 * BATCH), 3))
POINTS = [0, *_DRAWN, N - 3 * BATCH]


@pytest.fixture(scope="module")
def deck(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("deck") / "jobs.jsonl"
    path.write_bytes(b"".join(orjson.dumps({"params": {"i": i}}) + b"\n" for i in range(N)))
    return path


def fresh(tmp_path: Path, name: str = "ws") -> str:
    root = str(tmp_path / name)
    subprocess.run([*FLOW, "init", root], check=True, capture_output=True)
    return root


def start(root: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*FLOW, "-w", root, "submit", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def submit(root: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*FLOW, "-w", root, "submit", *args], capture_output=True, text=True, timeout=600
    )


def record(root: str) -> dict[str, object] | None:
    """The one batch record of the workspace, once the batch started."""
    d = Path(root, ".flow", "batches")
    found = list(d.glob("*.json")) if d.is_dir() else []
    if not found:
        return None
    [path] = found
    doc: dict[str, object] = orjson.loads(path.read_bytes())
    return doc


def signal_at(proc: subprocess.Popen[str], root: str, at: int, sig: int) -> None:
    """Send `sig` once the batch has `at` jobs in (0: as soon as publishing starts)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        rec = record(root)
        if rec is not None and int(str(rec["submitted"])) >= at:
            os.kill(proc.pid, sig)
            return
        assert proc.poll() is None, f"the submission ended before {at} jobs: {proc.stderr}"
        time.sleep(0.002)
    raise AssertionError(f"the batch did not reach {at} jobs")


def markers(root: str) -> list[str]:
    """The names of every marker of the workspace."""
    out: list[str] = []
    for _, _, files in os.walk(Path(root, ".flow", "state")):
        out.extend(files)
    return out


def unborn(root: str) -> list[Path]:
    """Job directories whose birth marker is still inside (payloads without a marker)."""
    return [p.parent for p in Path(root, "jobs").glob("*/*/.birth.*")]


def leftovers(root: str) -> list[str]:
    return sorted(os.listdir(Path(root, ".flow", "tmp")))


def interrupted(n: int, key: str, again: str = "") -> str:
    return (
        f"flow: interrupted{again}: {n:,} of {N:,} jobs submitted (batch {key}); "
        "run the same command again to submit the rest\n"
    )


def assert_whole(root: str, ids: set[str]) -> None:
    """Exactly the batch's N jobs, each with one marker, nothing half-made left."""
    names = markers(root)
    assert len(names) == N and len({m.split(".")[0] for m in names}) == N
    assert ids == {m.split(".")[0] for m in names}
    assert unborn(root) == []
    assert leftovers(root) == []
    rec = record(root)
    assert rec is not None and (rec["submitted"], rec["complete"]) == (N, True)


@pytest.mark.parametrize("at", POINTS, ids=[f"at-{p}" for p in POINTS])
def test_an_interrupted_submission_is_completed_by_the_same_command(
    tmp_path: Path, deck: Path, at: int
) -> None:
    root = fresh(tmp_path)
    proc = start(root, "--from", str(deck), "true")
    signal_at(proc, root, at, signal.SIGINT)
    out, err = proc.communicate(timeout=600)
    rec = record(root)
    assert rec is not None
    key = str(rec["batch"])
    n = len(markers(root))
    assert (proc.returncode, err) == (130, interrupted(n, key))
    # it stopped between two publish batches: the one in flight went in whole
    assert n % BATCH == 0 and at <= n < N and rec["submitted"] == n
    assert at > 0 or n == BATCH, "an interrupt in the first batch stops after it"
    assert unborn(root) == [] and leftovers(root) == []
    first = out.split()
    assert len(first) == n
    again = submit(root, "--from", str(deck), "true")
    assert (again.returncode, again.stderr) == (
        0,
        f"batch {key}: {n:,} of {N:,} were in already; {N - n:,} submitted now\n",
    )
    rest = again.stdout.split()
    assert len(rest) == N - n
    assert_whole(root, {*first, *rest})


def test_sigterm_stops_the_same_way_with_exit_143(tmp_path: Path, deck: Path) -> None:
    root = fresh(tmp_path)
    proc = start(root, "--from", str(deck), "true")
    signal_at(proc, root, 4 * BATCH, signal.SIGTERM)
    _, err = proc.communicate(timeout=600)
    rec = record(root)
    assert rec is not None
    n = len(markers(root))
    assert (proc.returncode, err) == (143, interrupted(n, str(rec["batch"])))
    assert unborn(root) == [] and leftovers(root) == []


def test_a_second_ctrl_c_stops_inside_the_batch_and_the_next_run_completes_it(
    tmp_path: Path, deck: Path
) -> None:
    root = fresh(tmp_path)
    proc = start(root, "--from", str(deck), "true")
    signal_at(proc, root, 8 * BATCH, signal.SIGINT)
    time.sleep(0.02)  # two signals at once would be one
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=600)
    rec = record(root)
    assert rec is not None
    key = str(rec["batch"])
    n = len(markers(root))
    # the count is of whole publish batches: one stopped inside is the next run's
    counted = int(err.split(": ")[2].split(" of ")[0].replace(",", ""))
    assert counted <= n
    assert proc.returncode == 130
    assert err in (interrupted(counted, key, " again"), interrupted(n, key))
    again = submit(root, "--from", str(deck), "true")
    assert again.returncode == 0, again.stderr
    assert_whole(root, {m.split(".")[0] for m in markers(root)})


def _kill9_mid_batch(tmp_path: Path, deck: Path) -> tuple[str, str]:
    """A submission SIGKILLed right after the 5,100th payload rename: 4,608 jobs whole,
    492 payloads without their marker, 20 staging directories."""
    root = fresh(tmp_path)
    r = subprocess.run(
        [*FLOW, "-w", root, "submit", "--from", str(deck), "true"],
        env={**os.environ, "FLOW_CRASH_AT": "submit.after_payload:5100"},
        capture_output=True,
        timeout=600,
    )
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert len(markers(root)) == 9 * BATCH
    assert len(unborn(root)) == 5100 - 9 * BATCH
    assert len([n for n in leftovers(root) if n.startswith("job-")]) == 10 * BATCH - 5100
    rec = record(root)
    assert rec is not None
    return root, str(rec["batch"])


def test_a_kill_9_is_completed_by_running_the_same_command_again(
    tmp_path: Path, deck: Path
) -> None:
    root, key = _kill9_mid_batch(tmp_path, deck)
    again = submit(root, "--from", str(deck), "true")
    # the payloads found in count as in; their markers were completed, not duplicated
    assert (again.returncode, again.stderr) == (
        0,
        f"batch {key}: 5,100 of {N:,} were in already; 14,900 submitted now\n",
    )
    assert_whole(root, {m.split(".")[0] for m in markers(root)})


def test_a_kill_9_is_completed_by_fsck_repair_and_then_the_command(
    tmp_path: Path, deck: Path
) -> None:
    root, key = _kill9_mid_batch(tmp_path, deck)
    fsck = subprocess.run([*FLOW, "-w", root, "fsck", "--repair"], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
    lines = fsck.stdout.splitlines()
    assert sum(x.endswith("; published it") for x in lines) == 5100 - 9 * BATCH
    assert sum(x.startswith("repaired: stale_tmp: ") for x in lines) == 10 * BATCH - 5100
    assert len(markers(root)) == 5100 and unborn(root) == [] and leftovers(root) == []
    clean = subprocess.run([*FLOW, "-w", root, "fsck"], capture_output=True, text=True)
    assert (clean.returncode, clean.stdout.splitlines()[-1]) == (0, "clean")
    again = submit(root, "--from", str(deck), "true")
    assert (again.returncode, again.stderr) == (
        0,
        f"batch {key}: 5,100 of {N:,} were in already; 14,900 submitted now\n",
    )
    assert_whole(root, {m.split(".")[0] for m in markers(root)})


def test_an_identical_rerun_submits_nothing_new(tmp_path: Path, deck: Path) -> None:
    root = fresh(tmp_path)
    first = submit(root, "--from", str(deck), "true")
    assert (first.returncode, first.stderr, len(first.stdout.split())) == (0, "", N)
    rec = record(root)
    assert rec is not None
    key = str(rec["batch"])
    assert key.startswith("b-") and len(key) == 14 and str(rec["digest"]).startswith(key[2:])
    again = submit(root, "--from", str(deck), "true")
    assert (again.returncode, again.stdout, again.stderr) == (
        0,
        "",
        f"batch {key}: all {N:,} jobs were submitted already; nothing new "
        "(give --batch-id to submit again)\n",
    )
    doc = orjson.loads(submit(root, "--json", "--from", str(deck), "true").stdout)
    assert doc == {
        "jobs": [],
        "group": key,  # a batch is one group, named after it
        "batch": key,
        "already": N,
        "submitted": 0,
        "complete": True,
    }


def test_the_same_batch_id_with_another_input_is_refused(tmp_path: Path) -> None:
    root = fresh(tmp_path)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"tag": "a"}\n{"tag": "b"}\n')
    b.write_text('{"tag": "a"}\n{"tag": "c"}\n')
    assert submit(root, "--batch-id", "mine", "--from", str(a), "true").returncode == 0
    rec = record(root)
    assert rec is not None
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(str(rec["created"]))))
    refused = (
        f"flow: error: batch mine: was submitted from another input or with other options "
        f"(2 jobs, {when}, by {rec['by']}); give another --batch-id to submit this as a new "
        "batch; this --batch-id is resumed only by the very command that started it\n"
    )
    for other in (
        ("--from", str(b), "true"),  # another input
        ("--priority", "900", "--from", str(a), "true"),  # another option
    ):
        r = submit(root, "--batch-id", "mine", *other)
        assert (r.returncode, r.stdout, r.stderr) == (2, "", refused)
    assert len(markers(root)) == 2
    # another id is another batch: the same input submitted a second time
    other = orjson.loads(
        submit(root, "--batch-id", "b2", "--json", "--from", str(a), "true").stdout
    )
    assert (other["batch"], other["already"], other["submitted"], len(other["jobs"])) == (
        "b2",
        0,
        2,
        2,
    )
    assert len(markers(root)) == 4
    bad = submit(root, "--batch-id", "no way", "--from", str(a), "true")
    assert (bad.returncode, bad.stderr) == (
        2,
        "flow: error: --batch-id 'no way': a batch id is 1-64 characters of letters, "
        "digits, '_', '+' and '-', starting with a letter or digit\n",
    )


def test_an_array_is_resumable_the_same_way(tmp_path: Path) -> None:
    root = fresh(tmp_path)
    args = ("--array", f"1-{N}", "true")
    proc = start(root, *args)
    signal_at(proc, root, N // 2, signal.SIGINT)
    out, err = proc.communicate(timeout=600)
    rec = record(root)
    assert rec is not None
    key, n = str(rec["batch"]), len(markers(root))
    assert (proc.returncode, err) == (130, interrupted(n, key))
    again = submit(root, *args)
    assert (again.returncode, again.stderr) == (
        0,
        f"batch {key}: {n:,} of {N:,} were in already; {N - n:,} submitted now\n",
    )
    assert_whole(root, {*out.split(), *again.stdout.split()})
    # another spec is another batch
    other = submit(root, "--array", "1-10", "true")
    assert (other.returncode, other.stderr, len(other.stdout.split())) == (0, "", 10)
    assert len(markers(root)) == N + 10


def test_an_interrupt_before_publishing_submits_nothing(tmp_path: Path) -> None:
    root = fresh(tmp_path)
    proc = subprocess.Popen(
        [*FLOW, "-w", root, "submit", "--from", "-", "true"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None
    proc.stdin.write('{"tag": "a"}\n')
    proc.stdin.flush()
    time.sleep(1.0)  # it is reading stdin, which stays open
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (
        130,
        "",
        "flow: interrupted before any job was submitted\n",
    )
    assert markers(root) == [] and record(root) is None


def test_a_single_job_has_no_batch_and_is_always_submitted(tmp_path: Path) -> None:
    root = fresh(tmp_path)
    for _ in range(2):
        r = submit(root, "--json", "true")
        assert r.returncode == 0 and list(orjson.loads(r.stdout)) == ["jobs", "group"]
    assert len(markers(root)) == 2 and record(root) is None
    r = submit(root, "--batch-id", "x", "true")
    assert (r.returncode, r.stderr) == (
        2,
        "flow: error: --batch-id x: names a batch of --from or --array; a single job is "
        "always submitted\n",
    )
