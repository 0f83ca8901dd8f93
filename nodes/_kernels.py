"""Locate the pack's ``kernels`` package.

ComfyUI imports the pack as a package named after its folder, so ``kernels`` is a sibling
package (``..kernels``). Tests and scripts may instead put the repository root on
``sys.path`` and import ``nodes`` as a top-level package; then ``kernels`` is top-level too.
"""
try:  # imported as <pack>.nodes
    from .. import kernels  # type: ignore[no-redef]
except ImportError:  # imported as top-level ``nodes``
    import kernels  # type: ignore[no-redef]

__all__ = ["kernels"]
