"""Tidying a committed attempt: what holds nothing the journal does not is removed.

Done by the manager that commits its own attempt, after the committing frame (which
records the outcome) and before the final rename, while it alone holds the job: no other
process can be making the job's next attempt; or after a direct commit's one rename to
succeeded, a state no attempt follows. So a job whose program printed nothing
ends as three inodes (its directory, job.json, its marker). Every path is opened relative
to a descriptor without following a symbolic link: a program that replaced its attempt
directory with a link cannot make the manager remove files elsewhere.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass

from httk_flow.protocol import layout
from httk_flow.protocol.logstream import MAX_STREAMED, Header, LogWriter, Streamed
from httk_flow.protocol.names import RecordRef


def _name(path_of: Callable[[str], str]) -> str:
    """A name inside an attempt directory, as layout places it."""
    return os.path.basename(path_of("/"))


#: what the attempt was told: in the frames and its environment (the `children` file of
#: the step after a join stays, for flow_children to be read back)
_TOLD = (_name(layout.context_file),)
_LINE = _name(layout.outcome_line)
#: removed when empty, moved up beside job.json otherwise
_OUTPUT = (_name(layout.stdout_file), _name(layout.stderr_file))
_ATTEMPTS = _name(layout.attempts_dir)
_FIRST = layout.attempt_name(1)
_RUN = _name(layout.run_dir)
_WORK = _name(layout.work_dir)
_READY = _name(layout.outcome_ready)
_READY_FILE = _name(layout.outcome_file)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Tidy:
    """What to tidy of one attempt once its commit is recorded."""

    job_dir: str
    #: the attempt's directory name (aNNNN)
    attempt: str
    #: the job's workdir is run/ (persistent), not the attempt's own work/
    persistent: bool
    #: no process of its group was left at its end: nothing may still write to its output,
    #: read its context or work in its workdir (otherwise only its outcome is tidied)
    settled: bool
    #: the job's id, key and placement (named in the records of streamed output)
    job: str = ""
    key: str = ""
    placement: str = ""

    def run(
        self,
        *,
        terminal: bool,
        outcome: bool,
        stream: LogWriter | None = None,
        streamed: Streamed = (),
    ) -> Streamed:
        """Remove what the attempt left that holds nothing; with `terminal` (the job's
        last attempt) also run/ when it is empty. `outcome`: the frames hold the published
        outcome whole (accepted, its message not cut), so its file may go too. `stream`:
        output is appended there (what is returned goes into the final frame) and its
        files are left for drop() once that frame is written. `streamed`: output that
        stream_only() appended and a written frame names, whose files go. Never raises:
        an untidied file costs an inode, never correctness."""
        try:
            jfd = os.open(self.job_dir, _DIR_FLAGS)
        except OSError:
            return ()
        try:
            done = self._attempt(jfd, outcome, stream, frozenset(n for n, _ in streamed))
            self._dirs(jfd, terminal)
        finally:
            os.close(jfd)
        return done

    def stream_only(self, stream: LogWriter) -> Streamed:
        """Append the attempt's output to the log segments and remove nothing: for a
        direct commit, whose one frame names the records before anything is tidied."""
        if not self.settled:
            return ()
        try:
            jfd = os.open(self.job_dir, _DIR_FLAGS)
        except OSError:
            return ()
        try:
            xfd = _open_dir(self.attempt, jfd)
            if xfd is None:
                return ()
            try:
                refs = ((name, self._stream(name, xfd, stream)) for name in _OUTPUT)
                return tuple((name, ref) for name, ref in refs if ref is not None)
            finally:
                os.close(xfd)
        finally:
            os.close(jfd)

    def drop(self, streamed: Streamed, *, terminal: bool) -> None:
        """After the final frame holds where the output went: its files, then the
        directories they kept (as run() removes them)."""
        try:
            jfd = os.open(self.job_dir, _DIR_FLAGS)
        except OSError:
            return
        try:
            xfd = _open_dir(self.attempt, jfd)
            if xfd is not None:
                for name, _ in streamed:
                    _unlink(name, xfd)
                os.close(xfd)
            _rmdir(self.attempt, jfd)
            self._dirs(jfd, terminal)
        finally:
            os.close(jfd)

    def _dirs(self, jfd: int, terminal: bool) -> None:
        if terminal:
            if self.attempt != _FIRST:
                # attempts/ of a job that earlier revisions ran (§1): gone once empty
                _rmdir(_ATTEMPTS, jfd)
            if self.persistent and self.settled:
                _rmdir(_RUN, jfd)

    def _attempt(
        self, jfd: int, outcome: bool, stream: LogWriter | None, gone: frozenset[str]
    ) -> Streamed:
        xfd = _open_dir(self.attempt, jfd)
        if xfd is None:
            return ()
        streamed = []
        try:
            if outcome:
                self._outcome(xfd)
            if self.settled:
                for name in _TOLD:
                    _unlink(name, xfd)
                for name in _OUTPUT:
                    if name in gone:
                        _unlink(name, xfd)  # streamed, and the frame names its record
                        continue
                    ref = self._stream(name, xfd, stream) if stream is not None else None
                    if ref is not None:
                        streamed.append((name, ref))
                    else:
                        self._output(name, xfd, jfd)
                if not self.persistent:
                    _rmdir(_WORK, xfd)
        finally:
            os.close(xfd)
        # fails while anything is left (output, exec.failed, outcome.ready/, ...): kept
        _rmdir(self.attempt, jfd)
        return tuple(streamed)

    def _stream(self, name: str, xfd: int, stream: LogWriter) -> RecordRef | None:
        """Append a non-empty output file of at most MAX_STREAMED bytes to the log
        segments; None leaves it to _output (empty: removed; larger: moved up)."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=xfd)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or not 0 < st.st_size <= MAX_STREAMED:
                return None
            chunks, left = [], st.st_size
            while left > 0:
                chunk = os.read(fd, left)
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            data = b"".join(chunks)
            n = layout.attempt_number(self.attempt)
            head = Header(self.job, self.key, self.placement, n, name, len(data))
            return stream.append(head, data)
        except OSError:
            return None  # e.g. the log segment cannot be written: the file stays
        finally:
            os.close(fd)

    @staticmethod
    def _outcome(xfd: int) -> None:
        """outcome.line, or outcome.ready/ holding outcome.json alone (a publication's
        children.jsonl or a duplicate keeps it)."""
        if _unlink(_LINE, xfd):
            return  # the accepted outcome was the line, so there is no outcome.ready/
        rfd = _open_dir(_READY, xfd)
        if rfd is None:
            return
        try:
            try:
                alone = os.listdir(rfd) == [_READY_FILE]
            except OSError:
                alone = False
            if alone:
                _unlink(_READY_FILE, rfd)
        finally:
            os.close(rfd)
        _rmdir(_READY, xfd)

    def _output(self, name: str, xfd: int, jfd: int) -> None:
        """An empty output file goes; one with output moves up beside job.json as
        aNNNN.stdout (the same file: a reader that has it open reads on)."""
        try:
            st = os.stat(name, dir_fd=xfd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                return
            if st.st_size == 0:
                os.unlink(name, dir_fd=xfd)
            else:
                n = layout.attempt_number(self.attempt)
                kept = os.path.basename(layout.kept_output("/", n, name))
                os.rename(name, kept, src_dir_fd=xfd, dst_dir_fd=jfd)
        except OSError:
            pass


def _open_dir(name: str, dir_fd: int) -> int | None:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None


def _unlink(name: str, dir_fd: int) -> bool:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        return False
    return True


def _rmdir(name: str, dir_fd: int) -> None:
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except OSError:
        pass
