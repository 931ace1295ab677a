"""Disk faults for tests: small filesystems of a test's own (to fill up) and files that stop
taking writes (``chattr +i``, as a failing disk's EPERM/EIO would)."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

# the images live in RAM (/dev/shm): an fsync through the loop device stays as cheap as on tmpfs
IMAGE_DIR = Path("/dev/shm")


def immutable(paths: list[Path], on: bool) -> bool:
    """``chattr +i`` / ``-i``: writes to an immutable file fail with EPERM even through a
    descriptor opened before, and no file can be added to an immutable directory (root on
    ext4; tmpfs ignores the flag for open descriptors). False when that cannot be done."""
    if not paths or shutil.which("chattr") is None:
        return False
    done = subprocess.run(
        ["chattr", "+i" if on else "-i", *map(str, paths)], capture_output=True, check=False
    )
    return done.returncode == 0


@dataclass
class SmallDisk:
    """A filesystem of ``size_bytes`` mounted at ``mount``: ``kind`` ext4 (on a loop device
    over an image in RAM: fills up like a disk and honours ``chattr +i``) or tmpfs (fills up,
    ignores ``chattr +i`` for open files)."""

    mount: Path
    kind: str
    image: Path | None = None

    def close(self) -> None:
        subprocess.run(["umount", "-l", str(self.mount)], capture_output=True, check=False)
        if self.image is not None:
            self.image.unlink(missing_ok=True)


def mount_small_disk(
    mount: Path, size_bytes: int, kinds: tuple[str, ...] = ("ext4", "tmpfs")
) -> SmallDisk | None:
    """Mount a small filesystem at ``mount`` (an empty directory): the first of ``kinds``
    that can be had (ext4 needs a loop device); None where none can (mounting needs root)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("mount") is None:
        return None
    if "ext4" in kinds and shutil.which("mkfs.ext4") is not None and IMAGE_DIR.is_dir():
        image = IMAGE_DIR / f"stonemq-test-disk-{uuid.uuid4().hex[:12]}.img"
        with image.open("wb") as f:
            f.truncate(size_bytes)
        made = subprocess.run(
            ["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], capture_output=True, check=False
        )
        if made.returncode == 0:
            mounted = subprocess.run(
                ["mount", "-o", "loop", str(image), str(mount)], capture_output=True, check=False
            )
            if mounted.returncode == 0:
                return SmallDisk(mount, "ext4", image)
        image.unlink(missing_ok=True)
    if "tmpfs" not in kinds:
        return None
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    return SmallDisk(mount, "tmpfs") if mounted.returncode == 0 else None
