"""The host side of the engine's launches: arguments grouped as the kernels name them."""


def strides(**tensors) -> dict:
    """The batch, token and head strides of (B, L, H, D) tensors as the kernels name them:
    ``strides(q=q)`` gives ``stride_qb``, ``stride_qn``, ``stride_qh``."""
    return {f"stride_{name}{axis}": t.stride(i) for name, t in tensors.items() for i, axis in enumerate("bnh")}


def grid_geometry(lay) -> dict:
    """The layout's token grid, tile and block grid as the kernels name them. The block grid goes in
    as constants: a box's corner is blk // (nH·nW), ... every step, and integer division by a
    run-time value costs tens of instructions there."""
    _, nH, nW = lay.block_grid
    return dict(tokens_t=lay.grid[0], tokens_h=lay.grid[1], tokens_w=lay.grid[2],
                TILE_T=lay.tile[0], TILE_H=lay.tile[1], TILE_W=lay.tile[2], GRID_HW=nH * nW, GRID_W=nW)
