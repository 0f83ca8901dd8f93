"""Writing files without following symbolic links.

Every file the pack writes (presets, loss tables, q/k/v samples) goes through
:func:`write_file`. Presets and tables are written into shared folders where a link could
point anywhere, so:

* a symbolic link at the target path (dangling or not) is refused with a ValueError, never
  followed;
* the data goes to a new temporary file in the same folder (created with ``O_EXCL`` and
  ``O_NOFOLLOW``), which then replaces the target with :func:`os.replace`: a rename replaces
  a directory entry and never writes through a link, and a reader never sees a half-written
  file;
* the file gets the permissions of any new file of the process (0666 less the umask: 0644
  under the usual umask 022, 0600 under 077): q/k/v samples hold the activations of the
  user's prompts, so the pack is never more open than the user's umask asks;
* without ``overwrite`` an existing target is refused.

:func:`check_output_path` runs the checks on the target (not empty, not a folder or a link, in
an existing folder this process can write in) on their own, so that a command checks its
output path before its work; a failure while writing is a ValueError naming the target, never
the temporary file.
"""
from __future__ import annotations

import os
import secrets

__all__ = ["write_file", "refuse_link", "check_output_path"]


def refuse_link(path) -> None:
    """ValueError when ``path`` is a symbolic link (the pack never writes through one)."""
    if os.path.islink(path):
        raise ValueError(f"{path} is a symbolic link; refusing to write through it "
                         "(remove the link or choose another name)")


def check_output_path(path, what: str = "") -> str:
    """``path`` as a str if a file can be created or replaced there, else a ValueError naming
    ``what`` (an argument or widget) and the path."""
    path = os.fspath(path)
    prefix = f"{what}: " if what else ""
    if not path:
        raise ValueError(f"{prefix}the path is empty; give a file name")
    try:
        refuse_link(path)
    except ValueError as e:
        raise ValueError(f"{prefix}{e}") from None
    if os.path.isdir(path):
        raise ValueError(f"{prefix}{path} is a folder; give a file name")
    if os.path.lexists(path) and not os.path.isfile(path):
        raise ValueError(f"{prefix}{path} exists and is not a regular file")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"{prefix}the folder {folder} does not exist (create it first)")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{prefix}no permission to create files in {folder}")
    return path


def write_file(path, data, *, overwrite: bool = True) -> None:
    """Create or replace the regular file ``path``.

    ``data`` is bytes, or a callable that writes the file at the path it is given (for
    writers that take a path, like safetensors' ``save_file``).
    """
    path = check_output_path(path)
    if not overwrite and os.path.lexists(path):
        raise ValueError(f"{path} exists; choose another name or allow overwriting")
    folder = os.path.dirname(os.path.abspath(path))
    try:
        _write_through_temporary(path, folder, data, overwrite)
    except OSError as e:  # the temporary file's name means nothing to the user
        raise ValueError(f"cannot write {path}: {e.strerror or type(e).__name__}") from None


def _new_temporary(path, folder) -> tuple[int, str]:
    """A new file beside ``path``, open for writing, with the umask's permissions (not
    :func:`tempfile.mkstemp`'s fixed 0600)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    while True:
        tmp = os.path.join(folder, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue


def _write_through_temporary(path, folder, data, overwrite) -> None:
    fd, tmp = _new_temporary(path, folder)
    mode = os.fstat(fd).st_mode & 0o777  # 0666 less the umask, without changing the umask
    try:
        if callable(data):
            os.close(fd)
            fd = -1
            data(tmp)
            os.chmod(tmp, mode)  # a writer may replace the file (safetensors makes it 0600)
        else:
            with os.fdopen(fd, "wb") as f:
                fd = -1
                f.write(data)
        refuse_link(path)  # a link made while we were writing is still not followed
        if not overwrite and os.path.lexists(path):
            raise ValueError(f"{path} exists; choose another name or allow overwriting")
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
