"""`flow submit --input` takes regular files and directories of them, within a size limit:
a FIFO (alone or inside a directory), a device such as /dev/zero, a socket, a link to one,
or inputs past the limit are refused with one `flow: error:` line naming the input and
the next step, exit status 2, no traceback, and no job created. The copy itself never
opens anything but a regular file, so a swap after the check cannot hang it."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from manager.support import FLOW

from httk_flow.errors import UsageError
from httk_flow.protocol.inputs import DEFAULT_INPUT_MAX, check_inputs, copy_inputs, parse_size

#: a hung submission must fail the test, not hang the suite
TIMEOUT = 30


def submit(root: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The real `flow submit` in a process of its own; the job runs `true`."""
    return subprocess.run(
        [*FLOW, "-w", root, "submit", *args, "true"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        stdin=subprocess.DEVNULL,
    )


def assert_refused(root: str, r: subprocess.CompletedProcess[str], error: str) -> None:
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"flow: error: {error}\n")
    assert_no_job(root)


def assert_no_job(root: str) -> None:
    flow = Path(root) / ".flow"
    assert [p for p in (flow / "state").rglob("*") if p.is_file()] == []
    assert list((flow / "tmp").iterdir()) == []
    assert [p.name for p in Path(root).iterdir()] == [".flow"]


NOT_REGULAR_HINT = "give a regular file (copy what the job needs into one first)"
INSIDE_HINT = "remove it from the directory, or give the job's files one by one"
LIMIT_HINT = (
    "raise the limit with --input-max SIZE (e.g. --input-max 8G), or leave large data "
    "where it is and pass its path as a parameter"
)


def not_regular(path: object, kind: str) -> str:
    """The error for an input that is a `kind` ("a socket", ...) rather than a file."""
    return f"input '{path}': is {kind}, not a regular file or a directory; " + NOT_REGULAR_HINT


def past_limit(path: object, limit: str, size: str) -> str:
    """The error for an input that takes the job's inputs past `limit` (to `size` at least)."""
    return (
        f"input '{path}': takes the job's inputs past the {limit} limit (at least {size}); "
        + LIMIT_HINT
    )


@pytest.fixture
def data(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    return d


@pytest.fixture
def fifo(data: Path) -> Path:
    path = data / "pipe"
    os.mkfifo(path)
    return path


@pytest.fixture
def sock(tmp_path: Path) -> Iterator[Path]:
    # a short path: a unix socket's name is limited to about 100 bytes
    path = Path(f"/tmp/flow-test-{os.getpid()}-{threading.get_ident() % 10000}.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    try:
        yield path
    finally:
        s.close()
        path.unlink(missing_ok=True)


def test_a_fifo_is_refused_without_hanging(root: str, fifo: Path) -> None:
    r = submit(root, "--input", str(fifo))
    assert_refused(root, r, not_regular(fifo, "a named pipe (FIFO)"))


def test_a_directory_holding_a_fifo_is_refused_naming_the_fifo(root: str, data: Path) -> None:
    deck = data / "deck"
    (deck / "sub").mkdir(parents=True)
    (deck / "POSCAR").write_text("Si\n")
    os.mkfifo(deck / "sub" / "pipe")
    r = submit(root, "--input", str(deck))
    assert_refused(
        root,
        r,
        f"input '{deck}': holds '{deck}/sub/pipe', a named pipe (FIFO), which is not a "
        "regular file; " + INSIDE_HINT,
    )


def test_dev_zero_is_refused_rather_than_copied_until_the_disk_is_full(root: str) -> None:
    r = submit(root, "--input", "/dev/zero")
    assert_refused(root, r, not_regular("/dev/zero", "a character device"))


def test_a_socket_is_refused(root: str, sock: Path) -> None:
    r = submit(root, "--input", str(sock))
    assert_refused(root, r, not_regular(sock, "a socket"))


def test_a_symlink_to_a_fifo_is_refused_but_one_inside_a_directory_is_copied_as_a_link(
    root: str, data: Path, fifo: Path
) -> None:
    link = data / "link"
    link.symlink_to(fifo)
    r = submit(root, "--input", str(link))
    assert_refused(root, r, not_regular(link, "a named pipe (FIFO)"))
    deck = data / "deck"
    deck.mkdir()
    (deck / "in.txt").write_text("x\n")
    (deck / "pipe-link").symlink_to(fifo)
    r = submit(root, "--json", "--input", str(deck))
    assert r.returncode == 0, r.stderr
    [job] = orjson.loads(r.stdout)["jobs"]
    files = Path(root) / job["placement"] / job["key"] / "files" / "deck"
    assert (files / "in.txt").read_text() == "x\n"
    assert (files / "pipe-link").is_symlink()
    assert os.readlink(files / "pipe-link") == str(fifo)


def test_a_missing_input_names_itself(root: str, data: Path) -> None:
    r = submit(root, "--input", str(data / "nope.xyz"))
    assert_refused(root, r, f"input '{data}/nope.xyz': does not exist; check the path")


def test_inputs_past_the_default_limit_are_refused_unless_it_is_raised(
    root: str, data: Path
) -> None:
    big = data / "big.bin"
    with open(big, "wb") as fh:
        fh.truncate(2 * DEFAULT_INPUT_MAX)  # sparse: nothing is read to refuse it
    r = submit(root, "--input", str(big))
    assert_refused(root, r, past_limit(big, "1.0 GiB", "2.0 GiB"))
    small = data / "small.bin"
    small.write_bytes(b"s" * (2 << 20))
    r = submit(root, "--input-max", "1M", "--input", str(small))
    assert_refused(root, r, past_limit(small, "1.0 MiB", "2.0 MiB"))
    r = submit(root, "--json", "--input-max", "3M", "--input", str(small))
    assert r.returncode == 0, r.stderr
    [job] = orjson.loads(r.stdout)["jobs"]
    copied = Path(root) / job["placement"] / job["key"] / "files" / "small.bin"
    assert copied.read_bytes() == small.read_bytes()


def test_the_limit_counts_every_input_and_every_file_of_a_directory(root: str, data: Path) -> None:
    deck = data / "deck"
    deck.mkdir()
    for i in range(3):
        (deck / f"part{i}").write_bytes(b"p" * (400 << 10))
    one = data / "one.bin"
    one.write_bytes(b"o" * (400 << 10))
    r = submit(root, "--input-max", "1M", "--input", str(one), "--input", str(deck))
    assert_refused(root, r, past_limit(deck, "1.0 MiB", "1.2 MiB"))


def test_an_input_max_that_is_not_a_size_is_a_usage_error(root: str, data: Path) -> None:
    f = data / "f"
    f.write_text("x")
    r = submit(root, "--input-max", "2X", "--input", str(f))
    assert_refused(
        root,
        r,
        "--input-max '2X': is not a size; write e.g. 500M, 2G or 1.5T (K, M, G, T are "
        "powers of 1024; a plain number is bytes)",
    )


def test_a_fifo_named_in_a_jsonl_line_is_refused_naming_the_line(
    root: str, data: Path, fifo: Path
) -> None:
    lines = data / "jobs.jsonl"
    lines.write_text('{"tag": "ok"}\n' + orjson.dumps({"inputs": [str(fifo)]}).decode() + "\n")
    r = subprocess.run(
        [*FLOW, "-w", root, "submit", "--from", str(lines), "true"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"flow: error: {lines}:2: "), r.stderr
    assert "is a named pipe (FIFO)" in r.stderr
    assert_no_job(root)


# -- the functions themselves -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4096", 4096),
        ("500M", 500 << 20),
        ("2G", 2 << 30),
        ("1.5GiB", 3 << 29),
        ("8k", 8192),
        ("3 MB", 3 << 20),
    ],
)
def test_sizes_are_read_in_binary_units(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "G", "-1M", "2X", "1e9", "two", "2iB"])
def test_what_is_not_a_size_is_refused(text: str) -> None:
    with pytest.raises(UsageError, match="is not a size"):
        parse_size(text)


def _within(seconds: float, fn: object) -> BaseException | None:
    """Run `fn` in a thread; fail if it has not returned within `seconds` (a hang)."""
    caught: list[BaseException] = []

    def run() -> None:
        try:
            fn()  # type: ignore[operator]
        except BaseException as e:
            caught.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "the copy blocked"
    return caught[0] if caught else None


def test_a_file_swapped_for_a_fifo_after_the_check_is_refused_by_the_copy_without_blocking(
    data: Path, tmp_path: Path
) -> None:
    deck = data / "deck"
    deck.mkdir()
    victim = deck / "in.dat"
    victim.write_text("data\n")
    check_inputs([str(deck)], DEFAULT_INPUT_MAX)
    victim.unlink()
    os.mkfifo(victim)
    err = _within(10, lambda: copy_inputs([str(deck)], str(tmp_path / "files"), DEFAULT_INPUT_MAX))
    assert isinstance(err, UsageError), err
    assert str(victim) in err.message and "named pipe" in err.message


def test_a_top_level_file_swapped_for_a_fifo_after_the_check_is_refused_too(
    data: Path, tmp_path: Path
) -> None:
    victim = data / "in.dat"
    victim.write_text("data\n")
    check_inputs([str(victim)], DEFAULT_INPUT_MAX)
    victim.unlink()
    os.mkfifo(victim)
    err = _within(
        10, lambda: copy_inputs([str(victim)], str(tmp_path / "files"), DEFAULT_INPUT_MAX)
    )
    assert isinstance(err, UsageError) and "named pipe" in err.message, err


def test_a_file_that_grows_after_the_check_stops_the_copy_at_the_limit(
    data: Path, tmp_path: Path
) -> None:
    grows = data / "log"
    grows.write_bytes(b"g" * 1000)
    check_inputs([str(grows)], 4096)
    grows.write_bytes(b"g" * 100_000)
    with pytest.raises(UsageError, match=r"past the 4\.0 KiB limit"):
        copy_inputs([str(grows)], str(tmp_path / "files"), 4096)
    copied = tmp_path / "files" / "log"
    assert copied.stat().st_size <= 4096


def test_a_copy_keeps_contents_modes_times_and_inner_links(data: Path, tmp_path: Path) -> None:
    deck = data / "deck"
    (deck / "sub").mkdir(parents=True)
    (deck / "run.sh").write_text("#!/bin/sh\n")
    (deck / "run.sh").chmod(0o750)
    (deck / "sub" / "x").write_bytes(b"\0\1\2" * 5000)
    (deck / "sub" / "up").symlink_to("../run.sh")
    os.utime(deck / "sub" / "x", (1_600_000_000, 1_600_000_000))
    single = data / "single.txt"
    single.write_text("one\n")
    paths = [str(deck), str(single)]
    check_inputs(paths, DEFAULT_INPUT_MAX)
    copy_inputs(paths, str(tmp_path / "files"), DEFAULT_INPUT_MAX)
    out = tmp_path / "files"
    assert sorted(p.name for p in out.iterdir()) == ["deck", "single.txt"]
    assert (out / "single.txt").read_text() == "one\n"
    assert (out / "deck" / "sub" / "x").read_bytes() == (deck / "sub" / "x").read_bytes()
    assert (out / "deck" / "run.sh").stat().st_mode & 0o777 == 0o750
    assert (out / "deck" / "sub" / "x").stat().st_mtime == 1_600_000_000
    assert os.readlink(out / "deck" / "sub" / "up") == "../run.sh"


def test_two_inputs_of_one_name_are_refused(data: Path) -> None:
    (data / "a").mkdir()
    (data / "b").mkdir()
    (data / "a" / "in.xyz").write_text("a")
    (data / "b" / "in.xyz").write_text("b")
    with pytest.raises(UsageError, match=r"would be copied to files/in\.xyz"):
        check_inputs([str(data / "a" / "in.xyz"), str(data / "b" / "in.xyz")], 1 << 20)
