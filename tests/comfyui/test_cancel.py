"""Cancel means cancel: ComfyUI's interrupt (POST /interrupt, the UI's Cancel) stops a prompt
whose model carries the PSA Mask Search or the Sparse Attention Patch, in a real server.

ComfyUI raises its interrupt from the first progress update or layer after the flag is set and
clears the flag as it raises, so a guard that swallows it lets the run go on to the end. The
search's progress bar updates inside the attention override, and the candidate evaluation is
most of each call's time (the sizes below make it so), so the interrupt arrives there.
"""
from __future__ import annotations

import time
import urllib.request
import uuid

import pytest

import comfyui_harness as h  # puts tools/ on sys.path
import tiny_models as tiny

pytestmark = pytest.mark.slow  # a ComfyUI server and long runs that it interrupts

WAN_FILE = tiny.FILES["wan21_t2v"]["diffusion_models"][0]
LATENT = {"width": 256, "height": 256, "length": 17, "batch_size": 1}   # Wan token grid 5 x 16 x 16
SEARCH_STEPS = 30      # about 2 s each: far longer than the test waits after /interrupt
PATCH_STEPS = 1000     # the patch's steps are quicker; this run would still take minutes


@pytest.fixture(scope="module")
def server(tmp_path_factory, comfyui):
    """main.py --cpu with the tiny Wan 2.1 file and the text-encoder stand-in. (Depends on
    ``comfyui`` so that ComfyUI's modules are importable here for writing the tiny file.)"""
    base = tmp_path_factory.mktemp("cancel-server")
    (base / "custom_nodes").mkdir()
    (base / "custom_nodes" / tiny.TEXT_ENCODE_NODE_FOLDER).symlink_to(tiny.TEXT_ENCODE_NODE_DIR)
    tiny.write_models(base / "models", "wan21_t2v")
    srv = h.start_server(base)
    yield srv
    srv.stop()


def prompt_with(model_node: dict, prefix: str, steps: int) -> dict:
    """Tiny Wan → ``model_node`` (its input "model" filled in) → KSampler → SaveLatent."""
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": WAN_FILE, "weight_dtype": "default"}},
        "2": {"class_type": "SVATestTextEncode", "inputs": {"text": "a fox", "encoder": "wan", "tokens": 16}},
        "3": {"class_type": model_node["class_type"], "inputs": {"model": ["1", 0], **model_node["inputs"]}},
        "4": {"class_type": "EmptyHunyuanLatentVideo", "inputs": dict(LATENT)},
        "5": {"class_type": "KSampler", "inputs": {
            "model": ["3", 0], "seed": 0, "steps": steps, "cfg": 1.0, "sampler_name": "euler",
            "scheduler": "simple", "positive": ["2", 0], "negative": ["2", 0], "latent_image": ["4", 0],
            "denoise": 1.0}},
        "6": {"class_type": "SaveLatent", "inputs": {"samples": ["5", 0], "filename_prefix": prefix}},
    }


def run_and_cancel(server, prompt: dict, started: str, timeout_s: float = 300, stop_s: float = 60) -> dict:
    """Submit ``prompt``, wait until ``started`` appears in the server log after submitting,
    let it run a moment, POST /interrupt, and return the prompt's /history entry, which must
    come within ``stop_s`` (a step takes a few seconds; the whole run many times that)."""
    log_start = len(server.log_text())
    pid = server.post_json("/prompt", {"prompt": prompt, "client_id": f"svattn-{uuid.uuid4().hex[:8]}"})["prompt_id"]
    deadline = time.monotonic() + timeout_s
    while started not in server.log_text()[log_start:]:
        assert time.monotonic() < deadline, f"{started!r} never logged:\n{server.log_text()[log_start:][-3000:]}"
        assert pid not in server.get_json(f"/history/{pid}"), "the prompt ended before it could be cancelled"
        time.sleep(0.1)
    time.sleep(1.0)
    with urllib.request.urlopen(urllib.request.Request(server.url + "/interrupt", data=b"{}", method="POST"),
                                timeout=30) as response:   # answers with an empty body
        assert response.status == 200
    deadline = time.monotonic() + stop_s
    while time.monotonic() < deadline:
        hist = server.get_json(f"/history/{pid}")
        if pid in hist and hist[pid].get("status", {}).get("completed") is not None:
            return hist[pid]
        time.sleep(0.2)
    raise AssertionError(f"prompt {pid} went on for {stop_s} s after /interrupt")


def assert_interrupted(entry: dict):
    status = entry["status"]
    events = [m[0] for m in status["messages"]]
    assert status["status_str"] == "error" and "execution_interrupted" in events, status
    assert "execution_error" not in events and not entry["outputs"], entry


def test_cancel_stops_the_mask_search_and_writes_no_table(server):
    name = f"cancelled_{uuid.uuid4().hex[:6]}"
    search = {"class_type": "PSAMaskSearch", "inputs": {
        "table_name": name, "tile": "1,2,2", "steps": "", "bucket_edges": "", "max_candidates": 256,
        "query_tiles": 0, "rows_per_tile": 0, "seed": 0, "accumulate": False, "save_qkv": False,
        "qkv_max_gb": 20.0}}
    entry = run_and_cancel(server, prompt_with(search, name, SEARCH_STEPS), "calls to evaluate")
    assert_interrupted(entry)
    assert not (server.base_dir / "models" / "psa_loss_tables" / f"{name}.safetensors").exists()
    assert not list((server.base_dir / "output").glob(f"{name}*"))


def test_cancel_stops_the_sparse_attention_patch(server):
    name = f"cancelled_sol_{uuid.uuid4().hex[:6]}"
    patch = {"class_type": "SparseAttentionPatch", "inputs": {
        "method": "sol_attn", "beta": 1.5, "target_sparsity": 0.0, "estimator": "exact", "warmup": 0.0,
        "final_dense": 0.0, "dense_blocks": "", "min_tokens": 0, "sol_tile": "auto", "backend": "reference",
        "preset_grid": "refuse"}}
    entry = run_and_cancel(server, prompt_with(patch, name, PATCH_STEPS), "dense because")
    assert_interrupted(entry)
    assert not list((server.base_dir / "output").glob(f"{name}*"))
