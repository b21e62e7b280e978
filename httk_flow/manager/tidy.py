"""Tidying a committed attempt: what holds nothing the journal does not is removed.

Done by the manager that commits its own attempt, after the committing frame (which
records the outcome) and before the final rename, while it alone holds the job: no other
process can be making the job's next attempt. So a job whose program printed nothing
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


def _name(path_of: Callable[[str], str]) -> str:
    """A name inside an attempt directory, as layout places it."""
    return os.path.basename(path_of("/"))


#: removed whenever the attempt is tidied: the committing frame holds what they said
_REDUNDANT = (_name(layout.context_file), _name(layout.outcome_line))
#: removed only when empty, and only when nothing of the attempt may still write to them
_OUTPUT = (_name(layout.stdout_file), _name(layout.stderr_file))
_ATTEMPTS = _name(layout.attempts_dir)
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
    #: its empty output files may go: no process of its group was left to write to them
    outputs: bool

    def run(self, *, terminal: bool) -> None:
        """Remove what the attempt left that holds nothing; with `terminal` (the job's
        last attempt) also attempts/ and run/ when they are empty. Never raises: an
        untidied file costs an inode, never correctness."""
        try:
            jfd = os.open(self.job_dir, _DIR_FLAGS)
        except OSError:
            return
        try:
            afd = _open_dir(_ATTEMPTS, jfd)
            if afd is not None:
                try:
                    self._attempt(afd)
                finally:
                    os.close(afd)
                if terminal:
                    _rmdir(_ATTEMPTS, jfd)
            if terminal and self.persistent:
                _rmdir(_RUN, jfd)
        finally:
            os.close(jfd)

    def _attempt(self, afd: int) -> None:
        xfd = _open_dir(self.attempt, afd)
        if xfd is None:
            return
        try:
            for name in _REDUNDANT:
                _unlink(name, xfd)
            rfd = _open_dir(_READY, xfd)
            if rfd is not None:
                # a published outcome.ready/ of anything but a wait holds outcome.json only
                try:
                    _unlink(_READY_FILE, rfd)
                finally:
                    os.close(rfd)
                _rmdir(_READY, xfd)
            if self.outputs:
                for name in _OUTPUT:
                    _unlink_empty(name, xfd)
            if not self.persistent:
                _rmdir(_WORK, xfd)
        finally:
            os.close(xfd)
        # fails while anything is left (output, exec.failed, outcome.ready/, ...): kept
        _rmdir(self.attempt, afd)


def _open_dir(name: str, dir_fd: int) -> int | None:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None


def _unlink(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def _unlink_empty(name: str, dir_fd: int) -> None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISREG(st.st_mode) and st.st_size == 0:
            os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def _rmdir(name: str, dir_fd: int) -> None:
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except OSError:
        pass
