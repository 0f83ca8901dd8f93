"""A checkpoint's own per-module attention on the calls the patch keeps dense, inside a real
ComfyUI (CPU; the version of the matrix that runs).

ComfyUI after 0.33 gives a module that makes an attention call a ``comfy_attention``
(``ComfyAttention``: an ``nn.Module`` whose ``function`` is the attention the checkpoint asked
for, or None) and passes it as ``preferred_attention``, which ``wrap_attn`` drops when an
override is set. Neither ComfyUI of the matrix has it, so these are contract tests: the tiny
Wan's self- and cross-attention modules get a stand-in of that attribute, whose function
records its calls and runs ComfyUI's basic attention.
"""
from __future__ import annotations

import contextlib
import logging

import pytest
import torch

import comfyui_harness as H
from pack_nodes import patch, summary

LOGGER = "sparse_video_attention"
STEPS, LAYERS = 3, 3


class ComfyAttentionStandIn(torch.nn.Module):
    """What a checkpoint's attention config leaves on a module: ``function`` (None when the
    checkpoint names none, or its kernel is not built here) and ``config``."""

    def __init__(self, function):
        super().__init__()
        self.config = None if function is None else {"attention": "comfy_kitchen_int8"}
        self.function = function


@pytest.fixture(scope="module")
def wan(comfy):
    return H.build_wan21(0, num_layers=LAYERS)


@contextlib.contextmanager
def checkpoint_attention(wan, function):
    """Every self- and cross-attention module of the tiny Wan names ``function`` as its own."""
    blocks = wan.patcher.model.diffusion_model.blocks
    modules = [m for b in blocks for m in (b.self_attn, b.cross_attn)]
    for m in modules:
        m.comfy_attention = ComfyAttentionStandIn(function)
    try:
        yield modules
    finally:
        for m in modules:
            del m.comfy_attention


class Recorder:
    """A module's own attention: ComfyUI's basic attention, each call's output remembered."""

    def __init__(self):
        self.outputs = []

    def __call__(self, *args, **kwargs):
        import comfy.ldm.modules.attention as attention
        out = attention.attention_basic(*args, **kwargs)
        self.outputs.append(out)
        return out


def no_hooks_left(dm) -> bool:
    return all(not m._forward_pre_hooks and not m._forward_hooks for m in dm.modules())


def test_dense_calls_run_the_modules_own_attention(pack, wan, caplog):
    own = Recorder()
    projected = []   # what each self-attention's output projection was given
    dm = wan.patcher.model.diffusion_model
    with checkpoint_attention(wan, own):
        m = patch(pack, wan.patcher, beta=1.0, warmup=0.34, dense_blocks="2")
        handles = [b.self_attn.o.register_forward_pre_hook(lambda mod, args: projected.append(args[0]))
                   for b in dm.blocks]
        try:
            with caplog.at_level(logging.INFO, logger=LOGGER):
                H.sample(wan, steps=STEPS, model=m)
                H.sample(wan, steps=STEPS, model=m)
        finally:
            for h in handles:
                h.remove()
    s = summary(pack, m)
    warm_self, dense_block_self = LAYERS, STEPS - 1       # step 0 whole; block 2 afterwards
    expected = LAYERS * STEPS + warm_self + dense_block_self  # + every cross-attention call
    assert s["sparse_calls"] == (LAYERS - 1) * (STEPS - 1)
    assert s["checkpoint_attention"] == {"modules": 2 * LAYERS, "functions": ["Recorder"],
                                         "dense_calls": expected}
    assert len(own.outputs) == 2 * expected                 # two runs
    # each dense self-attention call's output is the module's own attention's, as returned
    own_ids = {id(t) for t in own.outputs}
    assert sum(id(x) in own_ids for x in projected) == 2 * (warm_self + dense_block_self)
    assert len(projected) == 2 * LAYERS * STEPS
    assert no_hooks_left(dm)
    said = [r for r in caplog.records if r.name == LOGGER and "its own attention" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO, [r.getMessage() for r in said]


def test_every_call_of_the_dense_method_and_none_of_a_module_without_a_function(pack, wan):
    own = Recorder()
    with checkpoint_attention(wan, own):
        m = patch(pack, wan.patcher, method="dense")
        H.sample(wan, steps=STEPS, model=m)
    assert len(own.outputs) == 2 * LAYERS * STEPS
    assert summary(pack, m)["checkpoint_attention"]["dense_calls"] == 2 * LAYERS * STEPS
    with checkpoint_attention(wan, None):   # a checkpoint without a config, or no kernel here
        m = patch(pack, wan.patcher, method="dense")
        out = H.sample(wan, steps=STEPS, model=m)
    assert summary(pack, m)["checkpoint_attention"] is None
    torch.testing.assert_close(out, H.sample(wan, steps=STEPS))
    assert no_hooks_left(wan.patcher.model.diffusion_model)


def test_an_override_below_the_patch_keeps_the_dense_calls(pack, wan):
    """An earlier override (another attention node) gets the dense calls, as ComfyUI hands them
    to an override whatever the module prefers."""
    own, below = Recorder(), []

    def earlier_override(func, *args, **kwargs):
        below.append(1)
        return func(*args, **kwargs)

    with checkpoint_attention(wan, own):
        m = patch(pack, H.with_attention_override(wan.patcher, earlier_override), method="dense")
        H.sample(wan, steps=STEPS, model=m)
    assert len(below) == 2 * LAYERS * STEPS and not own.outputs
    assert summary(pack, m)["checkpoint_attention"]["dense_calls"] == 0
