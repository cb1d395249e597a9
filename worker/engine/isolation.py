"""Isolation the zygote sets up once, and the per-snippet part each child adds.

Once, in the zygote: a private network namespace (no interfaces up, so no
network at all), a private mount namespace in which every mount is read-only, and
the interpreter's own files made reachable for an unprivileged uid where a parent
directory (``/root`` is mode 700 on our hosts) would block it: the blocking directory is
covered by a tmpfs and only the needed paths are bind-mounted back, read-only.

Per snippet, in the child (which is PID 1 of fresh PID, mount and IPC namespaces):
fresh tmpfs on /tmp, /var/tmp and /dev/shm (gone with the namespace), paths that live
under them (a venv in /tmp) bound back in, and a /proc that shows only the snippet.
"""

from __future__ import annotations

import os
import pwd
import stat
import sys
from dataclasses import dataclass, field

from codepool.worker.engine import linux, protections

VOLATILE_ROOTS = ("/tmp", "/var/tmp", "/dev/shm")
WORKDIR = "/tmp/work"
_SKIP_READONLY = ("/proc", "/sys", "/dev")
# codepool.worker's folder (this package's parent), found from here rather than by
# importing the package this one lives in.
_WORKER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Protection:
    """One line of the isolation report: whether it is active, and how or why not."""

    name: str
    active: bool
    detail: str


@dataclass
class IsolationState:
    """What the zygote achieved; children consult it, ``doctor`` prints it."""

    root: bool = field(default_factory=lambda: os.geteuid() == 0)
    netns: bool = False
    mountns: bool = False
    userns: bool = False
    pidns: bool = False
    separate_uid: bool = False
    volatile_binds: list[str] = field(default_factory=list)
    protections: list[Protection] = field(default_factory=list)

    def note(self, name: str, active: bool, detail: str) -> None:
        self.protections.append(Protection(name, active, detail))

    def report(self) -> list[dict[str, object]]:
        return [{"name": p.name, "active": p.active, "detail": p.detail} for p in self.protections]


def needed_paths() -> list[str]:
    """Paths the sandboxed interpreter must be able to read: prefixes, sys.path, codepool."""
    import codepool.common

    candidates = [
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        *(os.path.dirname(hop) for hop in symlink_hops(sys.executable)),
        *sys.path,
        *codepool.common.__path__,
        _WORKER_DIR,
    ]
    paths: list[str] = []
    for path in candidates:
        if not path or not os.path.exists(path):
            continue
        path = os.path.realpath(path)
        if path not in paths:
            paths.append(path)
    # A path inside another one is covered by the outer bind.
    paths.sort()
    outer: list[str] = []
    for path in paths:
        if not any(path == o or path.startswith(o.rstrip("/") + "/") for o in outer):
            outer.append(path)
    return outer


def symlink_hops(path: str, limit: int = 40) -> list[str]:
    """``path`` and every link it resolves through, to the real file: spawn mode execs
    the interpreter by its own name, so each hop must exist in a snippet's mounts too (a
    venv's ``python3`` may link through a directory under the private ``/tmp``)."""
    hops = [os.path.abspath(path)]
    while os.path.islink(hops[-1]) and len(hops) < limit:
        target = os.readlink(hops[-1])
        hops.append(os.path.normpath(os.path.join(os.path.dirname(hops[-1]), target)))
    real = os.path.realpath(path)
    return hops if hops[-1] == real else [*hops, real]


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")


def _blocking_ancestor(path: str) -> str | None:
    """The outermost directory on the way to ``path`` that 'other' cannot enter."""
    parts = path.strip("/").split("/")
    current = ""
    for part in parts[:-1] if parts else []:
        current += "/" + part
        mode = os.stat(current).st_mode
        if not (mode & stat.S_IXOTH):
            return current
    return None


def _unshare_user_namespace(state: IsolationState) -> None:
    """Non-root hosts: own a user namespace, so mounts and PID namespaces work. The
    worker's uid maps to itself, not to 0: inside, nothing is uid 0, and each child drops
    the capabilities the namespace's owner holds before user code runs."""
    uid, gid = os.geteuid(), os.getegid()
    linux.unshare(linux.CLONE_NEWUSER)
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")
    state.userns = True


def _remount_readonly(state: IsolationState) -> int:
    """Remount every mount read-only in our namespace; returns how many failed."""
    flag_names = {
        "nosuid": linux.MS_NOSUID,
        "nodev": linux.MS_NODEV,
        "noexec": linux.MS_NOEXEC,
        "noatime": linux.MS_NOATIME,
        "nodiratime": linux.MS_NODIRATIME,
        "relatime": linux.MS_RELATIME,
    }
    failed = 0
    with open("/proc/self/mountinfo") as f:
        lines = f.read().splitlines()
    for line in lines:
        fields = line.split()
        mount_point = fields[4].replace("\\040", " ")
        if any(_under(mount_point, skip) for skip in _SKIP_READONLY):
            continue
        flags = linux.MS_REMOUNT | linux.MS_BIND | linux.MS_RDONLY | linux.MS_NOSUID
        for option in fields[5].split(","):
            flags |= flag_names.get(option, 0)
        try:
            linux.mount(None, mount_point, None, flags)
        except OSError:
            failed += 1
    return failed


def _expose(state: IsolationState, paths: list[str]) -> list[str]:
    """Cover directories that hide needed paths; bind the paths back. Returns actions."""
    actions: list[str] = []
    masks: dict[str, list[str]] = {}
    for path in paths:
        if any(_under(path, root) for root in VOLATILE_ROOTS):
            # Children mount a fresh tmpfs over these roots and bind the path back in.
            state.volatile_binds.append(path)
            actions.append(f"rebinds {path} into each snippet's private tmpfs")
            continue
        blocker = _blocking_ancestor(path)
        if blocker is not None:
            masks.setdefault(blocker, []).append(path)
    # A non-root worker's home holds its keys and tokens, and snippets share its uid:
    # hide it too (Landlock hides it as well, where the kernel has Landlock).
    home = _private_home()
    if home and not any(_under(home, m) or _under(m, home) for m in masks):
        masks[home] = [p for p in paths if _under(p, home)]
    for blocker, inner in masks.items():
        fds = [(p, os.open(p, os.O_PATH | os.O_CLOEXEC)) for p in inner]
        linux.mount(
            "tmpfs", blocker, "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, "mode=0755,size=1m"
        )
        for path, fd in fds:
            _bind_back(path, fd)
            os.close(fd)
        why = "the worker's home" if blocker == home else "mode 700"
        bound = ", ".join(inner) or "nothing"
        actions.append(f"hid {blocker} ({why}) behind a tmpfs; bound back read-only: {bound}")
    return actions


def _private_home() -> str | None:
    """The worker user's home directory when not root (root's /root is 0700 already)."""
    if os.geteuid() == 0:
        return None
    try:
        home = os.path.realpath(pwd.getpwuid(os.geteuid()).pw_dir)
    except KeyError:
        return None
    return home if home not in ("/", "") and os.path.isdir(home) else None


def _bind_back(path: str, fd: int) -> None:
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        os.makedirs(path, mode=0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        open(path, "a").close()
    linux.mount(f"/proc/self/fd/{fd}", path, None, linux.MS_BIND | linux.MS_REC)


def setup_zygote(*, namespaces: bool = True) -> IsolationState:
    """Enter the zygote's namespaces once; degrade and say why where the host refuses."""
    state = IsolationState()
    if not namespaces:
        state.note("namespaces", False, "disabled by configuration (namespaces=False)")
    elif not linux.clone_supported():
        state.note("namespaces", False, "unsupported CPU architecture for clone()")
    else:
        _enter_namespaces(state)
    state.separate_uid = state.root
    if state.separate_uid and not state.mountns:
        hidden = [p for p in needed_paths() if _blocking_ancestor(p) is not None]
        if hidden:
            state.note(
                "interpreter paths",
                False,
                f"without a mount namespace these stay unreadable to snippet uids (a parent "
                f"directory is not world-searchable): {', '.join(hidden)}; only preloaded "
                "modules import. Put the interpreter and venv under a world-readable path.",
            )
    protections.note_per_snippet(state)
    return state


def _enter_namespaces(state: IsolationState) -> None:
    if not state.root:
        try:
            _unshare_user_namespace(state)
        except OSError as exc:
            state.note("user namespace", False, f"not root and no user namespace ({exc})")
    try:
        linux.unshare(linux.CLONE_NEWNET)
        state.netns = True
        state.note("network", True, "private network namespace, no interfaces up")
    except OSError as exc:
        state.note("network", False, f"cannot unshare a network namespace ({exc})")
    try:
        linux.unshare(linux.CLONE_NEWNS)
        linux.mount(None, "/", None, linux.MS_REC | linux.MS_PRIVATE)
        state.mountns = True
    except OSError as exc:
        state.note("filesystem", False, f"cannot unshare a mount namespace ({exc})")
        return
    state.pidns = state.root or state.userns
    try:
        actions = _expose(state, needed_paths())
    except OSError as exc:
        actions = [f"failed ({exc}); snippets may not import the venv"]
    failed = _remount_readonly(state)
    ro = "every mount read-only" + (f" ({failed} could not be remounted)" if failed else "")
    state.note(
        "filesystem",
        True,
        f"private mount namespace; {ro}; fresh tmpfs on {', '.join(VOLATILE_ROOTS)} per snippet",
    )
    state.note("interpreter paths", True, "; ".join(actions) or "all readable as they are")


def clone_flags(state: IsolationState) -> int:
    if not state.pidns:
        return 0
    return linux.CLONE_NEWPID | linux.CLONE_NEWNS | linux.CLONE_NEWIPC


def tmpfs_options(disk_mb: int) -> str:
    """Mount options of each child's fresh tmpfs roots."""
    return f"mode=1777,size={disk_mb}m"


def setup_child(
    state: IsolationState, uid: int | None, disk_mb: int, fallback_dir: str | None
) -> str:
    """In a fresh child: private tmpfs roots, a private /proc, the work dir. Returns cwd.

    Without namespaces the zygote made ``fallback_dir`` and removes it afterwards.
    """
    if not state.pidns:
        assert fallback_dir is not None
        return fallback_dir
    options = tmpfs_options(disk_mb)
    # Opened here, not in the zygote: a bind source must be in the caller's namespace.
    keep = [(path, os.open(path, os.O_PATH | os.O_CLOEXEC)) for path in state.volatile_binds]
    for root in VOLATILE_ROOTS:
        linux.mount("tmpfs", root, "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, options)
    for path, fd in keep:
        _bind_back(path, fd)
        os.close(fd)
    linux.mount("proc", "/proc", "proc", linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC)
    os.mkdir(WORKDIR, 0o700)
    if uid is not None:
        os.chown(WORKDIR, uid, uid)
    return WORKDIR
