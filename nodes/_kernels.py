"""Locate the pack's ``kernels`` package.

ComfyUI imports the pack as a package named after its folder, so ``kernels`` is a sibling
package (``..kernels``). Tests and scripts may instead put the repository root first on
``sys.path`` and import ``nodes`` as a top-level package; then ``kernels`` is top-level too,
and must be the folder beside ``nodes/``: transformers 5.x installs another top-level package
named ``kernels``.
"""
from pathlib import Path

try:  # imported as <pack>.nodes
    from .. import kernels  # type: ignore[no-redef]
except ImportError:  # imported as top-level ``nodes``
    import kernels  # type: ignore[no-redef]

    _PACK_KERNELS = Path(__file__).resolve().parents[1] / "kernels"
    if Path(kernels.__file__).resolve().parent != _PACK_KERNELS:
        raise ImportError(f"`import kernels` found {kernels.__file__}, not the pack's library {_PACK_KERNELS}: "
                          "put the pack's folder first on sys.path")


__all__ = ["kernels"]
