"""Storage faults for tests: seeded failures at the I/O boundary and a model of power loss.

:class:`FaultyFileOps` is installed with ``fileio.install`` and then sees every system call
the storage makes on its files. Its :class:`FaultPlan` decides, call by call, whether the
call fails (ENOSPC, EIO, a short write...): from a seeded schedule (each (operation, file)
pair draws from its own stream, so what a file sees does not depend on how threads
interleave with other files) and from one-shot rules a regression test sets. Its
:class:`Durability` records what each successful fsync, directory fsync and syncfs made
durable, and :meth:`Durability.power_loss` rewrites the directories to exactly that: files
hold what their last fsync saw, directories hold the names their last fsync saw (files
created since are gone, files unlinked since are back), which is what a crash of the
machine may leave on a POSIX filesystem. A checkpoint that ran ahead of what was durable
shows up as data lost after the power loss.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import stat
import threading
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from stonemq.storage.fileio import FileOps

WRITES = ("pwrite", "pwritev", "write")
"""Operations that can also be cut short (a short write)."""

HOLD_S = 30.0
"""The longest a held call (``Rule.hold``) waits."""

OPERATIONS = (
    *WRITES,
    "open",
    "fsync",
    "syncfs",
    "sync_file_range",
    "ftruncate",
    "truncate",
    "replace",
    "unlink",
    "makedirs",
    "pread",
)


@dataclass
class Rule:
    """Fail calls of ``op`` whose file name contains ``match``: ``times`` of them (-1: all)
    after skipping ``after`` matching calls, with ``error`` (an errno) or, for a write, by
    writing only ``short`` bytes first. With ``hold`` set, a matching call does not fail: it
    sets ``entered`` and waits until ``hold`` is set (at most ``HOLD_S``), then goes through
    (a slow write, for a cancel or another writer to come meanwhile)."""

    op: str
    match: str = ""
    error: int = errno.EIO
    times: int = 1
    after: int = 0
    short: int | None = None
    hold: threading.Event | None = None
    entered: threading.Event = field(default_factory=threading.Event)


@dataclass
class FaultPlan:
    """Which calls fail. ``rates`` maps an operation to the chance that a call fails, drawn
    from ``seed``; ``errors`` the errnos a failing call draws from (default ENOSPC and EIO
    for writes, EIO for the rest); ``short_writes`` the chance a failing write is first cut
    short. ``rules`` are one-shot failures set by a test."""

    seed: int = 0
    rates: dict[str, float] = field(default_factory=dict)
    errors: dict[str, Sequence[int]] = field(default_factory=dict)
    short_writes: float = 0.5
    match: str = ""  # only files whose path contains this
    rules: list[Rule] = field(default_factory=list)
    log: list[tuple[str, str, str]] = field(default_factory=list)  # (op, path, what)
    _counts: dict[tuple[str, str], int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def fail(self, op: str, match: str = "", error: int = errno.EIO, **kwargs: Any) -> Rule:
        rule = Rule(op, match, error, **kwargs)
        with self._lock:
            self.rules.append(rule)
        return rule

    def decide(self, op: str, path: str) -> tuple[int, int | None] | None:
        """None: the call goes through. Else (errno, short): fail with errno, for a write
        after writing ``short`` bytes (None: nothing)."""
        held: Rule | None = None
        with self._lock:
            for rule in self.rules:
                if rule.op == op and rule.match in path and rule.times != 0:
                    if rule.after > 0:
                        rule.after -= 1
                        continue
                    if rule.times > 0:
                        rule.times -= 1
                    if rule.hold is not None:
                        self.log.append((op, path, "held"))
                        held = rule
                        break
                    self.log.append((op, path, f"rule errno {rule.error} short {rule.short}"))
                    return rule.error, rule.short
        if held is not None:  # outside the lock: other calls go on meanwhile
            assert held.hold is not None
            held.entered.set()
            held.hold.wait(HOLD_S)
            return None
        with self._lock:
            rate = self.rates.get(op, 0.0)
            if rate <= 0 or self.match not in path:
                return None
            key = (op, os.path.basename(path))
            count = self._counts.get(key, 0) + 1
            self._counts[key] = count
            draw = random.Random(zlib.crc32(f"{self.seed}:{op}:{key[1]}:{count}".encode()))
            if draw.random() >= rate:
                return None
            default = (errno.ENOSPC, errno.EIO) if op in WRITES else (errno.EIO,)
            error = draw.choice(list(self.errors.get(op, default)))
            short = None
            if op in WRITES and draw.random() < self.short_writes:
                short = draw.randint(1, 4096)
            self.log.append((op, path, f"seeded errno {error} short {short}"))
            return error, short


class Durability:
    """What a power loss would keep of the files under ``roots`` (see the module doc)."""

    def __init__(self, roots: Iterable[str]) -> None:
        self.roots = [os.path.abspath(r) for r in roots]
        self._lock = threading.Lock()
        # files are known by (inode, generation): an inode number comes back for a new file
        # once the old one is gone, so each death bumps its generation
        self.generations: dict[int, int] = {}
        self.contents: dict[tuple[int, int], bytes] = {}  # file -> bytes at its last fsync
        self.names: dict[str, dict[str, tuple[int, int]]] = {}  # directory -> {name: file}
        self.kinds: dict[tuple[int, int], bool] = {}  # file -> is a directory
        for root in self.roots:
            os.makedirs(root, exist_ok=True)
            self._sync_tree(root)

    def _covered(self, path: str) -> bool:
        path = os.path.abspath(path)
        return any(path == r or path.startswith(r + os.sep) for r in self.roots)

    def _sync_tree(self, root: str) -> None:
        for directory, _dirs, files in os.walk(root):
            self.synced(directory)
            for name in files:
                self.synced(os.path.join(directory, name))

    def _id(self, ino: int) -> tuple[int, int]:
        return ino, self.generations.get(ino, 0)

    def dying(self, path: str) -> None:
        """``path`` is about to be unlinked or replaced (a whole tree, for a directory): its
        inodes may come back as new files."""
        path = os.path.abspath(path)
        if not self._covered(path) or not os.path.lexists(path):
            return
        targets = [path]
        if os.path.isdir(path) and not os.path.islink(path):
            for directory, dirs, files in os.walk(path):
                targets.extend(os.path.join(directory, name) for name in dirs + files)
        with self._lock:
            for target in targets:
                try:
                    st = os.lstat(target)
                except FileNotFoundError:
                    continue
                if stat.S_ISDIR(st.st_mode) or st.st_nlink <= 1:
                    self.generations[st.st_ino] = self.generations.get(st.st_ino, 0) + 1

    def synced(self, path: str) -> None:
        """``path`` (a file or a directory) was just fsynced successfully."""
        path = os.path.abspath(path)
        if not self._covered(path):
            return
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return
        with self._lock:
            if stat.S_ISDIR(st.st_mode):
                entries = {}
                for entry in os.scandir(path):
                    file_id = self._id(entry.inode())
                    entries[entry.name] = file_id
                    if entry.is_dir(follow_symlinks=False):
                        self.kinds[file_id] = True
                self.names[path] = entries
                self.kinds[self._id(st.st_ino)] = True
            else:
                with open(path, "rb") as f:
                    self.contents[self._id(st.st_ino)] = f.read()
                self.kinds[self._id(st.st_ino)] = False

    def synced_all(self) -> None:
        """syncfs: everything under the roots is durable."""
        for root in self.roots:
            self._sync_tree(root)

    def power_loss(self) -> None:
        """Rewrite every root to what was durable (call with no engine running)."""
        with self._lock:
            for root in self.roots:
                image = self._image(root)
                shutil.rmtree(root)
                self._write(root, image)
        self.contents.clear()
        self.names.clear()
        self.kinds.clear()
        self.generations.clear()
        for root in self.roots:
            self._sync_tree(root)

    def _image(self, directory: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, file_id in self.names.get(directory, {}).items():
            if self.kinds.get(file_id):
                out[name] = self._image(os.path.join(directory, name))
            else:
                out[name] = self.contents.get(file_id, b"")
        return out

    def _write(self, directory: str, image: dict[str, Any]) -> None:
        os.makedirs(directory, exist_ok=True)
        for name, value in image.items():
            path = os.path.join(directory, name)
            if isinstance(value, dict):
                self._write(path, value)
            else:
                with open(path, "wb") as f:
                    f.write(value)


class FaultyFileOps(FileOps):
    """The real operations, failing where ``plan`` says and reporting fsyncs to
    ``durability``."""

    def __init__(self, plan: FaultPlan | None = None, durability: Durability | None = None):
        self.plan = plan or FaultPlan()
        self.durability = durability
        self._paths: dict[int, str] = {}
        self._lock = threading.Lock()

    def _path(self, fd: int) -> str:
        return self._paths.get(fd, f"fd:{fd}")

    def _check(self, op: str, path: str) -> int | None:
        """Raise the planned error; return a short length for a write (None: no fault)."""
        decision = self.plan.decide(op, path)
        if decision is None:
            return None
        error, short = decision
        if short is None:
            raise OSError(error, f"injected {op} failure: {os.strerror(error)}", path)
        return short

    # -- descriptors ------------------------------------------------------------------------
    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        if flags & os.O_CREAT and not os.path.exists(path):
            self._check("open", path)
        fd = super().open(path, flags, mode)
        with self._lock:
            self._paths[fd] = os.path.abspath(path)
        return fd

    def close(self, fd: int) -> None:
        with self._lock:
            self._paths.pop(fd, None)
        super().close(fd)

    def pread(self, fd: int, n: int, pos: int) -> bytes:
        self._check("pread", self._path(fd))
        return super().pread(fd, n, pos)

    def pread_into(self, fd: int, buf: Any, pos: int) -> int:
        self._check("pread", self._path(fd))
        return super().pread_into(fd, buf, pos)

    def pread_cached(self, fd: int, n: int, pos: int) -> bytes | None:
        self._check("pread", self._path(fd))
        return super().pread_cached(fd, n, pos)

    def sendfile(self, out_fd: int, in_fd: int, offset: int, count: int) -> int:
        """A fetch response's records to a socket: fails as a read of ``in_fd``'s file
        (operation ``sendfile``); a short length sends that many bytes at most."""
        short = self._check("sendfile", self._path(in_fd))
        if short is not None:
            count = max(min(short, count), 1)
        return super().sendfile(out_fd, in_fd, offset, count)

    # -- writes -----------------------------------------------------------------------------
    def pwrite(self, fd: int, data: Any, pos: int) -> int:
        short = self._check("pwrite", self._path(fd))
        if short is not None:
            return self._short(fd, [data], pos, short, "pwrite")
        return super().pwrite(fd, data, pos)

    def pwritev(self, fd: int, buffers: Sequence[Any], pos: int) -> int:
        short = self._check("pwritev", self._path(fd))
        if short is not None:
            return self._short(fd, buffers, pos, short, "pwritev")
        return super().pwritev(fd, buffers, pos)

    def write(self, fd: int, data: Any) -> int:
        short = self._check("write", self._path(fd))
        if short is not None:
            view = memoryview(data)[: max(min(short, len(data) - 1), 0)]
            return super().write(fd, view) if len(view) else 0
        return super().write(fd, data)

    def _short(self, fd: int, buffers: Sequence[Any], pos: int, short: int, op: str) -> int:
        """Write at most ``short`` bytes (fewer than asked) and report that many: the caller
        must finish the write or cut it back."""
        data = b"".join(bytes(b) for b in buffers)
        keep = max(min(short, len(data) - 1), 0)
        if keep == 0:
            raise OSError(errno.ENOSPC, f"injected {op} failure", self._path(fd))
        return super().pwrite(fd, data[:keep], pos)

    def ftruncate(self, fd: int, size: int) -> None:
        self._check("ftruncate", self._path(fd))
        super().ftruncate(fd, size)

    # -- durability -------------------------------------------------------------------------
    def fsync(self, fd: int) -> None:
        path = self._path(fd)
        self._check("fsync", path)
        super().fsync(fd)
        if self.durability is not None:
            self.durability.synced(path)

    def syncfs(self, fd: int) -> None:
        self._check("syncfs", self._path(fd))
        super().syncfs(fd)
        if self.durability is not None:
            self.durability.synced_all()

    def sync_file_range(self, fd: int, offset: int, length: int, flags: int) -> None:
        if flags & 4:  # SYNC_FILE_RANGE_WAIT_AFTER: the call that reports write-back errors
            self._check("sync_file_range", self._path(fd))
        super().sync_file_range(fd, offset, length, flags)

    # -- names ------------------------------------------------------------------------------
    def replace(self, src: str, dst: str) -> None:
        self._check("replace", dst)
        if self.durability is not None:
            self.durability.dying(dst)
        super().replace(src, dst)

    def unlink(self, path: str) -> None:
        self._check("unlink", path)
        if self.durability is not None:
            self.durability.dying(path)
        super().unlink(path)

    def rmtree(self, path: str) -> None:
        if self.durability is not None:
            self.durability.dying(path)
        super().rmtree(path)

    def truncate(self, path: str, size: int) -> None:
        self._check("truncate", path)
        super().truncate(path, size)

    def makedirs(self, path: str) -> None:
        if not os.path.isdir(path):
            self._check("makedirs", path)
        super().makedirs(path)
