"""The Hopper loop's Sol pair streams (``engine.pair_streams``): two neighbouring query
blocks per program, one key stream holding the union of their routed blocks, each entry
tagged with the items that compute it. The kernel runs through Triton's interpreter here;
the loop that reads the streams is checked on the GPU (tests/gpu)."""
import pytest
import torch

from kernels.block_mask import block_layout, row_major_layout
from kernels.engine.id_lists import id_list_bytes, id_lists
from kernels.engine.launch_order import ORDER_CHUNK, ORDER_ROWS, work_by_count
from kernels.engine.pair_streams import pair_partners, pair_stream_bytes, pair_streams, pair_work
from kernels.engine import head_groups
from kernels.sol_gpu_routing import route, routing_bytes_per_head
from kernels.sol_rules import beta_for_density, forced_key_blocks


def routed_mask(layout, batch, heads, density, seed):
    g = torch.Generator().manual_seed(seed)
    q_mean = torch.randn(batch, heads, layout.n_blocks, 16, generator=g)
    k_mean = torch.randn(batch, heads, layout.n_blocks, 16, generator=g)
    # Gaussian proxy scores: β of the density routes about ``density`` of the blocks.
    beta = torch.full((heads,), beta_for_density(density))
    forced = forced_key_blocks(layout, [])
    return route(q_mean, k_mean, beta, forced, layout, estimator="exact", scale=0.25)


def steps_reference(mask):
    """Per (batch, program): the expected entries and how many steps of whole blocks come
    first, from the dense map: the steps of whole blocks, then those of blocks with padding
    keys; in each part the blocks both items routed, two per step, then each item's own
    blocks two per step, the items alternating, -1 in the empty half of a group's odd last
    step."""
    selected = mask.to_dense()  # (B, Hg, N, N)
    lay = mask.layout
    n = lay.n_blocks
    padded = lay.lengths.cpu() < lay.block_tokens
    work = pair_work(mask.counts, lay).long().reshape(-1, 2)
    streams = []
    for b in range(selected.shape[0]):
        rows = []
        for first, second in work.tolist():
            a = selected[b, first // n, first % n]
            c = selected[b, second // n, second % n] if second >= 0 else torch.zeros_like(a)

            def steps(flags, users):
                blocks = [4 * int(x) + users for x in torch.nonzero(flags).squeeze(1)]
                blocks += [-1] * (len(blocks) % 2)
                return [blocks[i:i + 2] for i in range(0, len(blocks), 2)]

            def part(keep):
                own0, own1 = steps(a & ~c & keep, 1), steps(c & ~a & keep, 2)
                mixed = [s for pair in zip(own0, own1) for s in pair] + own0[len(own1):] + own1[len(own0):]
                return steps(a & c & keep, 3) + mixed

            whole = part(~padded)
            rows.append(([e for step in whole + part(padded) for e in step], len(whole)))
        streams.append(rows)
    return streams


@pytest.mark.parametrize("grid, tile, extra", [((5, 8, 16), (1, 8, 8), 0), ((4, 6, 10), (2, 4, 8), 70),
                                               ((3, 8, 8), (1, 8, 8), 64)])
def test_partners_cover_every_block_once_with_the_next_frame(grid, tile, extra):
    lay = block_layout(grid, tile, extra)
    partners = pair_partners(lay)
    listed = partners[partners >= 0]
    assert sorted(listed.tolist()) == list(range(lay.n_blocks))
    frame = lay.n_grid_blocks // lay.block_grid[0]
    for first, second in partners.tolist():
        if second < 0:
            continue
        if first < lay.n_grid_blocks:
            assert second - first == frame and (first // frame) % 2 == 0
        else:
            assert second - first == 1
    alone = int((partners[:, 1] < 0).sum())
    assert alone == (frame if lay.block_grid[0] % 2 else 0) + (lay.n_blocks - lay.n_grid_blocks) % 2


def test_row_major_blocks_pair_with_the_next_block():
    lay = row_major_layout(5 * 64 + 3)
    assert pair_partners(lay).tolist() == [[0, 1], [2, 3], [4, 5]]


def test_pair_work_runs_each_heads_pairs_heaviest_first():
    lay = block_layout((4, 8, 8), (1, 8, 8))  # 4 blocks, one per frame: pairs (0, 1), (2, 3)
    counts = torch.tensor([[[[1, 0], [0, 0], [2, 0], [3, 0]], [[4, 0], [4, 0], [1, 0], [0, 0]]]],
                          dtype=torch.int32)
    work = pair_work(counts, lay)
    assert work.dtype == torch.int32
    assert work.tolist() == [2, 3, 0, 1, 4, 5, 6, 7]  # head 0 costs (1, 5), head 1 (8, 1)


def test_heaviest_first_is_a_stable_sort_over_many_programs():
    """More programs than one ranking program holds or compares per step (``ORDER_ROWS``,
    ``ORDER_CHUNK``), batch 2 summed, many ties (kept in program order), odd blocks alone:
    against PyTorch's stable argsort."""
    lay = block_layout((9, 16, 320), (1, 8, 8), 130)  # 9 frames of 80 blocks, 3 extra blocks
    g = torch.Generator().manual_seed(3)
    counts = torch.randint(0, 4, (2, 3, lay.n_blocks, 2), generator=g, dtype=torch.int32)
    partners = pair_partners(lay)
    assert len(partners) > 2 * ORDER_CHUNK > ORDER_ROWS and (partners[:, 1] < 0).any()
    load = counts.sum(-1).sum(0)
    second = partners[:, 1]
    cost = load[:, partners[:, 0]] + torch.where(second >= 0, load[:, second.clamp_min(0)], 0)
    order = torch.argsort(cost, dim=-1, descending=True, stable=True)
    heads = torch.arange(3)[:, None, None] * lay.n_blocks
    want = torch.where(partners[order] >= 0, partners[order] + heads, -1).reshape(-1)
    assert pair_work(counts, lay).tolist() == want.tolist()
    singles = torch.argsort(load, dim=-1, descending=True, stable=True) + heads[..., 0]
    assert work_by_count(counts).tolist() == singles.reshape(-1).tolist()


@pytest.mark.parametrize("grid, tile, extra, batch, heads, density", [
    ((5, 8, 16), (1, 8, 8), 0, 1, 2, 0.2),
    ((4, 6, 10), (2, 4, 8), 70, 2, 3, 0.3),
    ((2, 8, 72), (1, 8, 8), 0, 1, 1, 0.5),   # 18 blocks: the bitmap has a partial second word
    ((5, 12, 24), (1, 8, 8), 0, 1, 2, 0.3),  # a grid cut in rows, as 720p's: whole blocks first
])
def test_streams_hold_the_union_in_steps_of_one_user_set(grid, tile, extra, batch, heads, density):
    lay = block_layout(grid, tile, extra)
    mask = routed_mask(lay, batch, heads, density, seed=sum(grid))
    streams = pair_streams(mask)
    assert streams.work.tolist() == pair_work(mask.counts, lay).tolist()
    want = steps_reference(mask)
    tags = 0
    for b in range(batch):
        for p, (entries, n_whole) in enumerate(want[b]):
            n_steps, whole_first = streams.counts[b, p].tolist()
            assert whole_first == n_whole and 2 * n_steps == len(entries)
            assert streams.entries[b, p, :len(entries)].tolist() == entries
            tags += sum(bin(e % 4).count("1") for e in entries if e >= 0)
    # Every routed (query block, key block) pair is in exactly one stream, tagged for its item.
    assert tags == int(mask.counts.sum())


def box_tokens(lay):
    """The token each key of a block's box holds, (n_blocks, 64), -1 for none: a grid block's
    TMA box is its tile in (frame, row, column) order, zero-filled past the grid; a text
    block's sequence box is its 64 sequence rows from its first token on."""
    T, H, W = lay.grid
    bt, bh, bw = lay.tile
    nT, nH, nW = lay.block_grid
    padded = torch.full((nT * bt, nH * bh, nW * bw), -1, dtype=torch.int64)
    padded[:T, :H, :W] = torch.arange(T * H * W).reshape(T, H, W)
    grid = padded.reshape(nT, bt, nH, bh, nW, bw).permute(0, 2, 4, 1, 3, 5).reshape(lay.n_grid_blocks, 64)
    text = T * H * W + torch.arange((lay.n_blocks - lay.n_grid_blocks) * 64).reshape(-1, 64)
    return torch.cat([grid, torch.where(text < T * H * W + lay.extra_tokens, text, -1)])


PADDED_LAYOUTS = [((2, 11, 8), (1, 8, 8), 70),    # 11 rows: the second block row has 3; text of 64 and 6
                  ((5, 11, 10), (2, 4, 8), 70),   # padding in frames, rows and columns: cut tiles interleave it
                  ((7, 11, 10), (4, 4, 4), 0)]


@pytest.mark.parametrize("grid, tile, extra", PADDED_LAYOUTS)
def test_key_bits_mark_the_keys_of_each_box_that_hold_tokens(grid, tile, extra):
    """Sol's pair steps mask a block's padding keys with these bits, so they must follow the
    box's order, not the block's slots (real tokens first)."""
    from kernels.engine.hopper_loop import key_bits

    lay = block_layout(grid, tile, extra)
    bits = key_bits(lay)
    assert bits.dtype == torch.int32 and bits.shape == (lay.n_blocks, 2)
    keys = ((bits.long() & 0xFFFFFFFF)[:, :, None] >> torch.arange(32)) & 1
    assert torch.equal(keys.reshape(lay.n_blocks, 64).bool(), box_tokens(lay) >= 0)


@pytest.mark.parametrize("grid, tile, extra", [((3, 11, 16), (1, 8, 8), 70), *PADDED_LAYOUTS[1:]])
def test_each_item_sees_every_token_of_its_routed_blocks_once(grid, tile, extra):
    """What a consumer computes, read as the Hopper loop reads it: the steps whose users hold
    its item, both halves (the second unless empty), the keys of each box that its block's key
    bits keep. That must be every token of the blocks its query block routed, once, and
    nothing else."""
    from kernels.engine.hopper_loop import key_bits

    lay = block_layout(grid, tile, extra)
    mask = routed_mask(lay, 1, 2, 0.3, seed=5)
    streams = pair_streams(mask)
    bits = key_bits(lay).long() & 0xFFFFFFFF
    kept = ((bits[:, :, None] >> torch.arange(32)) & 1).reshape(lay.n_blocks, 64).bool()
    tokens = box_tokens(lay)
    row_map = lay.row_map.reshape(lay.n_blocks, 64)
    selected = mask.to_dense()[0]
    n = lay.n_blocks
    work = streams.work.tolist()
    for p in range(streams.n_pairs):
        entries = streams.entries[0, p, :2 * int(streams.counts[0, p, 0])].tolist()
        for c in (0, 1):
            item = work[2 * p + c]
            seen = []
            for t in range(0, len(entries), 2):
                first, second = entries[t:t + 2]
                if not (first % 4 >> c) & 1:
                    continue
                for e in (first, second):
                    if e >= 0:
                        seen += tokens[e // 4][kept[e // 4]].tolist()
            routed = row_map[selected[item // n, item % n]] if item >= 0 else row_map[:0]
            assert sorted(seen) == sorted(routed[routed >= 0].tolist())


@pytest.mark.parametrize("grid, tile, extra", [((4, 6, 10), (2, 4, 8), 70), ((2, 8, 72), (1, 8, 8), 0)])
def test_the_portable_lowering_lists_the_routed_blocks_in_order(grid, tile, extra):
    """``id_lists`` of a routed mask (the portable loop's work form, made from the bitmap on the
    device): each query block lists exactly its routed blocks, ascending, and the tiles run
    in ``work_by_count``'s order."""
    lay = block_layout(grid, tile, extra)
    mask = routed_mask(lay, 2, 3, 0.3, seed=7)
    lists = id_lists(mask, 64)
    dense = mask.to_dense()
    total = mask.counts.sum(-1)
    assert lists.tiles_per_block == 1 and lists.ids.shape == (2, 3, lay.n_blocks, lay.n_blocks)
    for b in range(2):
        for h in range(3):
            for i in range(lay.n_blocks):
                want = torch.nonzero(dense[b, h, i]).squeeze(1).tolist()
                assert lists.ids[b, h, i, :total[b, h, i]].tolist() == want
    assert torch.equal(lists.work, work_by_count(mask.counts))


def test_pair_streams_let_more_heads_share_a_launch():
    """At Wan 720p (1,260 blocks, 40 heads) the id lists are most of a head's scratch: with the
    pair streams (the Hopper loop) the heads run in 4 even launches instead of 6."""
    lay = block_layout((21, 45, 80), (1, 8, 8))
    pooling, routing = routing_bytes_per_head(lay, 128, 2)
    listed = max(pooling, routing + id_list_bytes(lay.n_blocks))
    streamed = max(pooling, routing + pair_stream_bytes(lay.n_blocks))
    output = 75600 * 40 * 128 * 2
    assert [h1 - h0 for h0, h1, _ in head_groups(40, streamed, output)] == [10] * 4
    assert len(head_groups(40, listed, output)) == 6


def rows_as_the_loop_reads_them(t, batch_stride, width, batch, programs):
    """What the Hopper loop loads for each (batch entry, program) from the tensor ``t`` it is
    given: ``width`` elements at row b · batch_stride + p of the pointer ``t.data_ptr()``."""
    flat = torch.as_strided(t, (t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)
    base = t.storage_offset()
    return torch.stack([torch.stack([flat[base + (b * batch_stride + p) * width:][:width] for p in range(programs)])
                        for b in range(batch)])


def test_per_head_streams_are_views_the_loop_reads_head_by_head():
    """One launch per head (``PairStreams.per_head``, where a head's K/V exceed L2): head i's
    launch reads, through the same pointer arithmetic, exactly the programs of head i."""
    lay = block_layout((4, 6, 10), (2, 4, 8), 70)
    mask = routed_mask(lay, 2, 3, 0.3, seed=11)
    streams = pair_streams(mask)
    parts = streams.per_head(3)
    per = streams.n_pairs // 3
    n = lay.n_blocks
    width = streams.entries.shape[-1]
    for i, part in enumerate(parts):
        assert part.batch_stride == streams.n_pairs and part.n_pairs == per
        items = part.work[part.work >= 0]
        assert items.numel() > 0 and bool(((items // n) == i).all())
        assert part.work.data_ptr() == streams.work[2 * per * i:].data_ptr()  # a view, no copy
        got_counts = rows_as_the_loop_reads_them(part.counts, part.batch_stride, 2, 2, per)
        assert torch.equal(got_counts, streams.counts[:, per * i:per * (i + 1)])
        got = rows_as_the_loop_reads_them(part.entries, part.batch_stride, width, 2, per)
        assert torch.equal(got, streams.entries[:, per * i:per * (i + 1)])
    assert torch.equal(torch.cat([p.work for p in parts]), streams.work)
    with pytest.raises(ValueError, match="do not split into 2 heads"):
        streams.per_head(2)


@pytest.mark.parametrize("l2, tokens, per_head", [
    (50 * 2**20, 75600, False),   # H200, Wan 720p: 38.7 MB a head fits
    (50 * 2**20, 131072, True),   # H200, 131K: 67.1 MB a head does not
    (50 * 2**20, 119056, True),   # H200, HunyuanVideo 720p with its text: 61.0 MB
    (126 * 2**20, 131072, False),  # a larger L2 holds it
    (0, 131072, False),            # L2 unknown: one launch per group, as before
])
def test_launch_per_head_where_one_heads_kv_exceed_l2(monkeypatch, l2, tokens, per_head):
    from kernels.engine import hopper_loop

    monkeypatch.setattr(hopper_loop, "l2_bytes", lambda device: l2)
    assert hopper_loop.launch_per_head("cuda:0", tokens * 128 * 2 * 2) is per_head
