"""Edit a configuration file the user owns (``~/.claude/settings.json``) the way they
would want it edited: the file they meant, nothing else, and as they left it.

- A symlink (a dotfiles checkout) is followed to the file it names, and that file is
  replaced; the link stays a link. A link to nothing is refused.
- The new content is written to a temporary file in the target's own directory, given
  the old file's permission bits (and owner, when this process may set it), flushed to
  disk and renamed over the target (``pipeline.common.atomic``): a reader sees the old file or
  the new one, never a mix.
- A path seam should not write is refused with one line saying why and what to do: a
  directory or other non-regular file (always: there is no file to edit), a file it
  cannot read (always: it cannot be merged), an immutable or append-only file (always:
  ``chattr +i`` means no one rewrites it), and, unless ``force``, a file whose mode has
  no write bit (0444: read-only on purpose, even for root, whom the kernel would let
  through) or no read bit. With ``force`` the read-only file is rewritten and keeps its
  mode.
- A file that changes between the read and the rename (Claude Code saving its own
  settings) is refused rather than overwritten.

Permission is judged from the mode bits as well as from ``os.access``: as root,
``os.access`` answers yes to every read and write (the kernel's DAC override), so a 0444
file would otherwise be overwritten silently.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from pipeline.common import atomic
from pipeline.common.errors import SeamError

_FS_IOC_GETFLAGS = 0x80086601  # linux/fs.h: _IOR('f', 1, long)
_FS_IMMUTABLE_FL, _FS_APPEND_FL = 0x10, 0x20
_NEW_FILE_MODE = 0o666  # minus the umask, as any editor creates a file


class SettingsFileError(SeamError, ValueError):
    """A settings path seam will not edit; the message is one line saying why."""


@dataclass(frozen=True)
class SettingsFile:
    """What was read: the path given, the file written (the symlink's target), the text
    (None: no file yet) and the old file's status."""

    path: Path
    target: Path
    text: str | None
    st: os.stat_result | None

    def write(self, text: str) -> None:
        """Replace the target with ``text``, keeping its mode and owner."""
        self.target.parent.mkdir(parents=True, exist_ok=True)
        mode = stat.S_IMODE(self.st.st_mode) if self.st else _NEW_FILE_MODE & ~_umask()
        data = text.encode("utf-8")

        def write_tmp(tmp: str) -> None:
            with open(tmp, "wb") as fh:
                fh.write(data)
                os.fchmod(fh.fileno(), mode)
                if self.st is not None:
                    _keep_owner(fh.fileno(), self.st)
            if _read_bytes(self.target) != self._old_bytes():
                raise SettingsFileError(
                    f"{self.path} changed while seam was editing it; run the command again"
                )

        try:
            atomic.atomic_write(self.target, write_tmp)
        except OSError as exc:
            raise SettingsFileError(f"cannot write {self.target}: {_reason(exc)}") from None

    def _old_bytes(self) -> bytes | None:
        return None if self.text is None else self.text.encode("utf-8")


def read(path: Path, force: bool = False) -> SettingsFile:
    """Check ``path`` as the module docstring says and read it (UTF-8)."""
    target = Path(os.path.realpath(path))
    if path.is_symlink() and not target.exists():
        raise SettingsFileError(f"{path} is a symlink to {target}, which does not exist")
    try:
        st = os.stat(target)
    except FileNotFoundError:
        return SettingsFile(path, target, None, None)
    except OSError as exc:
        raise SettingsFileError(f"cannot read {path}: {_reason(exc)}") from None
    shown = path if target == path.absolute() else f"{path} (-> {target})"
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise SettingsFileError(f"{shown} is {kind}; give the settings file with --settings")
    flags = _inode_flags(target)
    if flags & (_FS_IMMUTABLE_FL | _FS_APPEND_FL):
        what = "immutable" if flags & _FS_IMMUTABLE_FL else "append-only"
        raise SettingsFileError(f"{shown} is {what} (lsattr shows it); seam will not change it")
    mode = stat.S_IMODE(st.st_mode)
    if not force and (mode & 0o444 == 0 or not os.access(target, os.R_OK)):
        raise SettingsFileError(
            f"{shown} is not readable (mode {mode:04o}); seam leaves it alone "
            "(--force edits it if this user can read it)"
        )
    if not force and (mode & 0o222 == 0 or not os.access(target, os.W_OK)):
        raise SettingsFileError(
            f"{shown} is read-only (mode {mode:04o}); seam leaves it alone "
            "(--force rewrites it and keeps the mode)"
        )
    data = _read_bytes(target)
    if data is None:
        raise SettingsFileError(f"cannot read {shown}: it disappeared")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SettingsFileError(f"{shown} is not UTF-8 ({exc.reason}); fix it first") from None
    return SettingsFile(path, target, text, st)


def _read_bytes(path: Path) -> bytes | None:
    """The file's bytes, None if it does not exist; a file that cannot be read is one
    line (``SettingsFileError``)."""
    try:
        # O_NONBLOCK: a FIFO swapped in after the check must not block the open.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SettingsFileError(f"cannot read {path}: {_reason(exc)}") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise SettingsFileError(f"{path} is not a regular file")
        return fh.read()


def _inode_flags(path: Path) -> int:
    """The file's inode flags (``lsattr``), 0 where the platform or file system has none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return 0
    try:
        got = fcntl.ioctl(fd, _FS_IOC_GETFLAGS, struct.pack("l", 0))
        return int(struct.unpack("l", got)[0])
    except OSError:
        return 0
    finally:
        os.close(fd)


def _keep_owner(fd: int, st: os.stat_result) -> None:
    """Give the new file the old one's owner and group where this process may (root
    editing a user's file must not leave it owned by root); otherwise it stays ours."""
    if (st.st_uid, st.st_gid) == (os.geteuid(), os.getegid()):
        return
    with contextlib.suppress(PermissionError):
        os.fchown(fd, st.st_uid, st.st_gid)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _reason(exc: OSError) -> str:
    if exc.errno in (errno.EPERM, errno.EACCES):
        return "permission denied"
    if exc.errno == errno.EROFS:
        return "read-only file system"
    return exc.strerror or str(exc)
