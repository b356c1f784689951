"""Every file and directory parity writes, written so that a failure never leaves a half-written one.

A file is written to a temporary file in the same directory (`.NAME.parity-tmp-XXXX`), flushed and
fsynced, then renamed over the target with `os.replace`: a full disk, a crash or a Ctrl-C leaves
the old file or the new one, never a truncated one. A symlink is followed: the file it points to is
replaced, not the link. Three kinds of target are never renamed over, created or truncated:

- one of this process's open files (`/dev/stdout`, `/dev/stderr`, `/dev/fd/N`, `/proc/self/fd/N`,
  or a link to one): the bytes are written to that descriptor, after Python's own buffers are
  flushed. Renamed over, the file a shell redirected the stream to (`2>>build.log`) would be lost;
- any other path that passes through `/proc` (another process's descriptors): refused;
- a file that is not a regular file (a character device such as `/dev/null` or `/dev/full`, a
  FIFO): opened for writing as it is. A library that writes to a path itself (safetensors renames
  its own temporary file over the path) writes into a private temporary directory first, and its
  bytes are copied in. A FIFO is opened without waiting: no reader is an error, never a hang, and
  the descriptor `check_target` opened for it (which proved a reader) is the one written to, so the
  reader never sees an early end of file.

`check_target` proves before any work that a write will succeed as `write_atomic_with` does it: the
directory takes a new file (the temporary one), an existing file is writable, a descriptor is open
for writing.

A directory (a fixture) is built beside its target (`.NAME.parity-stage-XXXX`) and swapped in by
`replace_directory`; the directory it replaces is removed only file by file, and only the files
the caller says parity wrote (docs/security.md, "Files"). Failures raise `WriteError`: one line
naming the file and what the system said.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

from parity_harness._core.errors import ParityError

TMP_MARK = ".parity-tmp-"
STAGE_MARK = ".parity-stage-"
OLD_MARK = ".parity-old-"


class WriteError(ParityError):
    """A file or directory parity could not write (exit 2); the message is one line naming it."""


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _fsync_dir(directory: Path) -> None:
    """Make a rename durable (POSIX); where a directory cannot be opened (Windows), nothing to do."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _target(path: Path) -> tuple[Path, os.stat_result | None]:
    """The file a write lands on (symlinks followed) and its stat, None when it does not exist yet."""
    real = Path(os.path.realpath(path))
    try:
        return real, os.stat(real)
    except FileNotFoundError:
        return real, None


_STD_STREAMS = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
_MAX_HOPS = 40  # as the kernel's own limit on symlinks followed


def _hops(path: Path) -> list[str]:
    """Every name `path` passes through on the way to its file: itself, then each symlink's target.

    Each hop is given as written and with its directory resolved (`/dev/fd/3` is also
    `/proc/<pid>/fd/3`): `os.path.realpath` alone would jump past a `/proc` descriptor link to the
    file behind it, and that file must not be renamed over.
    """
    hops: list[str] = []
    current = os.path.abspath(path)
    for _ in range(_MAX_HOPS):
        resolved = os.path.join(os.path.realpath(os.path.dirname(current)), os.path.basename(current))
        hops += [current, resolved]
        try:
            link = os.readlink(resolved)
        except OSError:
            break
        current = os.path.normpath(os.path.join(os.path.dirname(resolved), link))
    return hops


def _own_fd(hop: str) -> int | None:
    """The descriptor number when `hop` names one of this process's open files, else None."""
    if hop in _STD_STREAMS:
        return _STD_STREAMS[hop]
    pid = os.getpid()
    match = re.fullmatch(rf"/dev/fd/(\d+)|/proc/(?:self|thread-self|{pid})(?:/task/\d+)?/fd/(\d+)", hop)
    if match is None:
        return None
    return int(match.group(1) or match.group(2))


def _stream(path: Path, what: str) -> int | None:
    """This process's descriptor `path` leads to, None for a plain path; WriteError for another `/proc` path."""
    for hop in _hops(path):
        fd = _own_fd(hop)
        if fd is not None:
            return fd
        if hop == "/proc" or hop.startswith("/proc/"):
            raise WriteError(f"{path}: cannot write the {what} (it leads through /proc to {hop}, which is not one of "
                             "parity's own open files; give a file path, or /dev/stdout)")
    return None


def is_stream(path: Path) -> bool:
    """Whether `path` leads to one of this process's open files (written to, never replaced); WriteError for
    another path through /proc."""
    return _stream(path, "file") is not None


def _write_to_fd(path: Path, fd: int, source: Path, what: str) -> None:
    """Copy the file `source` to the open descriptor `fd` (a stream: nothing renamed, truncated or reopened)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    try:
        with open(source, "rb") as src:
            while chunk := src.read(1 << 20):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
    except OSError as exc:
        raise WriteError(f"{path}: cannot write the {what} ({_why(exc)})") from None


_held_fifos: dict[tuple[int, int], int] = {}  # (st_dev, st_ino) -> a descriptor check_target opened


def _open_in_place(path: Path, real: Path, st: os.stat_result, what: str) -> int:
    """A descriptor on a file that is not a regular one, opened as it is: no create, no truncate, no wait."""
    held = _held_fifos.pop((st.st_dev, st.st_ino), None)
    if held is not None:
        return held
    try:
        fd = os.open(real, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise WriteError(f"{path}: cannot write the {what} (a FIFO nobody reads)") from None
        raise
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def _via_private_file(write: Callable[[Path], object], then: Callable[[Path], None]) -> None:
    """Have `write` write into a private temporary directory, then hand the file to `then`.

    For targets that are not renamed over: a library given the target's own path might rename its
    temporary file over it (safetensors does), replacing a device or a FIFO with a regular file.
    """
    with tempfile.TemporaryDirectory(prefix="parity-out-") as directory:
        source = Path(directory) / "out"
        write(source)
        then(source)


def check_target(path: Path, what: str = "file") -> None:
    """WriteError (one line) unless a write of `path` by this module will succeed; leaves nothing behind.

    A stream: open for writing. Not a regular file: opened as it is (a FIFO nobody reads is refused; the
    descriptor opened for one that has a reader is kept for the write). A regular or new file: an existing
    one writable, and its directory takes a new file (the temporary file the write renames into place).
    """
    fd = _stream(path, what)
    if fd is not None:
        try:
            mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
        except OSError:
            raise WriteError(f"{path}: cannot write the {what} (descriptor {fd} is not open)") from None
        if mode not in (os.O_WRONLY, os.O_RDWR):
            raise WriteError(f"{path}: cannot write the {what} (descriptor {fd} is not open for writing)")
        return
    try:
        real, st = _target(path)  # an OSError other than "not found" (a file as a directory, a name too long)
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise WriteError(f"{path}: cannot write the {what} (it is a directory)")
        if st is not None and not stat.S_ISREG(st.st_mode):
            if (st.st_dev, st.st_ino) not in _held_fifos:
                held = _open_in_place(path, real, st, what)
                if stat.S_ISFIFO(st.st_mode):
                    _held_fifos[(st.st_dev, st.st_ino)] = held  # closing it would end the reader's input
                else:
                    os.close(held)
            return
        if st is not None:
            os.close(os.open(real, os.O_WRONLY | os.O_APPEND))  # nothing truncated; a read-only file refused
        probe = real.parent / f".{real.name[:64]}{TMP_MARK}{secrets.token_hex(4)}"
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        os.unlink(probe)
    except OSError as exc:
        raise WriteError(f"{path}: cannot write the {what} ({_why(exc)})") from None


def write_atomic_with(path: Path, write: Callable[[Path], object], what: str = "file", fsync: bool = True) -> None:
    """Have `write(tmp)` write a temporary file beside `path`, then rename it over `path`.

    For libraries that write to a path themselves (safetensors, torch.onnx, matplotlib). `write`
    may raise anything; the temporary file is removed and the error is a WriteError when it is an
    OSError (the system refused), else it propagates.
    """
    stream = _stream(path, what)
    if stream is not None:  # /dev/stdout, /dev/fd/N: written to the descriptor, never renamed over
        fd = stream
        try:
            _via_private_file(write, lambda source: _write_to_fd(path, fd, source, what))
        except OSError as exc:
            raise WriteError(f"{path}: cannot write the {what} ({_why(exc)})") from None
        return
    real, st = _target(path)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise WriteError(f"{path}: cannot write the {what} (it is a directory)")
    if st is not None and not stat.S_ISREG(st.st_mode):  # /dev/null, /dev/full, a FIFO: written as it is
        def copy_in(source: Path) -> None:
            out = _open_in_place(path, real, st, what)
            try:
                _write_to_fd(path, out, source, what)
            finally:
                os.close(out)

        try:
            _via_private_file(write, copy_in)
        except OSError as exc:
            raise WriteError(f"{path}: cannot write the {what} ({_why(exc)})") from None
        return
    tmp = real.parent / f".{real.name[:64]}{TMP_MARK}{secrets.token_hex(4)}"
    try:
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)  # the umask applies, as for any new file
        mode = stat.S_IMODE(st.st_mode if st is not None else os.fstat(fd).st_mode)  # or the old file's
        os.close(fd)
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fchmod(f.fileno(), mode)  # a library may have recreated it private (safetensors does)
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, real)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise WriteError(f"{path}: cannot write the {what} ({_why(exc)})") from None
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if fsync:
        _fsync_dir(real.parent)


def write_bytes_atomic(path: Path, data: bytes, what: str = "file", fsync: bool = True) -> None:
    """Write `data` to `path` atomically (see the module docstring); WriteError (one line) on failure."""
    def write(target: Path) -> None:
        with open(target, "wb") as f:
            f.write(data)

    write_atomic_with(path, write, what, fsync)


def write_text_atomic(path: Path, text: str, what: str = "file", fsync: bool = True) -> None:
    """Write `text` (UTF-8) to `path` atomically; WriteError (one line) on failure."""
    write_bytes_atomic(path, text.encode("utf-8"), what, fsync)


def append_text_atomic(path: Path, text: str, what: str = "file", max_bytes: int = 16 << 20) -> None:
    """Append `text` to `path`: the old content plus `text` written as a new file and renamed over it.

    A target that is not a regular file (a device, a FIFO) is appended to directly. The old content
    is read only up to `max_bytes` (a larger file is refused, never truncated).
    """
    real, st = _target(path)
    if _stream(path, what) is not None or st is None or not stat.S_ISREG(st.st_mode):
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise WriteError(f"{path}: cannot write the {what} (it is a directory)")
        write_text_atomic(path, text, what)  # new: created; a stream, a device, a FIFO: written to as it is
        return
    if st.st_size > max_bytes:
        raise WriteError(f"{path}: cannot append to the {what} ({st.st_size} bytes, more than {max_bytes})")
    try:
        old = real.read_bytes()
    except OSError as exc:
        raise WriteError(f"{path}: cannot read the {what} to append to it ({_why(exc)})") from None
    write_bytes_atomic(path, old + text.encode("utf-8"), what)


def _real_directory(target: Path) -> Path:
    """The directory a write of `target` replaces: a symlink's target, never the link.

    Renamed aside, a link would take the files it points to with it: removing the old directory's files
    "in" the renamed link would delete them from the directory it points to.
    """
    return Path(os.path.realpath(target))


@contextlib.contextmanager
def staging_directory(target: Path) -> Iterator[Path]:
    """A new empty directory beside `target` (same file system, so it can be renamed into place).

    Removed on the way out unless `replace_directory` moved it into place: it is parity's own. When
    it was not moved (an error, Ctrl-C), the parent directories made for it are removed too, innermost
    first and only while empty: a failed command leaves nothing behind.
    """
    target = _real_directory(target)
    parent = target.parent
    made = [p for p in (parent, *parent.parents) if not p.exists()]
    staging = parent / f".{target.name[:64]}{STAGE_MARK}{secrets.token_hex(4)}"
    try:  # made inside the try: a Ctrl-C just after the mkdir still removes it
        try:
            parent.mkdir(parents=True, exist_ok=True)
            staging.mkdir(0o777)  # the umask applies
        except OSError as exc:
            raise WriteError(f"{target}: cannot create a directory beside it ({_why(exc)})") from None
        yield staging
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
            for directory in made:
                try:
                    directory.rmdir()
                except OSError:
                    break


def replace_directory(staging: Path, target: Path, owned: Collection[str]) -> None:
    """Swap the directory `staging` in as `target`.

    `target` must not exist, be empty, or hold only the entries named in `owned` (the files parity
    wrote there, checked by the caller): the old directory is renamed aside, the new one renamed
    in, and then only the `owned` files of the old one are removed, then the directory itself if it
    is empty. Anything else found in it is left where it is (in the renamed-aside directory, whose
    name is in the error) and nothing is lost.
    """
    target = _real_directory(target)
    try:
        if not target.exists() or (target.is_dir() and not any(target.iterdir())):
            os.replace(staging, target)  # POSIX: a directory may replace an empty directory
            _fsync_dir(target.parent)
            return
        old = target.parent / f".{target.name[:64]}{OLD_MARK}{secrets.token_hex(4)}"
        os.rename(target, old)
        try:
            os.rename(staging, target)
        except OSError:
            os.rename(old, target)
            raise
    except OSError as exc:
        raise WriteError(f"{target}: cannot put the new directory in place ({_why(exc)})") from None
    _fsync_dir(target.parent)
    for name in owned:
        with contextlib.suppress(FileNotFoundError):
            (old / name).unlink()
    try:
        old.rmdir()
    except OSError:
        left = sorted(p.name for p in old.iterdir())
        raise WriteError(f"{target}: written; the previous directory, moved to {old}, still holds "
                         f"{', '.join(left[:3])}, which parity did not write (not deleted)") from None


__all__ = ["WriteError", "append_text_atomic", "check_target", "is_stream", "replace_directory", "staging_directory",
           "write_atomic_with", "write_bytes_atomic", "write_text_atomic"]
