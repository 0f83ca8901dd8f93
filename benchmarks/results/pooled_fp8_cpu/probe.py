"""CPU study (session 16, NOTES #47): Sol-Attn's pooled term with FP8 (e4m3) operands, the rest
in float32 as ``kernels.sol_attention_reference`` computes it (this copies its loop; a record
beside its result, not a tool). Q is scaled per (head, query block), K̄ per head, V̄ per (head,
column), and P by 448 before rounding; the softmax sum stays in float32, as in the kernel.
On the video-like workload (``benchmarks/workload.py``, float32), against dense float32
attention, at β calibrated per density (``benchmarks/fidelity.py``):
    python benchmarks/results/pooled_fp8_cpu/probe.py GRID HEADS SEED OUT.json
"""
import json, sys, time
import torch
sys.path.insert(0, __file__.rsplit("/benchmarks/", 1)[0])
from benchmarks.workload import video_qkv
from benchmarks.fidelity import dense_attention, head_errors, aggregate, calibrated_beta
import kernels
from kernels.sol_reference import check_sol_call, pooled_means, _selection
from kernels.sol_routing import block_thresholds

F8 = torch.float8_e4m3fn
def q8(x, scale):  # quantise x / scale to e4m3 and back
    return (x / scale).clamp(-448, 448).to(F8).float() * scale

def amax(x, dims):
    return x.abs().amax(dim=dims, keepdim=True).clamp_min(1e-12) / 448

def sol_ref(q, k, v, beta, grid, fp8=()):
    """Sol-Attn as the float32 reference computes it, with the pooled term's operands named in
    ``fp8`` (of "q", "k", "v", "p") rounded to e4m3."""
    layout, forced, beta, scale = check_sol_call(q, k, v, beta=beta, estimator="exact", grid=grid, tile=None,
                                                 sinks=None, scale=None, for_kernel=False)
    B, L, H, D = q.shape
    q_mean, k_mean, v_mean = (pooled_means(x, layout) for x in (q, k, v))
    tau = block_thresholds(q_mean, k_mean, beta, "exact", scale)
    selection = _selection(q_mean, k_mean, tau, forced, False, scale)
    blocks = layout.token_blocks()
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
    k_pool, v_pool = k_mean.float(), v_mean.float()
    q_pool_side = qf
    if "k" in fp8:
        k_pool = q8(k_pool, amax(k_pool, (-1, -2)))
    if "v" in fp8:
        v_pool = q8(v_pool, amax(v_pool, (-2,)))
    if "q" in fp8:  # one scale per (head, query block)
        qs = torch.zeros(B, H, layout.n_blocks, device=q.device).scatter_reduce_(
            2, blocks.expand(B, H, L), qf.abs().amax(-1), "amax", include_self=False) / 448
        q_pool_side = q8(qf, qs[:, :, blocks, None].clamp_min(1e-12))
    log_lens = layout.lengths.float().log()
    out = torch.empty_like(qf)
    R = 1024
    for r0 in range(0, L, R):
        r1 = min(L, r0 + R)
        sel_rows = selection[:, :, blocks[r0:r1], :]
        token_sel = sel_rows[..., blocks]
        exact = (scale * qf[:, :, r0:r1] @ kf.transpose(-1, -2)).masked_fill(~token_sel, float("-inf"))
        pooled = scale * q_pool_side[:, :, r0:r1] @ k_pool.transpose(-1, -2) + log_lens
        pooled = pooled.masked_fill(sel_rows, float("-inf"))
        logits = torch.cat([exact, pooled], dim=-1)
        m = logits.amax(-1, keepdim=True)
        p = torch.exp(logits - m)
        l = p.sum(-1, keepdim=True)
        pp = p[..., L:]
        if "p" in fp8:
            pp = q8(pp, torch.tensor(1 / 448))
        out[:, :, r0:r1] = (p[..., :L] @ vf + pp @ v_pool) / l
    return out.transpose(1, 2), selection.float().mean().item()

if __name__ == "__main__":
    grid = tuple(int(x) for x in sys.argv[1].split("x"))
    heads, seed, out_path = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    q, k, v, kinds = video_qkv(grid, heads, 128, seed=seed, device="cpu", dtype=torch.float32)
    rows = []
    t_start = time.time()
    dense = dense_attention(q, k, v)
    print("grid", grid, "heads", heads, "tokens", q.shape[1])
    for rho in (0.05, 0.10, 0.15, 0.20, 0.25):
        beta = calibrated_beta(q, k, v, rho, {"grid": grid, "tile": None})
        res = {}
        for name, fp8 in (("f32", ()), ("fp8", ("q", "k", "v", "p"))):
            out, dens = sol_ref(q, k, v, beta, grid, fp8)
            res[name] = aggregate(head_errors(out, dense), kinds)["overall"]
        out0, _ = kernels.sol_attention_reference(q, k, v, beta=beta, grid=grid, correction=False, return_stats=True)
        res["nocorr"] = aggregate(head_errors(out0, dense), kinds)["overall"]
        print(f"ρ {rho:.2f} density {dens:.3f}: rel-L2 no-corr {res['nocorr']['rel_l2']:.5f}  f32 pooled {res['f32']['rel_l2']:.5f}  "
              f"fp8 pooled {res['fp8']['rel_l2']:.5f}  (gain kept {(res['nocorr']['rel_l2']-res['fp8']['rel_l2'])/(res['nocorr']['rel_l2']-res['f32']['rel_l2']):.3f}); "
              f"cos {res['f32']['mean_cos']:.5f} / {res['fp8']['mean_cos']:.5f}", flush=True)
        rows.append({"target_density": rho, "density": dens, "beta": beta, **{name: res[name] for name in res}})
    json.dump({"command": "python " + " ".join(sys.argv), "grid": grid, "heads": heads, "seed": seed, "tokens": q.shape[1],
               "rows": rows, "seconds": time.time() - t_start}, open(out_path, "w"), indent=1)
