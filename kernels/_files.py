"""Writing files without following symbolic links.

Every file the pack writes (presets, loss tables, q/k/v samples) goes through
:func:`write_file`. Presets and tables are written into shared folders where a link could
point anywhere, so:

* a symbolic link at the target path (dangling or not) is refused with a ValueError, never
  followed;
* the data goes to a new temporary file in the same folder (created with ``O_EXCL`` and
  ``O_NOFOLLOW`` by :func:`tempfile.mkstemp`), which then replaces the target with
  :func:`os.replace`: a rename replaces a directory entry and never writes through a link,
  and a reader never sees a half-written file;
* without ``overwrite`` an existing target is refused.
"""
from __future__ import annotations

import os
import tempfile

__all__ = ["write_file", "refuse_link"]


def refuse_link(path) -> None:
    """ValueError when ``path`` is a symbolic link (the pack never writes through one)."""
    if os.path.islink(path):
        raise ValueError(f"{path} is a symbolic link; refusing to write through it "
                         "(remove the link or choose another name)")


def write_file(path, data, *, overwrite: bool = True) -> None:
    """Create or replace the regular file ``path``.

    ``data`` is bytes, or a callable that writes the file at the path it is given (for
    writers that take a path, like safetensors' ``save_file``).
    """
    path = os.fspath(path)
    refuse_link(path)
    if not overwrite and os.path.lexists(path):
        raise ValueError(f"{path} exists; choose another name or allow overwriting")
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        if callable(data):
            os.close(fd)
            fd = -1
            data(tmp)
        else:
            with os.fdopen(fd, "wb") as f:
                fd = -1
                f.write(data)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; a preset is meant to be shared
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
