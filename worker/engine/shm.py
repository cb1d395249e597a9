"""POSIX semaphores and shared memory without namespaces, and what snippets leave of them.

sem_open and shm_open (multiprocessing's locks, queues and pools, and
multiprocessing.shared_memory) keep their objects as files in /dev/shm: glibc hard-codes
the directory and refuses names with a '/'. With a PID namespace each child mounts a
tmpfs of its own there (isolation.py), gone with it. Without one a child shares the
host's directory (sticky, 1777, every user's): Landlock lets it make, open, resize and
remove regular files there by name but never list it (child._restrict), and what a
snippet leaves there is removed after it:

- as root each running snippet has a uid of its own: what sem_open and shm_open make is
  0600 and that uid's, which keeps concurrent snippets out of each other's files, and
  leftovers.sweep_uid removes every file of the uid once the snippet has ended.
- not root, every snippet runs as the worker's uid, so no owner tells one snippet's files
  from another's or from the worker user's own. ``Sweep`` removes the files of that uid
  that appeared after the supervisor started, once nothing that may have made them or
  holds them is alive: the supervisor's snippets that were running when the file was
  first seen (one may close a file and open it again by name), and the processes of the
  uid outside those snippets that have it open or mapped. Only names keep concurrent
  snippets apart there: multiprocessing's and shared_memory's are random (32 bits and
  more), and a snippet that knows or guesses another's can open it. Not covered: another
  executor of the same uid, whose snippet's file, closed while that snippet still runs,
  this one may remove; and a file another program of the worker user makes meanwhile,
  closes and means to open again by name. Run a non-root worker as a user of its own.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection
from dataclasses import dataclass

DIRECTORY = "/dev/shm"

Entry = tuple[str, int]  # a file's name and inode number: a name made anew is a new file
Process = tuple[int, int]  # pid and start time (clock ticks since boot): pids are reused
_PF_EXITING = 0x4  # include/linux/sched.h
_SIGKILL_BIT = 1 << 8  # signal 9 in /proc/PID/status's pending masks


class Sweep:
    """Removes what snippets leave in /dev/shm where they all share the worker's uid (not
    root, no PID namespace). Made as the supervisor starts: what is there then is never
    touched, nor is any file of another uid."""

    def __init__(self, *, uid: int, directory: str = DIRECTORY) -> None:
        self.uid = uid
        self.directory = directory
        self.prefix = os.path.realpath(directory) + "/"  # as /proc names what is open
        self.known: set[Entry] = set(_entries(directory))  # not ours to remove
        # Files of the uid to remove once every process named is gone.
        self.pending: dict[Entry, frozenset[Process]] = {}

    def after_snippet(self, running: Collection[int]) -> int:
        """Called once a snippet has ended and its process group was killed; ``running``:
        the first processes (session leaders) of the supervisor's snippets still running.
        Returns how many files were removed. One listdir when nothing new is there."""
        present = _entries(self.directory)
        if not self.pending and present.keys() == self.known:
            return 0  # the usual case: nothing new, nothing gone
        self.known &= present.keys()
        self.pending = {entry: waits for entry, waits in self.pending.items() if entry in present}
        new = present.keys() - self.known - self.pending.keys()
        made = [entry for entry in new if self._ours(present[entry])]
        self.known.update(new.difference(made))
        if made:
            # Made by a snippet running now, by one that has ended, or by another process
            # of the uid: a running snippet may close a file and open it again by name.
            waits = frozenset(p for p in map(_identify, running) if p is not None)
            self.pending.update(dict.fromkeys(made, waits))
        ready = [entry for entry, waits in self.pending.items() if not any(map(_alive, waits))]
        if not ready:
            return 0
        holders = _holders(self.uid, self.prefix, sessions=set(running))
        removed = 0
        for entry in ready:
            held = holders.get(entry[1])
            if held:  # open or mapped outside the running snippets: wait for those too
                self.pending[entry] = held
                continue
            del self.pending[entry]
            removed += _remove(os.path.join(self.directory, entry[0]), entry[1])
        return removed

    def _ours(self, entry: os.DirEntry[str]) -> bool:
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            return False
        return info.st_uid == self.uid and stat.S_ISREG(info.st_mode)


def _entries(directory: str) -> dict[Entry, os.DirEntry[str]]:
    try:
        with os.scandir(directory) as it:
            return {(entry.name, entry.inode()): entry for entry in it}
    except OSError:
        return {}


def _remove(path: str, inode: int) -> int:
    try:
        if os.lstat(path).st_ino != inode:
            return 0  # replaced since it was listed: a new file, looked at next time
        os.unlink(path)
    except OSError:
        return 0
    return 1


@dataclass(frozen=True)
class _Stat:
    session: int
    start: int
    dying: bool  # in its exit: it uses nothing it holds any more


def _stat(pid: int) -> _Stat | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    state, flags = fields[0], int(fields[6])
    dying = state in (b"Z", b"X") or bool(flags & _PF_EXITING)
    return _Stat(int(fields[3]), int(fields[19]), dying)


def _alive(process: Process) -> bool:
    found = _stat(process[0])
    return found is not None and found.start == process[1] and not found.dying


def _identify(pid: int) -> Process | None:
    found = _stat(pid)
    return None if found is None else (pid, found.start)


def _holders(uid: int, prefix: str, *, sessions: set[int]) -> dict[int, frozenset[Process]]:
    """Inode -> the processes of ``uid`` that have a file beneath ``prefix`` open or
    mapped, leaving out those in ``sessions`` and those in their exit or killed. A
    non-dumpable process shows as root's in /proc and is not looked at."""
    held: dict[int, set[Process]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
        except OSError:
            continue
        info = _stat(pid)
        if info is None or info.session in sessions or info.dying:
            continue
        inodes = _open_beneath(pid, prefix) | _mapped_beneath(pid, prefix)
        if inodes and not _killed(pid):
            for inode in inodes:
                held.setdefault(inode, set()).add((pid, info.start))
    return {inode: frozenset(processes) for inode, processes in held.items()}


def _open_beneath(pid: int, prefix: str) -> set[int]:
    inodes: set[int] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(prefix):
                inodes.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
        except OSError:
            continue
    return inodes


def _mapped_beneath(pid: int, prefix: str) -> set[int]:
    # address perms offset dev inode path
    inodes: set[int] = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].startswith(prefix):
                    inodes.add(int(fields[4]))
    except OSError:
        pass
    return inodes


def _killed(pid: int) -> bool:
    """SIGKILL is pending: it will never run again (the supervisor kills a snippet's
    group as its first process ends; a member may not have begun its exit yet)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            pending = [line.split()[1] for line in f if line.startswith(("SigPnd:", "ShdPnd:"))]
    except OSError:
        return False
    return any(int(mask, 16) & _SIGKILL_BIT for mask in pending)
