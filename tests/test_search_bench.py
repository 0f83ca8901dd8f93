"""benchmarks/search_bench.py under torchrun (2 gloo processes, tiny shapes) equals one process."""
import json
import os
import socket
import subprocess
import sys

import torch

from kernels.presets import load_preset
from kernels.psa_search import LossTable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "search_bench.py")
# grid 4x6x8 with tile 2x4x4 pads H to 8: key blocks with padding slots
TINY = ["--layers", "3", "--heads", "4", "--head-dim", "16", "--grid", "4", "6", "8", "--tile", "2", "4", "4",
        "--max-candidates", "12", "--rows-per-tile", "8", "--seed", "3", "--alphas", "0.01", "0.1"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env():
    env = {k: v for k, v in os.environ.items()
           if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "TORCHELASTIC_RUN_ID")}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")  # torchrun's thread setting, gloo on the CPU
    return env


def _run(cmd):
    r = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_two_process_benchmark_equals_one_process(tmp_path):
    two = str(tmp_path / "two" / "bench.json")
    out = _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), SCRIPT, *TINY, "--out", two])
    assert "[rank 1/2] layer 2 (3/3)" in out and "not applicable to these settings" in out
    one = str(tmp_path / "one" / "bench.json")
    _run([sys.executable, SCRIPT, *TINY, "--out", one])

    doc = json.load(open(two))
    assert doc["status"] == "done" and doc["command"].startswith("torchrun --nproc_per_node 2 ")
    env = doc["environment"]
    assert env["world_size"] == 2 and env["backend"] == "gloo" and env["devices"] == ["cpu", "cpu"]
    assert env["torch"] == torch.__version__
    st = doc["settings"]
    assert st["grid"] == [4, 6, 8] and st["tile"] == [2, 4, 4] and st["layers"] == 3 and st["heads"] == 4
    assert st["candidates"] == 12 and st["query_tiles"] is None and st["rows_per_tile"] == 8
    assert st["query_rows_per_head"] == 8 * 8  # all 8 query blocks, 8 rows each
    t = doc["timing"]
    assert len(t["per_rank"]) == 2 and t["total_wall_s"] == max(r["total_s"] for r in t["per_rank"])
    for r in t["per_rank"]:
        assert r["layers_generated"] == 3 and r["generation_s"] > 0 and r["evaluation_s"] > 0
    assert doc["target"] == dict(doc["target"], seconds=1200, applies=False, met=None)
    assert doc["checks"] == {"generation_identical_across_ranks": True, "evaluated_heads": 12, "expected_heads": 12}
    assert doc["progress"]["calls_done"] == 3 and len(doc["progress"]["rank0_layers"]) == 3
    assert set(doc["table"]["selections"]) == {"alpha=0.01", "alpha=0.1", "target_sparsity=0.6"}

    # the table equals the one-process run bit for bit (same thread setting)
    t2 = LossTable.load(os.path.join(os.path.dirname(two), doc["files"]["table"]))
    t1 = LossTable.load(os.path.join(os.path.dirname(one), "bench.table.safetensors"))
    assert t2.settings["world_size"] == 2 and t1.settings["world_size"] == 1
    assert t2.layers == [0, 1, 2] and t2.calls.tolist() == [[1]] * 3
    for name in ("candidates", "sq_err", "ref_sq", "count", "calls"):
        assert torch.equal(getattr(t2, name), getattr(t1, name)), name
    sel = t2.select(target_sparsity=0.6)
    assert doc["table"]["selections"]["target_sparsity=0.6"]["mean_sparsity"] == sel.mean_sparsity

    # the preset: the selection at target sparsity 0.6, marked as synthetic
    p = load_preset(os.path.join(os.path.dirname(two), doc["files"]["preset"]))
    assert torch.equal(p.params, sel.params)
    assert p.source == "geometry" and p.search["rule"] == "target_sparsity" and p.search["value"] == 0.6
    assert p.fingerprint == {"layers": 3, "heads": 4, "head_dim": 16, "hidden_size": 64}
    assert "SYNTHETIC WORKLOAD, NOT SEARCHED ON THE REAL MODEL" in p.notes
    assert p.name == doc["preset"]["name"] == "bench_synthetic"
