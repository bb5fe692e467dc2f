"""Safe access to the files under the containers directory.

Each ``{pod uid}_{container}`` directory is mounted writable into its container, so its
content is hostile input: a file may be a symlink to a host file, a FIFO, or shrink while
it is read. Hence:

- every open is relative to a directory descriptor with ``O_NOFOLLOW`` (no symlink, at
  either level, is followed) and must be a regular file;
- reads are ``pread`` copies, not a long-lived ``mmap``: a container that truncates its
  file under a mapping would kill this process with SIGBUS; a short read is just a
  ``CacheError``;
- the only write is one aligned 4-byte ``pwrite`` of a feedback field, into a file that
  still has the magic and layout it was read with and exactly one link.
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass

from hami.node.monitor.layout import HEADER_BYTES, V0, V1, Layout
from hami.node.monitor.region import CacheError, Region, decode, layout_for

LIBRARY_NAME = "libvgpu.so"  # the library's bind-mount target may sit in the same directory
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class CacheFile:
    name: str  # inside the container's directory
    inode: int
    region: Region


def open_dir(path: str, dir_fd: int | None = None) -> int:
    """A descriptor of directory ``path``; OSError (ELOOP) if it is a symlink."""
    return os.open(path, _DIR_FLAGS, dir_fd=dir_fd)


def find_cache(dir_fd: int) -> str | None:
    """The name of the region file in a container's directory: its ``*.cache`` file (the
    newest when a restarted library left several), or None before the container wrote one."""
    best: tuple[float, str] | None = None
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            if not entry.name.endswith(".cache") or LIBRARY_NAME in entry.name:
                continue
            if not entry.is_file(follow_symlinks=False):
                continue
            mtime = entry.stat(follow_symlinks=False).st_mtime
            if best is None or (mtime, entry.name) > best:
                best = (mtime, entry.name)
    return best[1] if best else None


def read_region(dir_fd: int, name: str) -> CacheFile:
    """Read and decode the region file ``name``; CacheError says what is wrong with it."""
    try:
        fd = os.open(name, os.O_RDONLY | _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise CacheError(f"cannot open: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CacheError("not a regular file")
        try:
            region = decode(lambda offset, length: os.pread(fd, length, offset), info.st_size)
        except OSError as exc:
            raise CacheError(f"cannot read: {exc.strerror}") from None
        return CacheFile(name, info.st_ino, region)
    finally:
        os.close(fd)


def write_field(dir_fd: int, cache: CacheFile, field: str, value: int) -> None:
    """Set the int32 ``field`` (``utilization_switch`` or ``recent_kernel``) of the region
    read as ``cache``, if the file is still that region."""
    if field not in ("utilization_switch", "recent_kernel"):
        raise ValueError(f"not a feedback field: {field}")
    layout = _LAYOUTS[cache.region.layout]
    offset: int = getattr(layout, field)
    try:
        fd = os.open(cache.name, os.O_RDWR | _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise CacheError(f"cannot open for feedback: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_ino != cache.inode:
            raise CacheError("replaced since it was read; feedback skipped")
        if layout_for(info.st_size, os.pread(fd, HEADER_BYTES, 0)) is not layout:
            raise CacheError("layout changed since it was read; feedback skipped")
        # one aligned 4-byte store in the page cache, which the container's mapping shares
        if os.pwrite(fd, struct.pack("<i", value), offset) != 4:
            raise CacheError("short write of a feedback field")
    except OSError as exc:
        raise CacheError(f"cannot write feedback: {exc.strerror}") from None
    finally:
        os.close(fd)


_LAYOUTS: dict[str, Layout] = {V0.name: V0, V1.name: V1}
