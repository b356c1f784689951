"""Every file and directory parity writes, written so that a failure never leaves a half-written one.

A file is written to a temporary file in the same directory (`.NAME.parity-tmp-XXXX`), flushed and
fsynced, then renamed over the target with `os.replace`: a full disk, a crash or a Ctrl-C leaves
the old file or the new one, never a truncated one. A target that is not a regular file (a
character device such as `/dev/null` or `/dev/full`, a FIFO) cannot be renamed over: it is written
directly. A symlink is followed: the file it points to is replaced, not the link.

A directory (a fixture) is built beside its target (`.NAME.parity-stage-XXXX`) and swapped in by
`replace_directory`; the directory it replaces is removed only file by file, and only the files
the caller says parity wrote (docs/security.md, "Files"). Failures raise `WriteError`: one line
naming the file and what the system said.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
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


def write_atomic_with(path: Path, write: Callable[[Path], object], what: str = "file", fsync: bool = True) -> None:
    """Have `write(tmp)` write a temporary file beside `path`, then rename it over `path`.

    For libraries that write to a path themselves (safetensors, torch.onnx, matplotlib). `write`
    may raise anything; the temporary file is removed and the error is a WriteError when it is an
    OSError (the system refused), else it propagates.
    """
    real, st = _target(path)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise WriteError(f"{path}: cannot write the {what} (it is a directory)")
    if st is not None and not stat.S_ISREG(st.st_mode):  # /dev/null, /dev/full, a FIFO: written as it is
        try:
            write(real)
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
    if st is None or not stat.S_ISREG(st.st_mode):
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise WriteError(f"{path}: cannot write the {what} (it is a directory)")
        if st is None:
            write_text_atomic(path, text, what)
            return
        try:
            with open(real, "a", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            raise WriteError(f"{path}: cannot write the {what} ({_why(exc)})") from None
        return
    if st.st_size > max_bytes:
        raise WriteError(f"{path}: cannot append to the {what} ({st.st_size} bytes, more than {max_bytes})")
    try:
        old = real.read_bytes()
    except OSError as exc:
        raise WriteError(f"{path}: cannot read the {what} to append to it ({_why(exc)})") from None
    write_bytes_atomic(path, old + text.encode("utf-8"), what)


@contextlib.contextmanager
def staging_directory(target: Path) -> Iterator[Path]:
    """A new empty directory beside `target` (same file system, so it can be renamed into place).

    Removed on the way out unless `replace_directory` moved it into place: it is parity's own. When
    it was not moved (an error, Ctrl-C), the parent directories made for it are removed too, innermost
    first and only while empty: a failed command leaves nothing behind.
    """
    parent = target.absolute().parent
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
    target = target.absolute()
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


__all__ = ["WriteError", "append_text_atomic", "replace_directory", "staging_directory", "write_atomic_with",
           "write_bytes_atomic", "write_text_atomic"]
