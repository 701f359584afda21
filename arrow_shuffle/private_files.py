"""Private files: the shuffle's directories and files belong to the user who runs it, nobody else.

Why: map outputs hold the application's rows, and a discovery file tells a Python worker which
ports to authenticate to and which directory to write its map outputs into. Under a shared parent
(the system temp dir) another local user could create the root first, plant discovery files of
their own, or leave symlinks where arrowbeat is about to write. So, as ssh does for ``~/.ssh``:

- the root is a real directory (``lstat``: not a symlink), owned by this user and writable by
  nobody else; created 0700 (with any missing parents) when absent. Its existing ancestors may
  not be world-writable without the sticky bit (``/tmp`` is fine), or another user could rename it;
- every directory below it is created 0700 and checked with ``lstat`` after ``mkdir``: one that
  already existed (another agent of the application made it) passes only the same check;
- every file is created 0600 with ``O_CREAT | O_EXCL | O_NOFOLLOW``: an existing name or a planted
  symlink fails the create and nothing is written through it; a file other processes read
  whole is written under an ``O_EXCL`` temp name and renamed into place (``write_private_atomic``);
- a file read back (a discovery file) is opened with ``O_NOFOLLOW`` and trusted only if the opened
  file is a regular file owned by this user, writable by nobody else, and at most a few KiB;
- a path a peer names (a reducer asking an agent to stage map outputs) is used only if its real
  path lies inside the directory the agent owns (``resolve_inside``);
- every id that becomes a path component passes ``check_id``: letters, digits, ``.``, ``_``, ``-``,
  1..128 characters, not ``.`` or ``..``. Ids are refused, never rewritten: two ids mapped to
  the same name would share a directory.

Owner checks compare with ``os.geteuid()``: for a process running as root, a directory
``chown``ed to another uid is foreign too. Failures are ``UnsafePathError`` naming the path
(``UnsafeIdError`` naming the id). Spark-free: the engine layer, the Spark side builds on it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat

from arrow_shuffle.errors import UnsafeIdError, UnsafePathError

MAX_ID_LENGTH = 128
_ID = re.compile(r"[A-Za-z0-9._-]+")
_SHOWN = 80
"""Characters of a refused id or path shown in an error (they may come from the wire)."""


def _show(text: str) -> str:
    """A refused value, quoted and cut: control characters and newlines cannot reach a log raw."""
    return repr(text[:_SHOWN]) + ("..." if len(text) > _SHOWN else "")


def check_id(value: object, what: str) -> str:
    """``value`` as a path component, or ``UnsafeIdError`` naming ``what`` and the value.

    Ints (shuffle ids, partitions, pids) must be >= 0; strings must be 1..128 characters of
    ``[A-Za-z0-9._-]`` and not ``.`` or ``..`` (so no separator, NUL, space or newline)."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise UnsafeIdError(f"{what} must be a string or an integer, not {type(value).__name__}")
    if isinstance(value, int):
        if value < 0:
            raise UnsafeIdError(f"{what} {value} cannot be a path component: it is negative")
        return str(value)
    reason = ""
    if not value:
        reason = "it is empty"
    elif len(value) > MAX_ID_LENGTH:
        reason = f"it is longer than {MAX_ID_LENGTH} characters"
    elif value in (".", ".."):
        reason = "it names a directory itself"
    elif not _ID.fullmatch(value):
        bad = next(c for c in value if not _ID.fullmatch(c))
        reason = f"it contains {bad!r} (allowed: letters, digits, '.', '_', '-')"
    if reason:
        raise UnsafeIdError(f"{what} {_show(value)} cannot be a path component: {reason}")
    return value


def _refuse(path: str, st: os.stat_result, private: bool) -> str:
    """Why the directory behind ``st`` is not ours alone ("" when it is)."""
    me = os.geteuid()
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != me:
        return f"is owned by uid {st.st_uid}, not by this user (uid {me})"
    if private and mode & 0o077:
        return f"has mode {mode:o}, not 700"
    if mode & 0o022:
        return f"is writable by group or others (mode {mode:o})"
    return ""


def check_private_dir(path: str) -> str:
    """``path`` if it is a directory of ours alone (0700, our owner, not a symlink)."""
    reason = _refuse(path, os.lstat(path), private=True)
    if reason:
        raise UnsafePathError(f"{path} {reason}; arrowbeat's directories must be 0700 and owned by this user")
    return path


def make_private_dir(path: str) -> str:
    """Create ``path`` 0700 (its parent must exist), or accept it if it passes ``check_private_dir``."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return check_private_dir(path)
    st = os.lstat(path)
    if not stat.S_ISLNK(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)  # an unusual umask or a default ACL: ours, made exact
    return check_private_dir(path)


def check_root(path: str) -> str:
    """``path`` if it can be a shuffle root: a real directory of ours that nobody else may write."""
    reason = _refuse(path, os.lstat(path), private=False)
    if reason:
        raise UnsafePathError(
            f"shuffle root {path} {reason}; use a directory owned by this user and writable only by it "
            "(spark.arrowbeat.shuffle.dir), or remove this one"
        )
    return path


def _check_ancestors(path: str, root: str) -> None:
    """Refuse a root under a directory every user may write without the sticky bit."""
    folder = os.path.realpath(path)
    while True:
        st = os.stat(folder)
        if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
            raise UnsafePathError(
                f"{folder}, a parent of shuffle root {root}, is writable by every user without the sticky "
                "bit: another user could move the root away; choose another spark.arrowbeat.shuffle.dir"
            )
        parent = os.path.dirname(folder)
        if parent == folder:
            return
        folder = parent


def private_root(path: str) -> str:
    """The shuffle root ``path`` (absolute), created 0700 with any missing parents, and checked.

    An existing root may be any mode that lets nobody else write (an administrator's 0755 data
    directory); what arrowbeat creates is 0700."""
    path = os.path.abspath(path)
    missing: list[str] = []
    folder = path
    while not os.path.lexists(folder):
        missing.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    _check_ancestors(folder if missing else os.path.dirname(path), path)
    for created in reversed(missing):
        make_private_dir(created)
    return check_root(path)


def _create(path: str, flags: int) -> int:
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError as exc:  # O_EXCL: also a planted symlink, dangling or not
        raise UnsafePathError(
            f"{path} already exists (a planted file or symlink?): not writing through it"
        ) from exc
    try:
        os.fchmod(fd, 0o600)  # an unusual umask cannot leave it unreadable to us
    except OSError:
        os.close(fd)
        raise
    return fd


def create_private_file(path: str) -> int:
    """A new file ``path``, 0600, opened write-only; never an existing file or a symlink's target."""
    return _create(path, os.O_WRONLY)


def write_private_atomic(path: str, data: bytes) -> None:
    """Replace ``path`` with a 0600 file holding ``data``; a reader sees the old or the new file.

    The temp name is random and created ``O_EXCL``; ``os.replace`` renames over a planted
    symlink at ``path`` instead of following it."""
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = create_private_file(tmp)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def read_private_file(path: str, max_bytes: int) -> bytes:
    """The content of ``path`` if it is a regular file of ours that nobody else may write.

    ``lstat`` first (a FIFO or device is never opened), then the opened file itself is checked
    (``fstat``), so a file swapped in between is judged, not the one looked at. Missing:
    ``FileNotFoundError``; anything else untrusted: ``UnsafePathError``."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePathError(f"{path} is not a regular file (a symlink, FIFO or device?): not trusted")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePathError(f"{path} is a symlink: not trusted") from exc
        raise
    try:
        st = os.fstat(fd)
        mode = stat.S_IMODE(st.st_mode)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError(f"{path} is not a regular file: not trusted")
        if st.st_uid != os.geteuid():
            raise UnsafePathError(f"{path} is owned by uid {st.st_uid}, not by this user: not trusted")
        if mode & 0o022:
            raise UnsafePathError(f"{path} is writable by group or others (mode {mode:o}): not trusted")
        if st.st_size > max_bytes:
            raise UnsafePathError(f"{path} is {st.st_size} bytes, more than {max_bytes}: not trusted")
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise UnsafePathError(f"{path} grew past {max_bytes} bytes while read: not trusted")
        return b"".join(chunks)
    finally:
        os.close(fd)


def resolve_inside(base: str, path: object) -> str:
    """The real path of ``path`` if it lies strictly inside ``base`` (symlinks resolved); else
    ``UnsafePathError``. For paths a peer names: it gets what ``base`` holds, nothing else."""
    if not isinstance(path, str) or not path or "\0" in path or not os.path.isabs(path):
        shown = _show(path) if isinstance(path, str) else type(path).__name__
        raise UnsafePathError(f"{shown} is not an absolute path inside {base}")
    real_base = os.path.realpath(base)
    real = os.path.realpath(path)
    if real == real_base or os.path.commonpath([real_base, real]) != real_base:
        raise UnsafePathError(f"{_show(path)} is not inside {base}: refused")
    return real
