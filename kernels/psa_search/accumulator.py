"""The search's evaluation: every candidate mask's loss per (layer, step bucket, head)."""
from __future__ import annotations

import bisect
import math

import torch

from .._checks import check_int, check_number, check_qkv, resolve_scale
from ..layout import check_grid, check_tile, tile_layout
from ..preset_file import check_bucket_edges
from ..psa_mask import PSAMask, check_params, psa_block_mask
from ..psa_reference import check_extra_tokens
from .candidates import candidate_space
from .loss_table import LossTable, MAX_HEADS, MAX_LAYERS, MAX_SAMPLED, empty_table_arrays


class PSASearchAccumulator:
    """Feeds attention calls one at a time; ``table()`` gives the :class:`LossTable`.

    >>> acc = PSASearchAccumulator(grid, tile, num_heads)          # doctest: +SKIP
    >>> acc.add(q, k, v, layer=i, step=progress)  # every self-attention call to evaluate
    >>> acc.table().select(alpha=0.01)

    ``step`` is compared with ``bucket_edges`` (ascending; bucket = number of edges <= step),
    in whatever unit the caller uses consistently (presets use denoising progress in [0, 1]).
    """

    def __init__(
        self,
        grid,
        tile,
        num_heads: int,
        *,
        candidates=None,
        extra_tokens: int = 0,
        bucket_edges=(),
        query_tiles: int | None = 32,
        rows_per_tile: int | None = 32,
        seed: int = 0,
        scale=None,
        owned=None,
        device=None,
    ):
        # the bounds of a loss table's header, so that table() always saves and loads
        self.grid, self.tile = check_grid(grid), check_tile(tile)
        self.num_heads = check_int(num_heads, "num_heads", 1, MAX_HEADS)
        self.extra_tokens = check_int(extra_tokens, "extra_tokens", 0)
        self.bucket_edges = check_bucket_edges(bucket_edges, "bucket_edges")
        cands = candidate_space(self.grid, self.tile) if candidates is None else check_params(candidates)
        self.candidates = cands
        self.query_tiles = None if query_tiles is None else check_int(query_tiles, "query_tiles", 1, MAX_SAMPLED)
        self.rows_per_tile = None if rows_per_tile is None else check_int(rows_per_tile, "rows_per_tile", 1,
                                                                          MAX_SAMPLED)
        self.seed = check_int(seed, "seed", 0)
        self.scale = None if scale is None else resolve_scale(scale, 1)
        self.owned = owned
        self.device = None if device is None else torch.device(device)
        self.layout = tile_layout(self.grid, self.tile)
        masks = psa_block_mask(self.grid, cands, self.tile)
        self._masks = masks  # bool (C, nB, nB), CPU
        pm = PSAMask(self.grid, cands, self.tile)
        pm._mask = masks
        self.density = pm.density()
        self.token_density = pm.density(tokens=True)
        self._entries = {}  # (layer, bucket) -> dict of sums
        self._dev_masks = {}

    def bucket_of(self, step) -> int:
        return bisect.bisect_right(self.bucket_edges, check_number(step, "step"))

    def _entry(self, layer, bucket):
        key = (check_int(layer, "layer", 0, MAX_LAYERS - 1), bucket)  # the table loader's bound
        if key not in self._entries:
            C = self.candidates.shape[0]
            self._entries[key] = {
                "sq_err": torch.zeros(self.num_heads, C, dtype=torch.float64),
                "ref_sq": torch.zeros(self.num_heads, dtype=torch.float64),
                "count": torch.zeros(self.num_heads, dtype=torch.float64),
                "calls": 0,
            }
        return self._entries[key]

    def register(self, layer, step=0.0) -> None:
        """Make (layer, bucket) a row of the table even if no call adds to it here."""
        self._entry(layer, self.bucket_of(step))

    def skip(self, layer, step=0.0) -> None:
        """Count a call without evaluating it (a rank that owns none of its heads), so the
        row draws of later calls stay the same in every process."""
        self._entry(layer, self.bucket_of(step))["calls"] += 1

    def _masks_on(self, device):
        """float32 (nB, C, nB) on ``device``: per query block, every candidate's key-block row
        (made once per device)."""
        key = str(device)
        if key not in self._dev_masks:
            self._dev_masks[key] = self._masks.to(device=device, dtype=torch.float32).permute(1, 0, 2).contiguous()
        return self._dev_masks[key]

    def _sample_rows(self, layer, bucket, call):
        """Grid-order query rows and their query blocks, by (seed, layer, bucket, call)."""
        lay = self.layout
        mix = ((self.seed * 1_000_003 + int(layer)) * 10_007 + int(bucket)) * 101 + int(call)
        g = torch.Generator().manual_seed(mix & 0x7FFF_FFFF_FFFF)
        nb = lay.n_blocks
        n_tiles = nb if self.query_tiles is None else min(nb, int(self.query_tiles))
        tiles = torch.sort(torch.randperm(nb, generator=g)[:n_tiles]).values
        rows, qblk = [], []
        for b in tiles.tolist():
            n = int(lay.block_lengths[b])
            take = n if self.rows_per_tile is None else min(n, int(self.rows_per_tile))
            pick = torch.sort(torch.randperm(n, generator=g)[:take]).values
            rows.append(lay.perm[b * lay.block_tokens + pick])
            qblk.append(torch.full((take,), b, dtype=torch.int64))
        return torch.cat(rows), torch.cat(qblk)

    @torch.no_grad()
    def add(self, q, k, v, *, layer: int, step=0.0) -> None:
        """Evaluate every candidate on one attention call (q, k, v: (B, L, H, D))."""
        B, L, H, D = check_qkv(q, k, v, for_kernel=False)
        if H != self.num_heads:
            raise ValueError(f"q has {H} heads, the accumulator was made for {self.num_heads}")
        check_extra_tokens(self.extra_tokens, L, self.grid)
        scale = resolve_scale(self.scale, D)
        bucket = self.bucket_of(step)
        entry = self._entry(layer, bucket)
        call = entry["calls"]
        heads = [h for h in range(H) if self.owned is None or self.owned(int(layer), h)]
        if not heads:
            entry["calls"] += 1
            return
        dev = self.device or q.device
        rows, qblk = self._sample_rows(layer, bucket, call)
        lay = self.layout
        n, E = lay.n_tokens, self.extra_tokens
        masks = self._masks_on(dev)
        valid = torch.arange(lay.block_tokens)[None, :] < lay.block_lengths.long()[:, None]
        pad_bias = None
        if not bool(valid.all()):  # -inf on the padding slots of the key blocks
            pad_bias = torch.zeros(valid.shape).masked_fill_(~valid, float("-inf")).to(dev)
        perm = lay.perm.to(dev).clamp_min(0)
        rows_q, qblk_d = rows.to(q.device), qblk.to(dev)
        # results stay on the device until the call is done: no host sync per head
        sq = torch.zeros(B, len(heads), self.candidates.shape[0], dtype=torch.float64, device=dev)
        ref = torch.zeros(B, len(heads), dtype=torch.float64, device=dev)
        for b in range(B):
            for i, h in enumerate(heads):
                qr = q[b, rows_q, h].to(dev, torch.float32)
                kh, vh = k[b, :, h].to(dev), v[b, :, h].to(dev)
                kb = kh[perm].to(torch.float32).reshape(lay.n_blocks, lay.block_tokens, D)
                vb = vh[perm].to(torch.float32).reshape(lay.n_blocks, lay.block_tokens, D)
                ke, ve = kh[n:n + E].to(torch.float32), vh[n:n + E].to(torch.float32)
                sq[b, i], ref[b, i] = _head_losses(qr, qblk_d, kb, vb, pad_bias, ke, ve, masks, scale)
        sq, ref = sq.cpu(), ref.cpu()
        if not bool(torch.isfinite(ref).all()):  # a table holding it could not be read back
            raise ValueError(f"layer {layer}: the dense attention output of this call is not finite (NaN or inf "
                             "in q, k or v, or scores beyond float32); the call is not evaluated")
        entry["calls"] += 1
        idx = torch.tensor(heads, dtype=torch.int64)
        for b in range(B):
            entry["sq_err"][idx] += sq[b]
            entry["ref_sq"][idx] += ref[b]
            entry["count"][idx] += float(rows.numel() * D)

    def table(self) -> LossTable:
        layers = sorted({l for l, _ in self._entries})
        nb = len(self.bucket_edges) + 1
        arr = empty_table_arrays(len(layers), nb, self.num_heads, self.candidates.shape[0])
        for (layer, bucket), e in self._entries.items():
            i = layers.index(layer)
            arr["sq_err"][i, bucket] = e["sq_err"]
            arr["ref_sq"][i, bucket] = e["ref_sq"]
            arr["count"][i, bucket] = e["count"]
            arr["calls"][i, bucket] = e["calls"]
        settings = {
            "query_tiles": self.query_tiles, "rows_per_tile": self.rows_per_tile, "seed": self.seed,
            "extra_tokens": self.extra_tokens, "scale": self.scale,
        }
        return LossTable(self.grid, self.tile, self.candidates.clone(), self.density.clone(),
                         self.token_density.clone(), layers, list(self.bucket_edges), self.num_heads,
                         settings=settings, **arr)


def _head_losses(qr, qblk, kb, vb, pad_bias, ke, ve, masks, scale, max_elems=1 << 24):
    """Squared errors of all candidates for the sampled rows of one head.

    qr (R, D) rows, qblk (R,) their query blocks; kb, vb (nB, bt, D) key/value blocks,
    pad_bias (nB, bt) -inf on padding slots, 0 elsewhere (None: no padding); ke, ve (E, D)
    extra tokens; masks (nB, C, nB) float, the candidates' key-block rows per query block.
    Rows are taken in chunks of at most ``max_elems`` floats per intermediate, whatever their
    query blocks: no host synchronisation. Returns (sq_err (C,), ref_sq ()) float64 on the
    device of ``qr``.
    """
    R, D = qr.shape
    nB, bt, _ = kb.shape
    C = masks.shape[1]
    sq_err = torch.zeros(C, dtype=torch.float64, device=qr.device)
    ref_sq = torch.zeros((), dtype=torch.float64, device=qr.device)
    kb_flat_t = kb.reshape(nB * bt, D).T
    per_row = max(nB * bt + ke.shape[0], C * nB, C * D, nB * D)
    step = max(1, max_elems // per_row)
    for r0 in range(0, R, step):
        x = qr[r0:r0 + step]
        s = (x @ kb_flat_t).mul_(scale).reshape(-1, nB, bt)
        if pad_bias is not None:
            s.add_(pad_bias)                                 # -inf on padding slots
        m = s.amax(-1)                                       # (r, nB), finite: no empty block
        p = s.sub_(m[..., None]).exp_()                      # in place: s becomes p
        l = p.sum(-1)                                        # (r, nB)
        pv = torch.bmm(p.transpose(0, 1), vb).transpose(0, 1)  # (r, nB, D)
        if ke.shape[0]:
            se = (x @ ke.T) * scale
            me = se.amax(-1)
            pe = torch.exp(se - me[:, None])
            m_all = torch.maximum(m.amax(-1), me)
            we = torch.exp(me - m_all)
            num_e = we[:, None] * (pe @ ve)                 # (r, D)
            den_e = we * pe.sum(-1)                          # (r,)
        else:
            m_all = m.amax(-1)
            num_e = torch.zeros_like(x)
            den_e = torch.zeros(x.shape[0], device=x.device)
        w = torch.exp(m - m_all[:, None])                    # (r, nB)
        wl = w * l
        wpv = w[..., None] * pv                              # (r, nB, D)
        o_dense = (wpv.sum(1) + num_e) / (wl.sum(1) + den_e)[:, None]
        A = masks[qblk[r0:r0 + step]]                        # (r, C, nB): each row's candidate rows
        num = torch.bmm(A, wpv) + num_e[:, None]             # (r, C, D)
        den = torch.bmm(A, wl[..., None])[..., 0] + den_e[:, None]  # (r, C)
        o = num / den[..., None]
        err = ((o - o_dense[:, None]) ** 2).sum(dim=(0, 2)).double()
        err = torch.where(torch.isfinite(err), err, torch.full_like(err, math.inf))
        sq_err += err
        ref_sq += (o_dense.double() ** 2).sum()
    return sq_err, ref_sq
