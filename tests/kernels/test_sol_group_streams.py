"""Sol's group streams (``engine.group_streams``): two or three query blocks at one place in
consecutive frames of blocks per program, one key stream of one block a step holding the union
of their routed blocks, each entry tagged with the items that compute it. The kernel runs
through Triton's interpreter here; the loop that reads the streams is checked on the GPU."""
import pytest
import torch

from kernels.block_mask import block_layout
from kernels.engine.group_streams import group_partners, group_streams
from kernels.engine.launch_order import heaviest_first

from test_sol_pair_streams import routed_mask


@pytest.mark.parametrize("items", [2, 3])
@pytest.mark.parametrize("grid, tile, extra", [((5, 8, 16), (1, 8, 8), 70), ((4, 6, 10), (2, 4, 8), 0),
                                                ((7, 11, 10), (1, 8, 8), 200)])
def test_partners_hold_every_block_once_at_one_place_in_consecutive_frames(items, grid, tile, extra):
    lay = block_layout(grid, tile, extra)
    partners = group_partners(lay, items).cpu()
    assert partners.shape[1] == items
    flat = partners[partners >= 0]
    assert sorted(flat.tolist()) == list(range(lay.n_blocks))
    per_frame = lay.n_grid_blocks // lay.block_grid[0]
    for row in partners.tolist():
        blocks = [b for b in row if b >= 0]
        assert row[:len(blocks)] == blocks  # the -1s come last
        if blocks[0] < lay.n_grid_blocks:
            assert all(b < lay.n_grid_blocks for b in blocks)
            assert [b % per_frame for b in blocks] == [blocks[0] % per_frame] * len(blocks)
            assert [b // per_frame for b in blocks] == list(range(blocks[0] // per_frame,
                                                                  blocks[0] // per_frame + len(blocks)))


def test_heaviest_first_orders_groups_of_three_by_their_summed_counts():
    counts = torch.tensor([[[[3, 0], [1, 0], [5, 1], [0, 0], [2, 2], [1, 0]]]], dtype=torch.int32)
    partners = torch.tensor([[0, 1, 2], [3, 4, 5]])
    # loads: group 0 = 3 + 1 + 6 = 10, group 1 = 0 + 4 + 1 = 5
    assert heaviest_first(counts, partners).tolist() == [0, 1, 2, 3, 4, 5]
    counts[0, 0, 3, 0] = 9
    assert heaviest_first(counts, partners).tolist() == [3, 4, 5, 0, 1, 2]
    two_heads = torch.cat([counts, counts.flip(2)], 1)
    assert heaviest_first(two_heads, torch.tensor([[0, 1, -1]])).tolist() == [0, 1, -1, 6, 7, -1]


@pytest.mark.parametrize("items", [2, 3])
@pytest.mark.parametrize("grid, tile, extra, batch, heads", [
    ((5, 8, 16), (1, 8, 8), 0, 1, 2),
    ((4, 6, 10), (2, 4, 8), 70, 2, 3),     # padded tiles and text blocks
    ((2, 8, 72), (1, 8, 8), 0, 1, 1),      # a partial bitmap word
    ((5, 12, 24), (1, 8, 8), 0, 1, 2),     # a grid cut in rows: whole blocks first
])
def test_streams_list_each_routed_block_once_whole_blocks_first(items, grid, tile, extra, batch, heads):
    lay = block_layout(grid, tile, extra)
    mask = routed_mask(lay, batch, heads, 0.3, seed=sum(grid) + items)
    streams = group_streams(mask, items)
    n = lay.n_blocks
    selected = mask.to_dense()
    padded = (lay.lengths.cpu() < lay.block_tokens).tolist()
    work = streams.work.view(-1, items).tolist()
    assert streams.work.tolist() == heaviest_first(mask.counts, group_partners(lay, items)).tolist()
    tagged = 0
    for b in range(batch):
        for p, group in enumerate(work):
            n_steps, n_whole = streams.counts[b, p].tolist()
            entries = streams.entries[b, p, :n_steps].tolist()
            blocks = [e >> 3 for e in entries]
            assert len(set(blocks)) == len(blocks)
            assert [padded[x] for x in blocks] == [False] * n_whole + [True] * (n_steps - n_whole)
            assert blocks[:n_whole] == sorted(blocks[:n_whole]) and blocks[n_whole:] == sorted(blocks[n_whole:])
            for c, item in enumerate(group):
                mine = sorted(e >> 3 for e in entries if (e >> c) & 1)
                want = torch.nonzero(selected[b, item // n, item % n]).squeeze(1).tolist() if item >= 0 else []
                assert mine == want
                tagged += len(mine)
            assert all(e & 7 for e in entries) and all(e & 7 < (1 << items) for e in entries)
    assert tagged == int(mask.counts.sum())


def test_group_streams_refuse_other_widths():
    lay = block_layout((2, 8, 8), (1, 8, 8))
    with pytest.raises(ValueError, match="items must be 2 or 3"):
        group_streams(routed_mask(lay, 1, 1, 0.5, seed=1), 4)
