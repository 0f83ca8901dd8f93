"""Build the shipped PSA presets (mask_presets/) from attention geometry and a synthetic workload.

No model weights are available here, so these presets are NOT searched on the real models.
For each model this script takes its real geometry (architecture fingerprint, latent grid
after patchify at one resolution/frame count, the model's 3D RoPE frequencies and axis
split) and runs PSA-Search (kernels.psa_search) on a *bank* of synthetic heads made by
benchmarks.workload.video_qkv on the real token grid with that RoPE:

1. bank: B synthetic heads (kinds local/temporal/spatial/global, cycled) on the full grid;
   for LTX-2, whose split RoPE gives every head index its own frequency band, one pair of
   heads (two kinds) per head index, each with that head's frequencies;
2. loss table: every candidate of candidate_space(grid, tile) (the paper's C.2 ranges adapted
   to the grid) on every bank head, on QUERY_TILES sampled query blocks x ROWS_PER_TILE rows
   (the real grid, all keys; only the query rows are subsampled);
3. selection: per bank head, the lowest-loss candidate with sparsity >= TARGET (mse metric);
4. assignment: the workload has no notion of layers, so every (layer, head) slot of the model
   gets one bank head by a seeded draw (LTX-2: a bank head of its own head index).

The loss tables are kept in tools/preset_tables/ so that the selection can be re-run (and is
checked by tests/kernels/test_shipped_presets.py) without re-evaluating anything.

    python tools/build_presets.py                 # build all, write mask_presets/ + tables
    python tools/build_presets.py --only ltx2_720p_121f
    python tools/build_presets.py --reselect      # presets from the committed tables only
    python tools/build_presets.py --check         # reselect and compare with the committed files
"""
from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.workload import DEFAULT_MIX, video_qkv  # noqa: E402
from kernels.preset_file import Preset, preset_to_json  # noqa: E402
from kernels.psa_search import LossTable, PSASearchAccumulator, candidate_space  # noqa: E402

PRESET_DIR = os.path.join(ROOT, "mask_presets")
TABLE_DIR = os.path.join(ROOT, "tools", "preset_tables")

# Search settings shared by every preset (recorded in each preset and table).
TARGET_SPARSITY = 0.6          # the paper's operating point (~60 %)
METRIC = "mse"
MAX_CANDIDATES = 128
QUERY_TILES = 16
ROWS_PER_TILE = 8
SEED = 0
THREADS = 2
CREATED = "2025-01-01"         # fixed, so that a rebuild is byte-identical
AUTHOR = "sparse-video-attention (tools/build_presets.py)"


# ------------------------------------------------------------------ RoPE of each family
def rope_bands_theta(head_dim, bands, theta):
    """(omega, axis) per rotation pair for a band-split 3D RoPE: consecutive bands of
    ``bands`` = (t, h, w) dims, pair p of a band of n dims turns by theta^(-2p/n) per token."""
    om, ax = [], []
    assert sum(bands) == head_dim
    for a, n in enumerate(bands):
        p = torch.arange(n // 2, dtype=torch.float64)
        om.append(theta ** (-2.0 * p / n))
        ax.append(torch.full((n // 2,), a, dtype=torch.long))
    return torch.cat(om), torch.cat(ax)


def rope_ltx2_head(head, heads=32, head_dim=128, theta=10000.0, max_pos=(20, 2048, 2048),
                   scale=(8, 32, 32), frame_rate=25.0):
    """(omega, axis) of one head under LTX-2's split RoPE (comfy/ldm/lightricks): inner_dim//6
    frequencies theta^linspace(0, 1)·π/2 per axis, interleaved (f, axis), left-padded with
    identity pairs to inner_dim/2 entries and cut into heads of head_dim/2 entries. The angle
    is freq·(2·pos/max_pos − 1), pos in pixels (time in seconds at ``frame_rate``), so one
    latent step turns a pair by freq·2·s/max_pos, s = 8/frame_rate (t) or 32 (h, w)."""
    inner = heads * head_dim
    F = inner // 6
    freq = theta ** torch.linspace(0, 1, F, dtype=torch.float64) * math.pi / 2
    step = torch.tensor([2 * scale[0] / frame_rate / max_pos[0], 2 * scale[1] / max_pos[1], 2 * scale[2] / max_pos[2]],
                        dtype=torch.float64)
    omega_all = (freq[:, None] * step[None, :]).reshape(-1)          # (F*3,) order (f, axis)
    axis_all = torch.arange(3).repeat(F)
    pad = inner // 2 - 3 * F
    omega_all = torch.cat([torch.zeros(pad, dtype=torch.float64), omega_all])
    axis_all = torch.cat([torch.zeros(pad, dtype=torch.long), axis_all])
    n = head_dim // 2
    return omega_all[head * n:(head + 1) * n].clone(), axis_all[head * n:(head + 1) * n].clone()


# ------------------------------------------------------------------ the shipped presets
SPECS = {
    "wan2.1_1.3b_480p_81f": dict(
        family="wan", model_name="Wan2.1-T2V-1.3B",
        fingerprint=dict(layers=30, heads=12, head_dim=128, hidden_size=1536),
        video="832x480, 81 frames; Wan VAE 4x8x8, patch 1x2x2",
        grid=(21, 30, 52), tile=(3, 8, 8), rope="wan", bank=16,
        arch="WanModel dim 1536, 30 blocks, num_heads = dim // 128 (comfy/model_detection.py); "
             "3D RoPE theta 10000, head-dim split d-4(d//6) / 2(d//6) / 2(d//6) = 44/42/42 (comfy/ldm/wan/model.py)",
        tile_note="tile 3x8x8 (192 tokens, 3 x 64): grid padded to 21x32x56, block grid 7x4x7; "
                  "the paper gives no 480p tile",
    ),
    "wan2.1_14b_720p_81f": dict(
        family="wan", model_name="Wan2.1-T2V-14B",
        fingerprint=dict(layers=40, heads=40, head_dim=128, hidden_size=5120),
        video="1280x720, 81 frames; Wan VAE 4x8x8, patch 1x2x2",
        grid=(21, 45, 80), tile=(3, 8, 16), rope="wan", bank=16,
        arch="WanModel dim 5120, 40 blocks, num_heads = dim // 128; 3D RoPE theta 10000, split 44/42/42",
        tile_note="tile 3x8x16 as in the PSA paper (appendix C.2): grid padded to 21x48x80, block grid 7x6x5",
    ),
    "hunyuan_video_720p_129f": dict(
        family="hunyuan_video", model_name="HunyuanVideo (T2V, 13B)",
        fingerprint=dict(layers=60, heads=24, head_dim=128, hidden_size=3072),
        video="1280x720, 129 frames; HunyuanVideo VAE 4x8x8, patch 1x2x2",
        grid=(33, 45, 80), tile=(3, 8, 16), rope="hunyuan", bank=16,
        arch="20 double-stream + 40 single-stream blocks (layers 0-19 double, 20-59 single, as the "
             "nodes number them), hidden 3072, num_heads = hidden // 128 = 24; 3D RoPE theta 256, "
             "axes_dim 16/56/56 (comfy/model_detection.py)",
        tile_note="tile 3x8x16 as in the PSA paper (appendix C.2): grid padded to 33x48x80, block grid 11x6x5; "
                  "the text tokens of the joint attention are PSA extra tokens (always kept) and were not "
                  "part of this synthetic search",
    ),
    "hunyuan_video1.5_720p_121f": dict(
        family="hunyuan_video", model_name="HunyuanVideo 1.5 (8.3B, t2v and i2v)",
        fingerprint=dict(layers=54, heads=16, head_dim=128, hidden_size=2048),
        video="1280x720, 121 frames; HunyuanVideo 1.5 VAE 4x16x16 (EmptyHunyuanVideo15Latent), patch 1x1x1",
        grid=(31, 45, 80), tile=(3, 8, 16), rope="hunyuan", bank=16,
        arch="54 double-stream blocks and no single-stream ones (layers 0-53), hidden 2048, num_heads = "
             "hidden // 128 = 16; 3D RoPE theta 256, axes_dim 16/56/56 (comfy/model_detection.py, class "
             "HunyuanVideo15 for a file with vision_in)",
        tile_note="tile 3x8x16 as the PSA paper's HunyuanVideo 720p one (appendix C.2): grid padded to 33x48x80, "
                  "block grid 11x6x5; the text, glyph and (i2v) SigLIP vision tokens of the joint attention are PSA "
                  "extra tokens (always kept) and were not part of this synthetic search",
    ),
    "wan2.2_ti2v_5b_720p_121f": dict(
        family="wan", model_name="Wan2.2-TI2V-5B",
        fingerprint=dict(layers=30, heads=24, head_dim=128, hidden_size=3072),
        video="1280x704, 121 frames (Wan22ImageToVideoLatent's default size); Wan 2.2 VAE 4x16x16, patch 1x2x2",
        grid=(31, 22, 40), tile=(2, 8, 8), rope="wan", bank=16,
        arch="WanModel dim 3072, 30 blocks, in/out 48 channels (detected as WAN22_T2V), num_heads = dim // 128 = 24; "
             "3D RoPE theta 10000, split 44/42/42 (comfy/ldm/wan/model.py)",
        tile_note="tile 2x8x8 (128 tokens): grid padded to 32x24x40, block grid 16x3x5; the paper gives no tile "
                  "for this grid",
    ),
    "ltx2.3_720p_121f": dict(
        family="ltx2", model_name="LTX-2.3 / LTX-2.5 (LTXAVModel 22B video stream)",
        fingerprint=dict(layers=48, heads=32, head_dim=128, hidden_size=4096),
        video="1280x720 (latent as 1280x704), 121 frames (5 s at 24 fps, ComfyUI's LTX-2.5 template; its LTX-2.3 "
              "template's 5 s at 25 fps, 126 frames, has the same 16 latent frames); LTX VAE 8x32x32, patch 1",
        grid=(16, 22, 40), tile=(2, 4, 8), rope="ltx2", bank=2, frame_rate=24.0,
        arch="LTXAVModel num_layers 48, num_attention_heads 32, attention_head_dim 128 from the file's config "
             "metadata, with gated attention and cross-attention AdaLN (comfy/ldm/lightricks/av_model.py); split "
             "RoPE theta 10000, max_pos 20/2048/2048, VAE scale 8/32/32, frame rate 24",
        tile_note="tile 2x4x8 (64 tokens): grid padded to 16x24x40, block grid 8x6x5; the grid of the templates' "
                  "second (upscaled) stage at 1280x720",
    ),
    "ltx2_720p_121f": dict(
        family="ltx2", model_name="LTX-2 (LTXAVModel video stream)",
        fingerprint=dict(layers=48, heads=32, head_dim=128, hidden_size=4096),
        video="1280x704 (ComfyUI floors 1280x720 to the same latent), 121 frames; LTX VAE 8x32x32, patch 1",
        grid=(16, 22, 40), tile=(2, 4, 8), rope="ltx2", bank=2,   # bank: heads per head index
        arch="LTXAVModel num_layers 48, num_attention_heads 32, attention_head_dim 128 "
             "(comfy/ldm/lightricks/av_model.py); split RoPE theta 10000, max_pos 20/2048/2048, "
             "VAE scale 8/32/32, frame rate 25",
        tile_note="tile 2x4x8 (64 tokens): grid padded to 16x24x40, block grid 8x6x5",
    ),
}


def bank_of(spec):
    """[(kind, rope (omega, axis), seed, head_index or None)] of the synthetic heads."""
    hd = spec["fingerprint"]["head_dim"]
    if spec["rope"] == "ltx2":
        H = spec["fingerprint"]["heads"]
        out = []
        for h in range(H):
            rope = rope_ltx2_head(h, heads=H, head_dim=hd, frame_rate=spec.get("frame_rate", 25.0))
            for v in range(spec["bank"]):
                out.append((DEFAULT_MIX[(spec["bank"] * h + v) % len(DEFAULT_MIX)], rope, SEED + 1000 + h, h))
        return out
    rope = rope_bands_theta(hd, (hd - 4 * (hd // 6), 2 * (hd // 6), 2 * (hd // 6)), 10000.0) if spec["rope"] == "wan" \
        else rope_bands_theta(hd, (16, 56, 56), 256.0)
    return [(DEFAULT_MIX[i % len(DEFAULT_MIX)], rope, SEED, None) for i in range(spec["bank"])]


def bank_qkv(spec, bank, only=None):
    """q, k, v (1, L, B, D) bf16 of the bank heads (``only``: a subset of bank indices, the
    others zero); heads sharing (rope, seed) are made by one video_qkv call."""
    hd = spec["fingerprint"]["head_dim"]
    groups = {}
    for i, (kind, rope, seed, hidx) in enumerate(bank):
        if only is None or i in only:
            groups.setdefault((seed, hidx), []).append(i)
    L = math.prod(spec["grid"])
    q = torch.zeros(1, L, len(bank), hd, dtype=torch.bfloat16)
    k, v = torch.zeros_like(q), torch.zeros_like(q)
    for (seed, _), idx in groups.items():
        # every group is made whole (same draws as in the full build), then subset
        full = [i for i, b in enumerate(bank) if (b[2], b[3]) == (seed, bank[idx[0]][3])]
        kinds = [bank[i][0] for i in full]
        qq, kk, vv, _ = video_qkv(spec["grid"], len(full), hd, kinds=kinds, seed=seed, rope=bank[full[0]][1],
                                  dtype=torch.bfloat16)
        for j, i in enumerate(full):
            if i in idx:
                q[:, :, i], k[:, :, i], v[:, :, i] = qq[:, :, j], kk[:, :, j], vv[:, :, j]
    return q, k, v


def search_bank(spec, only=None):
    """The loss table of the bank (one 'layer', bank heads as heads)."""
    bank = bank_of(spec)
    cands = candidate_space(spec["grid"], spec["tile"], max_candidates=MAX_CANDIDATES, seed=SEED)
    owned = None if only is None else (lambda layer, head: head in only)
    acc = PSASearchAccumulator(spec["grid"], spec["tile"], len(bank), candidates=cands, query_tiles=QUERY_TILES,
                               rows_per_tile=ROWS_PER_TILE, seed=SEED, owned=owned)
    q, k, v = bank_qkv(spec, bank, only)
    acc.add(q, k, v, layer=0, step=0.0)
    table = acc.table()
    table.settings["bank_kinds"] = [b[0] for b in bank]
    table.settings["bank_seeds"] = [b[2] for b in bank]
    table.settings["bank_head_index"] = [b[3] for b in bank]
    return table


def assignment(spec, n_bank):
    """int64 (layers, heads): the bank head of every (layer, head) slot, seeded draw."""
    Ls, H = spec["fingerprint"]["layers"], spec["fingerprint"]["heads"]
    out = torch.zeros(Ls, H, dtype=torch.int64)
    for layer in range(Ls):
        rng = random.Random(f"{SEED}:{layer}")
        for h in range(H):
            if spec["rope"] == "ltx2":
                out[layer, h] = h * spec["bank"] + rng.randrange(spec["bank"])
            else:
                out[layer, h] = rng.randrange(n_bank)
    return out


def preset_from_table(name, spec, table: LossTable) -> Preset:
    sel = table.select(target_sparsity=TARGET_SPARSITY, metric=METRIC)
    bank_params, bank_loss, bank_sp = sel.params[0, 0], sel.loss[0, 0], sel.sparsity[0, 0]
    a = assignment(spec, bank_params.shape[0])
    params = bank_params[a][None]                       # (1, layers, heads, 6)
    sp = bank_sp[a]
    loss = bank_loss[a]
    kinds = table.settings["bank_kinds"]
    mix = {k: sum(1 for x in kinds if x == k) for k in dict.fromkeys(kinds)}
    fp = spec["fingerprint"]
    notes = (
        "GEOMETRY PRESET, NOT SEARCHED ON THE REAL MODEL (no weights were available). "
        f"Geometry: {spec['video']} -> token grid {list(spec['grid'])}; {spec['arch']}; {spec['tile_note']}. "
        f"Masks: PSA-Search (kernels.psa_search) on a bank of {len(kinds)} synthetic heads "
        f"(benchmarks.workload.video_qkv on the full grid with this model's RoPE; kinds {mix}), "
        f"{table.candidates.shape[0]} candidates (paper C.2 ranges adapted to the grid), "
        f"{QUERY_TILES} query blocks x {ROWS_PER_TILE} rows sampled, all keys, seed {SEED}; per bank head the "
        f"lowest-{METRIC} candidate with sparsity >= {TARGET_SPARSITY}; each (layer, head) of the model then "
        "gets a bank head by a seeded draw" + (" of its own head index (LTX-2's RoPE band differs per head)"
                                                if spec["rope"] == "ltx2" else "") +
        ", so which real head gets which mask is arbitrary. Losses are on synthetic data. "
        "Search a real preset for quality (docs/PRESETS.md). Built by tools/build_presets.py."
    )
    return Preset(
        name=name, family=spec["family"], model_name=spec["model_name"], fingerprint=dict(fp),
        grid=tuple(spec["grid"]), tile=tuple(spec["tile"]), params=params, bucket_edges=[],
        source="geometry",
        search={"rule": "target_sparsity", "value": TARGET_SPARSITY, "metric": METRIC,
                "candidates": int(table.candidates.shape[0]), "prompts": 0,
                "query_tiles": QUERY_TILES, "rows_per_tile": ROWS_PER_TILE},
        stats={"sparsity": round(float(sp.mean()), 6), "mean_loss": float(f"{float(loss.mean()):.6g}"),
               "layer_sparsity": [round(float(x), 6) for x in sp.mean(dim=1)]},
        author=AUTHOR, notes=notes, created=CREATED,
    )


def table_path(name):
    return os.path.join(TABLE_DIR, f"{name}.table.safetensors")


def preset_path(name):
    return os.path.join(PRESET_DIR, f"{name}.json")


def write(name, spec, table):
    text = preset_to_json(preset_from_table(name, spec, table))
    with open(preset_path(name), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    return text


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", choices=sorted(SPECS), help="build these presets only")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--reselect", action="store_true", help="rewrite presets from the committed loss tables")
    g.add_argument("--check", action="store_true", help="reselect and compare with the committed presets")
    args = ap.parse_args(argv)
    torch.set_num_threads(THREADS)
    names = args.only or sorted(SPECS)
    os.makedirs(PRESET_DIR, exist_ok=True)
    os.makedirs(TABLE_DIR, exist_ok=True)
    bad = 0
    for name in names:
        spec = SPECS[name]
        if args.reselect or args.check:
            table = LossTable.load(table_path(name))
            if args.check:
                prev = open(preset_path(name), encoding="utf-8").read()
                new = preset_to_json(preset_from_table(name, spec, table)) + "\n"
                same = new == prev
                bad += not same
                print(f"{name}: {'identical' if same else 'DIFFERS'}")
                continue
            write(name, spec, table)
            print(f"{name}: rewritten from {table_path(name)}")
            continue
        t0 = time.time()
        table = search_bank(spec)
        secs = time.time() - t0
        table.settings["seconds"] = round(secs)
        table.save(table_path(name))
        write(name, spec, table)
        p = preset_from_table(name, spec, table)
        sel = table.select(target_sparsity=TARGET_SPARSITY, metric=METRIC)
        print(f"{name}: {secs:.1f} s, bank {table.num_heads} heads, {table.candidates.shape[0]} candidates, "
              f"sparsity {p.stats['sparsity']:.4f}, mean mse {p.stats['mean_loss']:.4g}, "
              f"{os.path.getsize(preset_path(name))} bytes")
        for i, kind in enumerate(table.settings["bank_kinds"]):
            print(f"   bank {i:3d} {kind:8s} {sel.params[0, 0, i].tolist()} sparsity {float(sel.sparsity[0, 0, i]):.3f} "
                  f"mse {float(sel.loss[0, 0, i]):.3g}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
