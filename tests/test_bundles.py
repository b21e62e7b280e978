"""Programs with their files, in the protocol: the tree digest of a bundle, its store
(deduplicated, read-only, published by one rename), what a bundle refuses, the shapes of
job.json's `program`, and the digest check of a program run in place."""

from __future__ import annotations

import hashlib
import os
import stat
import time
from pathlib import Path

import orjson
import pytest

from httk_flow.errors import InvalidJob, UsageError
from httk_flow.protocol import jobs, layout
from httk_flow.protocol.bundles import scan
from httk_flow.protocol.jobspec import JobSpec, Program, parse_program
from httk_flow.protocol.programs import InPlaceCheck, executable, missing, program_env
from httk_flow.protocol.submit import SubmitRequest, Submitter
from httk_flow.protocol.transition import locate_key
from httk_flow.protocol.workspace import Workspace


def write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def app(base: Path) -> Path:
    """A program directory: run.sh, the lib.sh it sources, data in a subdirectory."""
    write(base / "run.sh", '#!/bin/bash\nsource "$(dirname "$0")/lib.sh"\n', 0o755)
    write(base / "lib.sh", "greet() { echo hi; }\n")
    write(base / "data" / "table.txt", "1 2 3\n")
    return base


def tree_of(root: Path) -> dict[str, tuple[str, int]]:
    """Every entry below root: relative path -> (kind, permission bits)."""
    out = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = Path(d) / n
            st = p.lstat()
            kind = "d" if stat.S_ISDIR(st.st_mode) else "l" if p.is_symlink() else "f"
            out[str(p.relative_to(root))] = (kind, stat.S_IMODE(st.st_mode))
    return out


# -- the tree digest --------------------------------------------------------------------


def test_the_tree_digest_covers_paths_modes_and_contents_only(tmp_path: Path) -> None:
    a, b = app(tmp_path / "a"), app(tmp_path / "b")
    os.utime(b / "lib.sh", (1, 1))  # times are not part of it
    assert scan(str(a)).digest == scan(str(b)).digest
    base = scan(str(a)).digest
    (b / "lib.sh").chmod(0o755)
    assert scan(str(b)).digest != base  # the executable bit is
    (b / "lib.sh").chmod(0o600)
    assert scan(str(b)).digest == base  # other permission bits are not
    (b / "lib.sh").rename(b / "lib2.sh")
    assert scan(str(b)).digest != base
    (b / "lib2.sh").rename(b / "lib.sh")
    (b / "data" / "table.txt").write_text("1 2 4\n")
    assert scan(str(b)).digest != base
    (b / "data" / "table.txt").write_text("1 2 3\n")
    (b / "empty").mkdir()
    assert scan(str(b)).digest != base  # an empty directory is part of the tree
    (b / "empty").rmdir()
    write(b / "__pycache__" / "lib.cpython-311.pyc", "cache")
    assert scan(str(b)).digest == base  # Python's caches are not


# -- the store ----------------------------------------------------------------------------


def test_a_bundle_is_stored_read_only_and_an_identical_tree_stores_nothing(
    ws: Workspace, tmp_path: Path
) -> None:
    src = app(tmp_path / "app")
    sub = Submitter(ws)
    [first] = sub.submit([SubmitRequest(program=str(src / "run.sh"), bundle=str(src))])
    digest = scan(str(src)).digest
    assert first.program == Program(
        bundle=digest, path="run.sh", name="run.sh", source=str(src / "run.sh")
    )
    stored = Path(layout.bundle_dir(ws.root, digest))
    assert tree_of(stored) == {
        "data": ("d", 0o755),
        "data/table.txt": ("f", 0o444),
        "lib.sh": ("f", 0o444),
        "run.sh": ("f", 0o555),
    }
    assert (stored / "lib.sh").read_text() == "greet() { echo hi; }\n"
    before = {p: p.stat().st_ino for p in stored.rglob("*")}
    # a copy of the tree elsewhere, submitted by another process: nothing is written
    again = app(tmp_path / "copy")
    [second] = Submitter(ws).submit(
        [SubmitRequest(program=str(again / "run.sh"), bundle=str(again))]
    )
    assert second.program.bundle == digest
    assert {p: p.stat().st_ino for p in stored.rglob("*")} == before
    assert os.listdir(layout.bundles_dir(ws.root)) == [digest]
    assert os.listdir(ws.tmp) == []
    # registration finds the bundle; a job whose bundle is gone is a protocol error
    h = locate_key(ws, second.placement, second.key)
    assert h is not None
    assert jobs.register(ws, h, actor="test").state.value == "ready"
    assert missing(ws, second.program) is None
    assert missing(ws, Program(bundle="0" * 64, path="run.sh")) == (
        f"names a bundle that is not in the bundle store ({'0' * 64})"
    )


def test_an_array_stores_its_bundle_once(ws: Workspace, tmp_path: Path) -> None:
    src = app(tmp_path / "app")
    reqs = [
        SubmitRequest(program=str(src / "run.sh"), bundle=str(src), array_index=i) for i in range(5)
    ]
    specs = list(Submitter(ws).submit(reqs))
    assert {s.program.bundle for s in specs} == {scan(str(src)).digest}
    assert len(os.listdir(layout.bundles_dir(ws.root))) == 1


def test_where_a_bundled_program_runs_and_what_it_is_told(ws: Workspace) -> None:
    p = Program(bundle="a" * 64, path="bin/run.sh", name="run.sh", source="/home/u/app/bin/run.sh")
    where = layout.bundle_dir(ws.root, "a" * 64)
    assert executable(ws, p) == f"{where}/bin/run.sh"
    assert program_env(ws, p) == {
        "FLOW_PROGRAM_SOURCE": "/home/u/app/bin/run.sh",
        "FLOW_BUNDLE_DIR": where,
    }
    stored = Program(digest="b" * 64, name="x.sh", source="/home/u/x.sh")
    assert executable(ws, stored) == ws.program_path("b" * 64)
    assert program_env(ws, stored) == {"FLOW_PROGRAM_SOURCE": "/home/u/x.sh"}
    here = Program(digest="c" * 64, path="/home/u/y.sh", name="y.sh", in_place=True)
    assert executable(ws, here) == "/home/u/y.sh"
    assert program_env(ws, here) == {"FLOW_PROGRAM_SOURCE": "/home/u/y.sh"}
    assert program_env(ws, Program(command="true", name="true")) == {}


# -- what a bundle refuses ----------------------------------------------------------------


def refused(ws: Workspace, program: Path, bundle: Path, **kw: int) -> str:
    with pytest.raises(UsageError) as e:
        Submitter(ws).build(SubmitRequest(program=str(program), bundle=str(bundle), **kw))
    assert not os.path.exists(layout.bundles_dir(ws.root)) or not os.listdir(
        layout.bundles_dir(ws.root)
    )
    assert os.listdir(ws.tmp) == []
    return e.value.render()


def test_a_program_outside_the_bundle_is_refused_naming_both(ws: Workspace, tmp_path: Path) -> None:
    src = app(tmp_path / "app")
    other = write(tmp_path / "other.sh", "#!/bin/sh\n", 0o755)
    assert refused(ws, other, src) == (
        f"program '{other}': is not inside the bundle directory '{src}'; "
        "give the program as a path inside the bundle directory"
    )
    assert refused(ws, src, src).startswith(f"program '{src}': is not inside")


def test_links_out_of_the_tree_and_files_that_are_not_regular_are_refused(
    ws: Workspace, tmp_path: Path
) -> None:
    src = app(tmp_path / "app")
    run = src / "run.sh"
    (src / "out").symlink_to("/etc/hostname")
    assert refused(ws, run, src) == (
        f"bundle '{src}': holds 'out', a symbolic link to '/etc/hostname' outside the "
        "bundle; copy what it names into the directory, or give it with --input"
    )
    (src / "out").unlink()
    (src / "dirlink").symlink_to("data")
    assert "holds 'dirlink', a symbolic link to 'data', which is not a regular file" in (
        refused(ws, run, src)
    )
    (src / "dirlink").unlink()
    (src / "dangling").symlink_to("nothing")
    assert "holds 'dangling', a symbolic link to nothing ('nothing')" in refused(ws, run, src)
    (src / "dangling").unlink()
    os.mkfifo(src / "data" / "pipe")
    assert "holds 'data/pipe', which is not a regular file or a directory" in (
        refused(ws, run, src)
    )


def test_a_link_to_a_file_inside_the_tree_is_stored_as_that_file(
    ws: Workspace, tmp_path: Path
) -> None:
    src = app(tmp_path / "app")
    (src / "data" / "lib-link.sh").symlink_to("../lib.sh")
    [spec] = Submitter(ws).submit([SubmitRequest(program=str(src / "run.sh"), bundle=str(src))])
    stored = Path(layout.bundle_dir(ws.root, spec.program.bundle or ""))
    assert tree_of(stored)["data/lib-link.sh"] == ("f", 0o444)
    assert (stored / "data" / "lib-link.sh").read_text() == (src / "lib.sh").read_text()


def test_a_bundle_past_its_cap_or_holding_the_workspace_is_refused(
    ws: Workspace, tmp_path: Path
) -> None:
    src = app(tmp_path / "app")
    write(src / "data" / "big.bin", "x" * 5000)
    assert refused(ws, src / "run.sh", src, bundle_max=4096) == (
        f"bundle '{src}': holds more than the 4.0 KiB a bundle may (at least 4.9 KiB); a "
        "bundle is the program and the small files it needs; give data with --input, or "
        "leave it on shared storage and pass its path as a parameter; or raise the cap "
        "with --bundle-max SIZE"
    )
    home = Path(ws.root).parent
    write(home / "run2.sh", "#!/bin/sh\n", 0o755)
    assert refused(ws, home / "run2.sh", home) == (
        f"bundle '{home}': holds the workspace '{ws.root}'; put the program and its files "
        "in a directory of their own"
    )


def test_a_bundle_cannot_run_in_place(ws: Workspace, tmp_path: Path) -> None:
    src = app(tmp_path / "app")
    with pytest.raises(UsageError, match="cannot be combined with --in-place"):
        Submitter(ws).build(
            SubmitRequest(program=str(src / "run.sh"), bundle=str(src), in_place=True)
        )


# -- job.json's program --------------------------------------------------------------------


def test_every_program_shape_reads_back_and_old_ones_read_as_before() -> None:
    d = "d" * 64
    old = parse_program({"digest": d, "name": "run.sh"})
    assert old == Program(digest=d, name="run.sh")
    assert old.to_json() == {"digest": d, "name": "run.sh"}  # written as it always was
    assert old.stored == d
    shapes = [
        Program(digest=d, name="run.sh", source="/u/run.sh"),
        Program(bundle=d, path="bin/run.sh", name="run.sh", source="/u/app/bin/run.sh"),
        Program(digest=d, path="/u/run.sh", name="run.sh", in_place=True),
        Program(command="true", name="true"),
    ]
    for p in shapes:
        assert parse_program(orjson.loads(orjson.dumps(p.to_json()))) == p
    assert shapes[2].to_json() == {
        "path": "/u/run.sh",
        "digest": d,
        "in_place": True,
        "name": "run.sh",
    }
    assert shapes[1].stored is None and shapes[2].stored is None
    for bad in (
        {"bundle": d, "path": "../x"},
        {"bundle": d, "path": "/abs"},
        {"bundle": "nope", "path": "x"},
        {"in_place": True, "path": "rel.sh", "digest": d},
        {"in_place": True, "path": "/u/x.sh"},
    ):
        job = {"id": "0" * 32, "key": "0" * 32, "placement": "jobs/00", "program": bad}
        with pytest.raises(InvalidJob, match="member 'program'"):
            JobSpec.from_dict(job, "job.json")


# -- the digest check of a program run in place ---------------------------------------------


def read_bytes_so_far() -> int:
    """Bytes this process has read through read(2) (its /proc io counter)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def in_place(path: Path) -> Program:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return Program(digest=digest, path=str(path), name=path.name, in_place=True)


def test_an_unchanged_program_is_read_once_and_a_changed_one_is_refused(tmp_path: Path) -> None:
    prog = write(tmp_path / "big.sh", "#!/bin/sh\n" + "#" * (8 << 20) + "\n", 0o755)
    old = time.time() - 60
    os.utime(prog, (old, old))
    time.sleep(0.01)
    check = InPlaceCheck(clock=lambda: time.time() + 10)  # its stamps are not recent
    p = in_place(prog)
    t0 = read_bytes_so_far()
    assert check.changed(p) is None
    t1 = read_bytes_so_far()
    assert check.changed(p) is None
    assert check.changed(p) is None
    t2 = read_bytes_so_far()
    assert t1 - t0 >= 8 << 20  # hashed the first time
    assert t2 - t1 < 1 << 20  # and not again: the stat names the same file
    # an edit in place that keeps the size moves the ctime: it is read again, and refused
    with open(prog, "r+b") as fh:
        fh.seek(12)
        fh.write(b"!")
    os.utime(prog, (old, old))  # even with the mtime put back
    why = check.changed(p)
    assert why is not None
    now = hashlib.sha256(prog.read_bytes()).hexdigest()
    assert why == (
        f"the in-place program {prog} changed since it was submitted (sha256 {p.digest}, "
        f"now {now}); the changed code was not run: resubmit to run it, or submit without "
        "--in-place to run a stored copy"
    )
    prog.unlink()
    assert check.changed(p) == (
        f"the in-place program {prog} is gone (it was submitted with sha256 {p.digest}); "
        "resubmit it, or submit without --in-place to run a stored copy"
    )


def test_a_program_written_just_now_is_hashed_at_every_check(tmp_path: Path) -> None:
    # an edit within the filesystem's timestamp tick leaves the stat as it was: a file
    # whose stamps are that recent is never taken from the cache
    prog = write(tmp_path / "fresh.sh", "#!/bin/sh\n" + "#" * (4 << 20) + "\n", 0o755)
    check, p = InPlaceCheck(), in_place(prog)
    assert check.changed(p) is None
    t0 = read_bytes_so_far()
    assert check.changed(p) is None
    assert read_bytes_so_far() - t0 >= 4 << 20


def test_submitting_in_place_keeps_the_path_and_the_digest(ws: Workspace, tmp_path: Path) -> None:
    prog = write(tmp_path / "here.sh", "#!/bin/sh\necho here\n", 0o755)
    [spec] = Submitter(ws).submit([SubmitRequest(program=str(prog), in_place=True)])
    assert spec.program == in_place(prog)
    assert os.listdir(ws.programs) == []  # nothing is stored
    h = locate_key(ws, spec.placement, spec.key)
    assert h is not None
    assert jobs.register(ws, h, actor="test").state.value == "ready"
