"""Locate the pack's ``kernels`` package.

ComfyUI imports the pack as a package named after its folder, so ``kernels`` is a sibling
package (``..kernels``). Tests and scripts may instead put the repository root on
``sys.path`` and import ``nodes`` as a top-level package; then ``kernels`` is top-level too.
"""
import importlib

try:  # imported as <pack>.nodes
    from .. import kernels  # type: ignore[no-redef]
except ImportError:  # imported as top-level ``nodes``
    import kernels  # type: ignore[no-redef]


def kernels_module(name: str):
    """A submodule of the same ``kernels`` package, e.g. ``kernels_module("presets")``."""
    return importlib.import_module(f"{kernels.__name__}.{name}")


__all__ = ["kernels", "kernels_module"]
