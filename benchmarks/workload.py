"""Video-like Q/K/V for sparse-attention benchmarks (no model weights, no L×L work).

``video_qkv(grid=(T, H, W), heads, head_dim, ...)`` returns q, k, v of layout (B, L, H, D),
L = T·H·W tokens flattened row-major (t, then h, then w), and one kind label per head.

How a head is built (all per head, D = head_dim, s = 1/sqrt(D)):

- 3D RoPE as in Wan 2.1: the head dim is split into a temporal band of D − 4·(D//6) dims and
  a height and a width band of 2·(D//6) dims each (D = 128: 44 / 42 / 42), in that order.
  Inside a band of n dims, pair p (dims 2p, 2p+1) rotates by angle pos·θ^(−2p/n), θ = 10000,
  pos = the token's t, h or w index. Rotation is applied to q and k after they are built.
- Positional component: one constant pre-RoPE vector c shared by q and k of every token.
  After RoPE, s·q_i·k_j gets Σ_p s·|c_p|²·cos(ω_p·Δpos), a kernel of the relative position
  that peaks at Δ = 0. ``G_t, G_h, G_w`` (logits) are the peak heights per band, spread
  over the band's pairs with weights that favour high frequencies (sharp peaks) plus one
  boosted "dominant" pair whose period 2π/ω gives the periodic stripes PSA describes (§3.1).
  A band with gain 0 adds nothing that depends on that axis.
- Content component: a shared smooth latent field X over the grid (white noise blurred by
  separable Gaussians at several length scales, so neighbouring tokens are similar, like a
  real latent), projected per head: q and k get g·(X W) (k with a small extra projection),
  so tokens with similar content attend to each other. ``G_c`` is its logit gain.
- Token noise: independent white noise in q and k (logit noise of std ``noise``).
- Sinks (global heads): a few fixed key tokens get a large component in the lowest-frequency
  pair of the temporal band (no rotation across the grid, i.e. position-free), and every
  query has a constant component there: those keys gain ``sink_gain`` logits for all queries.
- Values: g_v·(X W_v) + small noise, i.e. smooth over the grid too.

Head kinds (nominal gains in logits; each head jitters them by a factor in [0.75, 1.33]):
- local:    G_t, G_h, G_w all > 0: attention concentrates in a 3D neighbourhood.
- temporal: G_t = 0, G_h, G_w large: the same (h, w) in every frame (SVG's temporal head).
- spatial:  G_t large, G_h, G_w ≈ 0: the same frame, shaped by content (SVG's spatial head).
- global:   weak positional terms, smooth content, a few sink keys (PSA's "uniform" head).

Determinism: head parameters (gains, frequency weights, projections, sink positions) come from
a CPU generator seeded by ``seed`` and are identical on every device; the large noise tensors
come from a generator on ``device`` seeded by ``seed``, so a given (seed, device) always gives
the same tensors (CPU and CUDA streams differ from each other).
Memory: the result tensors plus O(L·D) float32 per head; heads are built one at a time.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

KINDS = ("local", "temporal", "spatial", "global")
ROPE_THETA = 10000.0

# Nominal per-kind gains in logits: (G_t, G_h, G_w, G_content, sink_gain).
KIND_GAINS = {
    "local": (5.0, 7.0, 7.0, 3.0, 0.0),
    "temporal": (0.0, 8.0, 8.0, 3.0, 0.0),
    "spatial": (10.0, 0.5, 0.5, 5.0, 0.0),
    "global": (0.5, 0.5, 0.5, 2.5, 9.0),
}
# Range of the frequency-bump centre (pair index) per kind and band (t, h, w): lower = sharper.
# Spatial heads use the highest temporal frequencies so that other frames drop off at once.
KIND_CENTRES = {
    "local": ((0.5, 3.0), (1.0, 5.0), (1.0, 5.0)),
    "temporal": ((1.0, 5.0), (0.5, 3.0), (0.5, 3.0)),
    "spatial": ((0.0, 1.0), (1.0, 5.0), (1.0, 5.0)),
    "global": ((1.0, 5.0), (1.0, 5.0), (1.0, 5.0)),
}
# Default mix when kinds=None: cycled over heads in this order.
DEFAULT_MIX = ("local", "temporal", "local", "spatial", "global", "local", "spatial", "temporal")
NOISE_LOGIT_STD = 1.0
REFERENCE_TOKENS = 21 * 45 * 80  # Wan 2.1 720p, 81 frames: the grid the gains are set for
N_SINKS = 4
LATENT_CHANNELS = 48
# (sigma_t, sigma_h, sigma_w) of the latent field's smoothing, in tokens; one third of the
# channels each. Frames change slowly (large sigma_t), space has several scales.
FIELD_SCALES = ((3.0, 1.0, 1.0), (4.0, 2.5, 2.5), (6.0, 6.0, 6.0))


def rope_bands(head_dim: int) -> tuple[int, int, int]:
    """Dims of the (temporal, height, width) bands, Wan's split: D − 4(D//6), 2(D//6), 2(D//6)."""
    if head_dim % 2 or head_dim < 6:
        raise ValueError(f"head_dim must be even and >= 6, got {head_dim}")
    hw = 2 * (head_dim // 6)
    t = head_dim - 2 * hw
    if t % 2:
        raise ValueError(f"head_dim {head_dim} gives an odd temporal band {t}")
    return t, hw, hw


def rope_frequencies(head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(omega (D/2,), axis (D/2,) in {0: t, 1: h, 2: w}) for every rotation pair, float64."""
    omegas, axes = [], []
    for axis, n in enumerate(rope_bands(head_dim)):
        p = torch.arange(n // 2, dtype=torch.float64)
        omegas.append(ROPE_THETA ** (-2.0 * p / n))
        axes.append(torch.full((n // 2,), axis, dtype=torch.long))
    return torch.cat(omegas), torch.cat(axes)


def _check_rope(rope, head_dim: int):
    omega, axis = rope
    omega = torch.as_tensor(omega, dtype=torch.float64).flatten()
    axis = torch.as_tensor(axis, dtype=torch.long).flatten()
    if omega.numel() != head_dim // 2 or axis.numel() != head_dim // 2:
        raise ValueError(f"rope needs head_dim/2 = {head_dim // 2} pairs, got {omega.numel()} / {axis.numel()}")
    if bool(((axis < 0) | (axis > 2)).any()) or not all(bool((axis == a).any()) for a in range(3)):
        raise ValueError("rope axis entries must be 0, 1, 2 (t, h, w), each at least once")
    return omega, axis


def grid_positions(grid, device) -> torch.Tensor:
    """(L, 3) float32 (t, h, w) of every token, row-major order."""
    T, H, W = grid
    t, h, w = torch.meshgrid(
        torch.arange(T, device=device), torch.arange(H, device=device), torch.arange(W, device=device),
        indexing="ij",
    )
    return torch.stack([t, h, w], dim=-1).reshape(-1, 3).float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (2p, 2p+1) of x (L, D) by angles with cos/sin (L, D/2)."""
    a, b = x[:, 0::2], x[:, 1::2]
    out = torch.empty_like(x)
    out[:, 0::2] = a * cos - b * sin
    out[:, 1::2] = a * sin + b * cos
    return out


def _gaussian_kernel(sigma: float, device) -> torch.Tensor:
    radius = max(1, int(math.ceil(3.0 * sigma)))
    x = torch.arange(-radius, radius + 1, device=device, dtype=torch.float32)
    k = torch.exp(-0.5 * (x / sigma) ** 2)
    return k / k.sum()


def _blur_axis(x: torch.Tensor, sigma: float, dim: int) -> torch.Tensor:
    """Gaussian blur of x (C, T, H, W) along one grid dim, replicate-padded."""
    if sigma <= 0:
        return x
    k = _gaussian_kernel(sigma, x.device)
    r = (k.numel() - 1) // 2
    moved = x.movedim(dim, -1)
    shape = moved.shape
    flat = moved.reshape(-1, 1, shape[-1])
    flat = F.pad(flat, (r, r), mode="replicate")
    flat = F.conv1d(flat, k.view(1, 1, -1))
    return flat.reshape(shape).movedim(-1, dim)


def smooth_field(grid, channels: int, gen: torch.Generator, device) -> torch.Tensor:
    """(L, channels) float32 field, unit variance per channel, smooth over the grid."""
    T, H, W = grid
    parts = []
    per = [channels // len(FIELD_SCALES)] * len(FIELD_SCALES)
    per[0] += channels - sum(per)
    for n, sig in zip(per, FIELD_SCALES):
        if n == 0:
            continue
        x = torch.randn((n, T, H, W), generator=gen, device=device, dtype=torch.float32)
        for dim, s in zip((1, 2, 3), sig):
            x = _blur_axis(x, s, dim)
        x = x.reshape(n, -1)
        x = (x - x.mean(dim=1, keepdim=True)) / x.std(dim=1, keepdim=True).clamp_min(1e-6)
        parts.append(x)
    return torch.cat(parts, dim=0).t().contiguous()


def _resolve_kinds(kinds, heads: int) -> list[str]:
    if kinds is None:
        return [DEFAULT_MIX[h % len(DEFAULT_MIX)] for h in range(heads)]
    if isinstance(kinds, str):
        kinds = [kinds] * heads
    kinds = list(kinds)
    if len(kinds) != heads:
        raise ValueError(f"kinds must have one entry per head ({heads}), got {len(kinds)}")
    for k in kinds:
        if k not in KINDS:
            raise ValueError(f"kinds entries must be one of {KINDS}, got {k!r}")
    return kinds


def _band_weights(omega, axis, band: int, centre_range, gen: torch.Generator) -> torch.Tensor:
    """Weights (sum 1) over the pairs of one band: a Gaussian bump over the pair index with its
    centre drawn from ``centre_range`` (index 0 = ω 1, period 6 tokens; index 5 ≈ period 50
    tokens for a 42-dim band), plus one boosted dominant pair (index 0..5)."""
    idx = (axis == band).nonzero().flatten()
    # pair index 0 = the band's highest frequency (Wan's order already; other RoPEs are sorted)
    idx = idx[torch.sort(omega[idx], descending=True, stable=True).indices]
    n = idx.numel()
    centre = float(torch.empty(1).uniform_(*centre_range, generator=gen))
    width = float(torch.empty(1).uniform_(1.5, 3.0, generator=gen))
    w = torch.exp(-0.5 * ((torch.arange(n, dtype=torch.float64) - centre) / width) ** 2)
    dominant = int(torch.randint(0, min(6, n), (1,), generator=gen))
    w = w / w.sum()
    w[dominant] += float(torch.empty(1).uniform_(0.2, 0.6, generator=gen))
    w = w / w.sum()
    full = torch.zeros_like(omega)
    full[idx] = w
    return full


def head_params(kind: str, head_dim: int, gen: torch.Generator, rope=None) -> dict:
    """Random parameters of one head (CPU, float64/float32), independent of the grid.

    ``rope``: None (Wan's split, :func:`rope_frequencies`) or ``(omega, axis)``, each
    (head_dim/2,): angle per token step and axis (0 t, 1 h, 2 w) of every rotation pair."""
    omega, axis = rope_frequencies(head_dim) if rope is None else _check_rope(rope, head_dim)
    g_t, g_h, g_w, g_c, g_sink = KIND_GAINS[kind]
    jitter = torch.exp(torch.empty(5, dtype=torch.float64).uniform_(math.log(0.75), math.log(4 / 3), generator=gen))
    gains = [g * float(j) for g, j in zip((g_t, g_h, g_w, g_c, g_sink), jitter)]
    scale = 1.0 / math.sqrt(head_dim)
    # |c_p|^2 = G_band * w_p / s, so that s * sum_p |c_p|^2 = G_band at Δ = 0.
    amp2 = torch.zeros_like(omega)
    for band in range(3):
        if gains[band] > 0:
            centres = KIND_CENTRES[kind][band]
            amp2 += gains[band] * _band_weights(omega, axis, band, centres, gen) / scale
    phase = torch.empty_like(omega).uniform_(0, 2 * math.pi, generator=gen)
    c = torch.zeros(head_dim, dtype=torch.float64)
    c[0::2] = amp2.sqrt() * torch.cos(phase)
    c[1::2] = amp2.sqrt() * torch.sin(phase)
    # Content projection: latent channels -> D, columns unit-variance for a unit-variance field.
    w_qk = torch.randn(LATENT_CHANNELS, head_dim, generator=gen) / math.sqrt(LATENT_CHANNELS)
    w_k_extra = torch.randn(LATENT_CHANNELS, head_dim, generator=gen) / math.sqrt(LATENT_CHANNELS)
    w_v = torch.randn(LATENT_CHANNELS, head_dim, generator=gen) / math.sqrt(LATENT_CHANNELS)
    # s * (g u_i)·(g u_j) ≈ g² · sqrt(D) · corr(i, j) for unit-variance u: g² = G_c / sqrt(D).
    g_content = math.sqrt(gains[3] / math.sqrt(head_dim))
    # Sink pair: the last (lowest-frequency) pair of the temporal band, position-free.
    t_pairs = (axis == 0).nonzero().flatten()
    sink_pair = int(t_pairs[torch.argmin(omega[t_pairs])]) if rope is not None else rope_bands(head_dim)[0] // 2 - 1
    return {
        "kind": kind,
        "gains": {"t": gains[0], "h": gains[1], "w": gains[2], "content": gains[3], "sink": gains[4]},
        "c": c.float(),
        "w_qk": w_qk,
        "w_k_extra": w_k_extra,
        "w_v": w_v,
        "g_content": g_content,
        "sink_pair": sink_pair,
    }


@torch.no_grad()
def video_qkv(
    grid=(21, 45, 80),
    heads: int = 40,
    head_dim: int = 128,
    *,
    batch: int = 1,
    kinds=None,
    seed: int = 0,
    device="cpu",
    dtype=torch.bfloat16,
    logit_scale=None,
    rope=None,
):
    """Video-like q, k, v (B, L, H, D) in ``dtype`` on ``device`` and a list of H kind labels.

    grid: (T, H, W) token grid after patchify (Wan 2.1 720p 81 frames: (21, 45, 80)).
    kinds: None (default mix), one kind for all heads, or a list of H kinds from KINDS.
    logit_scale: factor on every logit (q and k both scaled by its square root). None: the
    default ``default_logit_scale(L)`` = log(L)/log(75600), so that a small grid is about as
    concentrated, relative to its length, as the full Wan 720p grid (gains are set for that).
    rope: None for Wan 2.1's 3D RoPE, or ``(omega, axis)`` per rotation pair (head_dim/2 each:
    angle per token step, axis 0/1/2 = t/h/w) for another model's RoPE (HunyuanVideo, LTX).
    """
    T, Hh, Ww = (int(x) for x in grid)
    if min(T, Hh, Ww) < 1:
        raise ValueError(f"grid must be three positive ints (T, H, W), got {grid}")
    device = torch.device(device)
    kinds = _resolve_kinds(kinds, heads)
    L = T * Hh * Ww
    cpu_gen = torch.Generator(device="cpu").manual_seed(int(seed))
    dev_gen = torch.Generator(device=device).manual_seed(int(seed) + 1)
    params = [head_params(kind, head_dim, cpu_gen, rope) for kind in kinds]
    sink_tokens = torch.randperm(L, generator=cpu_gen)[:N_SINKS].to(device)

    omega, axis = rope_frequencies(head_dim) if rope is None else _check_rope(rope, head_dim)
    pos = grid_positions((T, Hh, Ww), device)
    angles = pos[:, axis.to(device)] * omega.to(device=device, dtype=torch.float32)  # (L, D/2)
    cos, sin = torch.cos(angles), torch.sin(angles)
    if logit_scale is None:
        logit_scale = default_logit_scale(L)
    root = math.sqrt(float(logit_scale))
    noise_amp = math.sqrt(NOISE_LOGIT_STD)  # s·ξ_i·ξ_j has std noise_amp² for unit normals

    q = torch.empty((batch, L, heads, head_dim), device=device, dtype=dtype)
    k = torch.empty_like(q)
    v = torch.empty_like(q)
    for b in range(batch):
        field = smooth_field((T, Hh, Ww), LATENT_CHANNELS, dev_gen, device)  # (L, C)
        for h, p in enumerate(params):
            c = p["c"].to(device)
            content = field @ p["w_qk"].to(device)
            qh = c + p["g_content"] * content
            kh = c + p["g_content"] * (content + 0.3 * (field @ p["w_k_extra"].to(device)))
            qh += noise_amp * torch.randn((L, head_dim), generator=dev_gen, device=device)
            kh += noise_amp * torch.randn((L, head_dim), generator=dev_gen, device=device)
            if p["gains"]["sink"] > 0:
                # s * a * a_k = sink gain; queries carry a, sink keys carry a_k in the sink pair.
                a = math.sqrt(head_dim) ** 0.5
                a_k = p["gains"]["sink"] * math.sqrt(head_dim) / a
                qh[:, 2 * p["sink_pair"]] += a
                kh[sink_tokens, 2 * p["sink_pair"]] += a_k
            q[b, :, h] = (root * apply_rope(qh, cos, sin)).to(dtype)
            k[b, :, h] = (root * apply_rope(kh, cos, sin)).to(dtype)
            vh = field @ p["w_v"].to(device) + 0.3 * torch.randn((L, head_dim), generator=dev_gen, device=device)
            v[b, :, h] = vh.to(dtype)
    return q, k, v, kinds


def default_logit_scale(seq_len: int) -> float:
    """log(L) / log(REFERENCE_TOKENS), at least 0.25: gains are set for the 21×45×80 grid."""
    return max(0.25, math.log(max(seq_len, 2)) / math.log(REFERENCE_TOKENS))


def workload_info(kinds, seed: int, head_dim: int) -> list[dict]:
    """Per-head gains actually drawn for (kinds, seed) (for result files)."""
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    return [{"head": h, "kind": kd, "gains": head_params(kd, head_dim, gen)["gains"]} for h, kd in enumerate(kinds)]
