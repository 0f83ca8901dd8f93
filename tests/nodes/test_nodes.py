"""The nodes inside a real ComfyUI (CPU): dispatch rules, adapters, schedules, compile.

ComfyUI is started in-process with only this pack loaded (tests/comfyui_harness.py); models
are tiny instances of ComfyUI's own classes loaded through its loader, sampled with its real
sampler. Sparse attention runs on the float reference backend (CPU).
"""
from __future__ import annotations

import importlib
import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

import comfyui_harness as H
from pack_nodes import check_hunyuan_join_order, live_dispatcher, patch, summary

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wan(comfy):
    return H.build_wan21(0, num_layers=3)


@pytest.fixture(scope="module")
def wan_base(wan):
    return H.sample(wan, steps=5)


# --------------------------------------------------------------------------------- nodes

NODE_IDS = {"SparseAttentionPatch", "LoadStripeMaskPreset", "PSAMaskSearch", "PSAMaskSelect",
            "SparseAttentionInspector"}


def test_nodes_registered_with_tooltips(comfy, pack):
    assert set(comfy.pack_node_names()) == NODE_IDS
    classes = [comfy.nodes.NODE_CLASS_MAPPINGS[n] for n in NODE_IDS]
    for cls in classes:
        schema = cls.define_schema()
        for item in list(schema.inputs) + list(schema.outputs):
            assert item.tooltip, f"{schema.node_id}.{item.id} has no tooltip"
    ids = [i.id for i in pack.node_patch.SparseAttentionPatch.define_schema().inputs]
    assert ids == ["model", "method", "beta", "target_sparsity", "estimator", "warmup",
                   "final_dense", "dense_blocks", "min_tokens", "sol_tile", "backend", "preset",
                   "preset_grid", "beside_core_node", "precision"]   # new widgets last: saved workflows keep their order


@pytest.mark.parametrize("widgets, words", [
    ({"method": "nope"}, "method"),
    ({"beta": float("nan")}, "beta"),
    ({"beta": "1"}, "beta"),
    ({"target_sparsity": 1.5}, "target_sparsity"),
    ({"estimator": "approx"}, "estimator"),
    ({"warmup": -0.1}, "warmup"),
    ({"warmup": 0.7, "final_dense": 0.5}, "final_dense"),
    ({"dense_blocks": "0-a"}, "dense_blocks"),
    ({"dense_blocks": "5"}, "dense_blocks"),     # out of range for 3 blocks
    ({"dense_blocks": "2-1"}, "dense_blocks"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"sol_tile": "1,2"}, "sol_tile"),
    ({"sol_tile": "1,4,4"}, "sol_tile"),         # 16 tokens, not a 64-token block
    ({"sol_tile": "99999999,1,1"}, "sol_tile.t must be <= 256"),       # bounded, ASCII
    ({"sol_tile": "１,8,8"}, "sol_tile: expected"),
    ({"dense_blocks": "１"}, "dense_blocks: cannot read"),
    ({"dense_blocks": "9" * 5000}, "dense_blocks: 5000 characters; at most 1000"),
    ({"backend": "cuda"}, "backend"),
    ({"method": "psa"}, "preset"),               # psa without a preset
    ({"preset_grid": "stretch"}, "preset_grid"),
    ({"precision": "FP8"}, "precision: expected one of 'auto', 'bf16', 'int8', 'fp8', got 'FP8'"),
    ({"precision": "INT8"}, "precision: expected one of 'auto', 'bf16', 'int8', 'fp8', got 'INT8'"),
    ({"precision": None}, "precision: expected one of"),
])
def test_bad_widget_values_name_the_widget(pack, wan, widgets, words):
    with pytest.raises((ValueError, TypeError)) as e:
        patch(pack, wan.patcher, **widgets)
    assert words in str(e.value)


@pytest.mark.parametrize("widgets, logged", [
    ({"beta": 5.0}, "5 gives an expected density"),
    ({"beta": float("-inf")}, "-inf computes every key block exactly"),
    ({"beta": 1.5}, None),
    ({"beta": 9.0, "target_sparsity": 0.9}, None),   # target_sparsity wins: beta is Φ⁻¹(0.9)
    ({"beta": 9.0, "method": "dense"}, None),        # beta unused
])
def test_beta_outside_the_documented_range_is_logged(pack, wan, caplog, widgets, logged):
    patch(pack, wan.patcher, **widgets)
    warned = [r.getMessage() for r in caplog.records
              if r.levelname == "WARNING" and "documented range" in r.getMessage()]
    assert warned == ([] if logged is None else [warned[0]]) and (logged is None or logged in warned[0]), warned


def test_beta_tooltip_states_the_documented_range(pack):
    kernels = pack._kernels.kernels
    beta = next(i for i in pack.node_patch.SparseAttentionPatch.define_schema().inputs if i.id == "beta")
    assert f"Documented range {kernels.BETA_MIN:g} to {kernels.BETA_MAX:g}" in beta.tooltip


def test_preset_that_is_not_a_preset(pack, wan):
    with pytest.raises(ValueError, match="preset: expected a stripe-mask preset"):
        patch(pack, wan.patcher, method="psa", preset={"grid": (3, 4, 6)})


def test_unknown_or_unsafe_preset_name(pack):
    for name in ("missing.json", "../../etc/passwd", "/abs/x.json"):
        with pytest.raises(ValueError, match="preset"):
            pack.presets.load_named_preset(name)


def test_unsupported_model_returned_unchanged(pack, comfy):
    import comfy.model_patcher
    lin = torch.nn.Linear(2, 2)

    class Base(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.diffusion_model = lin
    mp = comfy.model_patcher.ModelPatcher(Base(), torch.device("cpu"), torch.device("cpu"))
    assert patch(pack, mp) is mp


# --------------------------------------------------------------------------------- Wan

def test_wan_beta_neg_inf_reproduces_unpatched(pack, wan, wan_base):
    m = patch(pack, wan.patcher, beta=float("-inf"), warmup=0.0, dense_blocks="")
    out = H.sample(wan, steps=5, model=m)
    torch.testing.assert_close(out, wan_base, atol=1e-4, rtol=1e-4)
    s = summary(pack, m)
    # exactly the self-attention calls (one per block per forward) are sparse
    assert s["sparse_calls"] == 5 * 3
    assert s["dense_calls"] == {"not_video_self_attention": 5 * 3}
    assert s["mean_density"] == pytest.approx(1.0)


def test_wan_normal_beta_close_but_not_identical(pack, wan, wan_base):
    m = patch(pack, wan.patcher, beta=1.0, warmup=0.0, dense_blocks="")
    out = H.sample(wan, steps=5, model=m)
    diff = (out - wan_base).abs()
    assert diff.max() > 1e-4
    assert diff.mean() < 0.25 * wan_base.abs().mean()
    s = summary(pack, m)
    assert s["mean_density"] < 1.0
    # the summary says what ran: the backend here (a GPU's launch configuration on CUDA, see
    # tests/gpu) and Sol's blocks, 3D tiles of the video grid by default
    assert s["kernel_config"] == "backend reference on cpu"
    assert s["sol_blocks"].startswith("3D tiles ") and str(tuple(s["grid"])) in s["sol_blocks"]
    m = patch(pack, wan.patcher, beta=1.0, warmup=0.0, dense_blocks="", sol_tile="off")
    H.sample(wan, steps=2, model=m)
    assert summary(pack, m)["sol_blocks"] == "row-major 64-token blocks"


def test_unpatched_model_untouched(pack, wan, wan_base):
    m = patch(pack, wan.patcher, beta=1.0)
    H.sample(wan, steps=5, model=m)
    assert "optimized_attention_override" not in wan.patcher.model_options.get("transformer_options", {})
    for block in wan.patcher.model.diffusion_model.blocks:  # hooks were removed
        assert not block.self_attn._forward_pre_hooks and not block.self_attn._forward_hooks
    torch.testing.assert_close(H.sample(wan, steps=5), wan_base)


def test_warmup_final_and_dense_block_boundaries(pack, wan):
    m = patch(pack, wan.patcher, beta=1.0, warmup=0.2, final_dense=0.1, dense_blocks="0,-1")
    H.sample(wan, steps=10, model=m)
    s = summary(pack, m)
    assert s["schedule"]["total_steps"] == 10 and s["schedule"]["offset"] == 0
    sparse_steps = {st for st, c in s["steps"].items() if c["sparse"]}
    assert sparse_steps == set(range(2, 9))          # 0,1 warm-up; 9 final dense
    assert {b for (_, b) in s["density_by_step_block"]} == {1}   # blocks 0 and 2 dense
    assert s["dense_calls"]["warmup"] == 2 * 3
    assert s["dense_calls"]["final_dense"] == 1 * 3
    assert s["dense_calls"]["dense_block"] == 7 * 2


@pytest.mark.parametrize("steps, warmup_steps, final_steps", [(4, 1, 1), (5, 1, 1), (6, 1, 2), (7, 1, 2), (8, 2, 2)])
def test_few_step_schedules_round_to_whole_steps(pack, wan, steps, warmup_steps, final_steps):
    """Distilled 4-8 step schedules: warmup 0.2 and final_dense 0.25 are whole steps, the
    fraction of the schedule rounded half up (node tooltip, README)."""
    m = patch(pack, wan.patcher, beta=1.0, warmup=0.2, final_dense=0.25, dense_blocks="")
    H.sample(wan, steps=steps, model=m)
    s = summary(pack, m)
    sparse_steps = {st for st, c in s["steps"].items() if c["sparse"]}
    assert sparse_steps == set(range(warmup_steps, steps - final_steps))
    assert s["dense_calls"]["warmup"] == warmup_steps * 3
    assert s["dense_calls"]["final_dense"] == final_steps * 3


def test_min_tokens(pack, wan):
    tokens = 3 * 4 * 6
    m = patch(pack, wan.patcher, warmup=0.0, dense_blocks="", min_tokens=tokens + 1)
    H.sample(wan, steps=2, model=m)
    assert summary(pack, m)["dense_calls"]["min_tokens"] == 2 * 3
    m = patch(pack, wan.patcher, warmup=0.0, dense_blocks="", min_tokens=tokens)
    H.sample(wan, steps=2, model=m)
    assert summary(pack, m)["sparse_calls"] == 2 * 3


def _advanced(wan, model, steps, start, end, seed=0, latent=None):
    """What KSamplerAdvanced does: one schedule of `steps`, run from start to end."""
    import comfy.sample
    latent = torch.zeros(wan.latent_shape) if latent is None else latent
    noise = comfy.sample.prepare_noise(latent, seed) if start == 0 else torch.zeros_like(latent)
    pos, neg = wan.make_conditioning(seed + 1)
    return comfy.sample.sample(model, noise, steps, 1.0, "euler", "simple", pos, neg, latent,
                               start_step=start, last_step=end, force_full_denoise=end >= steps,
                               disable_noise=start > 0, seed=seed, disable_pbar=True)


def test_split_schedule_two_models(pack, comfy):
    """Wan 2.2 style: a high-noise and a low-noise model, each patched, one schedule."""
    high = H.build_wan21(1, num_layers=2)
    low = H.build_wan21(2, num_layers=2)
    mh = patch(pack, high.patcher, beta=1.0, warmup=0.3, dense_blocks="")
    ml = patch(pack, low.patcher, beta=1.0, warmup=0.3, dense_blocks="")
    x = _advanced(high, mh, 10, 0, 5)
    _advanced(low, ml, 10, 5, 10000, latent=x)
    sh, sl = summary(pack, mh), summary(pack, ml)
    assert sh["schedule"] == {"offset": 0, "total_steps": 10, "steps_this_run": 5,
                              "located": True, "scheduler": "simple"}
    assert sl["schedule"]["offset"] == 5 and sl["schedule"]["total_steps"] == 10
    assert sorted(sh["steps"]) == [0, 1, 2, 3, 4] and sorted(sl["steps"]) == [5, 6, 7, 8, 9]
    assert {st for st, c in sh["steps"].items() if c["sparse"]} == {3, 4}   # 0-2 warm-up
    assert all(c["sparse"] == 2 for c in sl["steps"].values())              # no warm-up here
    assert "warmup" not in sl["dense_calls"]
    # two patched models share no state
    dh, dl = pack.patching.dispatcher_of(mh), pack.patching.dispatcher_of(ml)
    assert dh is not dl and dh.stats is not dl.stats and dh.fwd is not dl.fwd


def h_deepcopies_model_options() -> bool:
    """Whether this ComfyUI's ModelPatcher.clone() deep-copies model_options (0.3.75) or copies
    only its dicts and lists (0.33: other objects are shared with the original)."""
    import comfy.model_patcher
    mp = comfy.model_patcher.ModelPatcher(torch.nn.Linear(1, 1), torch.device("cpu"), torch.device("cpu"))
    marker = H.AttentionRecorder()
    mp.model_options["transformer_options"] = {"x": marker}
    return mp.clone().model_options["transformer_options"]["x"] is not marker


def test_chains_to_previous_override(pack, wan, wan_base):
    rec = H.AttentionRecorder()
    prior = H.with_attention_override(wan.patcher, rec)
    m = patch(pack, prior, beta=1.0, warmup=0.0, dense_blocks="")
    H.sample(wan, steps=2, model=m)
    s = summary(pack, m)
    d = pack.patching.dispatcher_of(m)
    # The patch chains to the override it found on its input. ComfyUI 0.3.75's clone()
    # deep-copies model_options, so that is a copy of rec (rec itself is never called); 0.33
    # copies only dicts and lists, so it is rec. Either way only the dense calls reach it.
    prev = d.prev_override
    assert isinstance(prev, H.AttentionRecorder)
    assert (prev is rec) == (not h_deepcopies_model_options())
    assert prev is rec or not rec.calls
    assert len(prev.calls) == sum(s["dense_calls"].values()) == 2 * 3
    assert all(not c.same_len for c in prev.calls)  # only cross-attention reached it
    # re-patching replaces our patch but keeps the earlier override
    m2 = patch(pack, m, method="dense")
    assert isinstance(pack.patching.dispatcher_of(m2).prev_override, H.AttentionRecorder)
    # a clone of a patched model gets its own state
    c = m.clone()
    assert pack.patching.dispatcher_of(c) is not d


def test_model_node_after_the_patch(pack, comfy, wan):
    """A core node that clones the model (ModelSamplingSD3) after the patch: the clone's own
    dispatcher sees the whole run (wrappers, hooks, override); the patch node's output keeps
    its own, unused, state; the unpatched model is untouched."""
    shift = comfy.nodes.NODE_CLASS_MAPPINGS["ModelSamplingSD3"]()
    m = patch(pack, wan.patcher, beta=float("-inf"), warmup=0.0, dense_blocks="")
    (ms,) = shift.patch(m, shift=3.0)
    d, d_ms = pack.patching.dispatcher_of(m), pack.patching.dispatcher_of(ms)
    assert d_ms is not None and d_ms is not d and d_ms.stats is not d.stats
    out = H.sample(wan, steps=5, model=ms)
    s = summary(pack, ms)
    assert s["forwards"] == 5 and s["sparse_calls"] == 5 * 3
    assert s["dense_calls"] == {"not_video_self_attention": 5 * 3}
    assert s["schedule"]["located"] and s["schedule"]["total_steps"] == 5
    assert d.last_run is None and d.stats.forwards == 0     # the patch output did not run
    # beta = -inf (every block exact) gives the unpatched model's output with the same shift
    (plain_shift,) = shift.patch(wan.patcher, shift=3.0)
    torch.testing.assert_close(out, H.sample(wan, steps=5, model=plain_shift), atol=1e-4, rtol=1e-4)
    # sampling the patch output itself afterwards uses its own state, not the clone's
    H.sample(wan, steps=2, model=m)
    assert summary(pack, m)["sparse_calls"] == 2 * 3 and summary(pack, ms)["forwards"] == 5
    assert "optimized_attention_override" not in wan.patcher.model_options.get("transformer_options", {})
    for block in wan.patcher.model.diffusion_model.blocks:
        assert not block.self_attn._forward_pre_hooks and not block.self_attn._forward_hooks


def dense_reason(pack, d, q, k, mask=None):
    """Why dispatcher ``d`` keeps a 2-head call of ``q``, ``k`` dense (None: it runs sparse)."""
    verdict = d.method.decide(d, pack.calls.read_call((q, k, k, 2, mask), {}))
    return verdict.reason if isinstance(verdict, pack.policy.Dense) else None


@pytest.mark.parametrize("backend, dtype, head_dim, reason", [
    ("auto", torch.float32, 64, "backend"),
    ("triton", torch.float16, 64, "device"),
])
def test_rules_backend_device(pack, wan, backend, dtype, head_dim, reason, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # no interpreter: CPU means dense
    d = live_dispatcher(pack, patch(pack, wan.patcher, backend=backend, dense_blocks=""))
    q = torch.randn(1, 72, 2 * head_dim, dtype=dtype)
    assert dense_reason(pack, d, q, q) == reason


def test_rules_mask_cross_and_dense_method(pack, wan):
    d = live_dispatcher(pack, patch(pack, wan.patcher, dense_blocks=""))
    q = torch.randn(1, 72, 256)
    assert dense_reason(pack, d, q, q) is None
    bias = torch.zeros(1, 72, 72)
    assert dense_reason(pack, d, q, q, bias) is None                 # all-zero additive: exact
    assert dense_reason(pack, d, q, q, torch.ones(1, 72, 72, dtype=torch.bool)) is None
    bias[0, 3, 5] = -1.0
    assert dense_reason(pack, d, q, q, bias) == "mask"
    assert dense_reason(pack, d, q, q, torch.rand(1, 72, 72) > 0.5) == "mask"
    # LTX guides split the video self-attention into query groups, each with its mask
    assert dense_reason(pack, d, q[:, :24], q, bias[:, None, 3:4]) == "mask"
    assert dense_reason(pack, d, q, torch.randn(1, 16, 256)) == "not_video_self_attention"
    assert dense_reason(pack, d, torch.randn(1, 70, 256), torch.randn(1, 70, 256)) == "grid"
    d.fwd.role = None
    assert dense_reason(pack, d, q, q) == "not_video_self_attention"
    d = live_dispatcher(pack, patch(pack, wan.patcher, method="dense"))
    assert dense_reason(pack, d, q, q) == "method_dense"


def test_kernel_exception_falls_back_to_dense(pack, wan, wan_base, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("kernel exploded")
    monkeypatch.setattr(pack.ops, "sol_attention", boom)  # our own op wrapper, not ComfyUI
    m = patch(pack, wan.patcher, warmup=0.0, dense_blocks="")
    out = H.sample(wan, steps=5, model=m)
    torch.testing.assert_close(out, wan_base)
    s = summary(pack, m)
    assert s["dense_calls"]["kernel_error"] == 5 * 3
    # a run without one sparse call says so, with the reason
    assert "all 15 video self-attention calls ran dense (kernel_error=15)" in s["warnings"]["no_sparse_calls"]


def test_target_sparsity_sets_beta(pack, wan):
    from_kernels = importlib.import_module(pack.ops.kernels.__name__)
    d = pack.patching.dispatcher_of(patch(pack, wan.patcher, target_sparsity=0.85))
    assert d.method.beta == pytest.approx(float(from_kernels.beta_for_density(0.15)))
    assert from_kernels.density_for_beta(d.method.beta) == pytest.approx(0.15, abs=1e-3)


# --------------------------------------------------------------------------------- other families

def test_hunyuan_video_joint_attention_text_sinks(pack):
    hy = H.build_hunyuan_video(0, depth=2, depth_single_blocks=2)
    base = H.sample(hy, steps=3)
    m = patch(pack, hy.patcher, beta=float("-inf"), warmup=0.0, dense_blocks="")
    torch.testing.assert_close(H.sample(hy, steps=3, model=m), base, atol=1e-4, rtol=1e-4)
    s = summary(pack, m)
    assert s["sparse_calls"] == 3 * 4                      # 2 double + 2 single blocks
    assert s["dense_calls"] == {"not_video_self_attention": 3 * 2}   # the text refiner
    m = patch(pack, hy.patcher, beta=1.0, warmup=0.0, dense_blocks="-1")
    out = H.sample(hy, steps=3, model=m)
    s = summary(pack, m)
    assert {b for (_, b) in s["density_by_step_block"]} == {0, 1, 2}   # -1 = last single block
    assert (out - base).abs().max() > 1e-5


def test_hunyuan_video_sol_gets_the_video_tokens_first_in_either_join_order(pack, monkeypatch):
    hy = H.build_hunyuan_video(0, depth=1, depth_single_blocks=1)
    m = patch(pack, hy.patcher, beta=1.0, warmup=0.0, dense_blocks="")
    check_hunyuan_join_order(pack, monkeypatch, hy, "sol_attention", m)


def test_ltxv_self_attention_only(pack):
    lt = H.build_ltxv(0, num_layers=2)
    base = H.sample(lt, steps=3)
    m = patch(pack, lt.patcher, beta=float("-inf"), warmup=0.0, dense_blocks="")
    torch.testing.assert_close(H.sample(lt, steps=3, model=m), base, atol=1e-4, rtol=1e-4)
    s = summary(pack, m)
    assert s["sparse_calls"] == 3 * 2
    assert s["dense_calls"] == {"not_video_self_attention": 3 * 2}   # attn2 cross-attention


# --------------------------------------------------------------------------------- compile, imports

@pytest.mark.slow  # torch.compile of a model: about 15 s
def test_compiled_model_traces_the_custom_op(pack, wan):
    from comfy_api.torch_helpers import set_torch_compile_wrapper
    import torch._dynamo
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def compiled_graphs(method):
        graphs.clear()
        torch._dynamo.reset()
        m = patch(pack, wan.patcher, method=method, beta=1.0, warmup=0.0, dense_blocks="")
        set_torch_compile_wrapper(m, backend=backend)
        try:
            H.sample(wan, steps=1, model=m)
        finally:  # no compiled code or guards left for later tests, also when sampling fails
            torch._dynamo.reset()
        return list(graphs)

    sparse = compiled_graphs("sol_attn")
    targets = [str(n.target) for g in sparse for n in g.graph.nodes if n.op == "call_function"]
    assert sum("sparse_video_attn.sol_attention" in t for t in targets) == 3
    # the sparse path adds no graph break: no more graphs than the same patch run dense
    # (ComfyUI's own dense attention path breaks the graph; the custom op does not)
    assert len(sparse) <= len(compiled_graphs("dense"))


def test_pack_importable_twice(comfy):
    """ComfyUI imports the pack by folder name; a second import under another name must not
    re-register the custom ops."""
    spec = importlib.util.spec_from_file_location(
        "svattn_second_copy", REPO / "__init__.py", submodule_search_locations=[str(REPO)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["svattn_second_copy"] = mod
    try:
        spec.loader.exec_module(mod)
        ops2 = importlib.import_module("svattn_second_copy.nodes.ops")
        q = torch.randn(1, 128, 2, 64)
        out, dens = ops2.sol_attention(q, q, q, beta=float("-inf"), backend="reference")
        assert out.shape == q.shape and dens.shape == (1, 2)
    finally:
        for name in [n for n in sys.modules if n.startswith("svattn_second_copy")]:
            del sys.modules[name]


def test_schedule_locate_denoise_and_custom(pack):
    from comfy.samplers import calculate_sigmas
    import comfy.model_sampling
    sched = pack.schedule

    class MS(comfy.model_sampling.ModelSamplingDiscreteFlow, comfy.model_sampling.CONST):
        pass
    ms = MS()
    full = calculate_sigmas(ms, "normal", 12)
    sc = sched.locate(full[4:], ms)
    assert (sc.offset, sc.total_steps, sc.located) == (4, 12, True)
    assert sc.step_of(float(full[6])) == 6
    assert sc.step_of(float(full[6] + full[7]) / 2) == 6     # a midpoint evaluation
    custom = torch.tensor([1.0, 0.77, 0.31, 0.0])
    sc = sched.locate(custom, ms)
    assert (sc.offset, sc.total_steps, sc.located) == (0, 3, False)
    assert math.isclose(sc.sigmas[1], 0.77, rel_tol=1e-6)


def test_precision_is_the_last_widget_and_defaults_to_auto(pack):
    """Saved workflows keep their widget order: ``precision`` was added last; its options are
    the library's, fp8 appended after the options saved workflows may hold."""
    last = pack.node_patch.SparseAttentionPatch.define_schema().inputs[-1]
    assert last.id == "precision" and last.default == "auto"
    assert list(last.options) == ["auto", "bf16", "int8", "fp8"] == list(pack._kernels.kernels.PRECISIONS)
    assert "fp8" in last.tooltip
    assert "(int8 on A100 and RTX 30/40/50, and for PSA on H100/H200; else bf16)" in last.tooltip
    assert pack.config.make_config().precision == "auto"


@pytest.mark.parametrize("precision, shown", [
    ("int8", "int8 (asked for: the float32 reference of that path)"),
    ("fp8", "fp8 (asked for: the float32 reference of that path)"),
    ("auto", "bf16 (auto on backend reference: the float32 reference of that path)"),
])
def test_the_run_summary_and_the_inspector_say_the_precision(pack, wan, wan_base, precision, shown):
    """The patch passes its precision to the kernel op (int8 and fp8 move the result a little,
    within their error budgets of tests/kernels/test_quantized.py, relative to the latent's change), and
    the summary and the Inspector's JSON say which ran and why."""
    m = patch(pack, wan.patcher, beta=1.0, warmup=0.0, dense_blocks="", precision=precision)
    out = H.sample(wan, steps=5, model=m)
    s = summary(pack, m)
    assert s["precision"] == shown and s["sparse_calls"] == 5 * 3
    assert pack.node_inspector.summary_json(s)["precision"] == shown
    bf16 = H.sample(wan, steps=5, model=patch(pack, wan.patcher, beta=1.0, warmup=0.0, dense_blocks="",
                                               precision="bf16"))
    if precision != "auto":
        budget = {"int8": 3e-2, "fp8": 8e-2}[precision]
        assert 0 < (out - bf16).norm() < budget * (bf16 - wan_base).norm() + budget * bf16.norm()
    else:
        torch.testing.assert_close(out, bf16, rtol=0, atol=0)


@pytest.mark.parametrize("precision", ["int8", "fp8"])
def test_quantized_op_on_the_triton_backend_is_its_reference(pack, precision):
    """The custom ops take the precision to the kernels (interpreted here) and the references."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 128, 2, 64, generator=g).half() for _ in range(3))
    out, _ = pack.ops.sol_attention(q, k, v, beta=0.5, backend="triton", precision=precision)
    ref, _ = pack.ops.sol_attention(q, k, v, beta=0.5, backend="reference", precision=precision)
    bf16, _ = pack.ops.sol_attention(q, k, v, beta=0.5, backend="reference", precision="bf16")
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    assert err < 1e-3 < ((bf16.float() - ref.float()).norm() / ref.float().norm()).item()
    kw = dict(grid=[2, 8, 8], params=torch.tensor([[1, 0, 0, 1, 0, 0]] * 2), tile=[1, 8, 8])
    out = pack.ops.psa_attention(q, k, v, backend="triton", precision=precision, **kw)
    ref = pack.ops.psa_attention(q, k, v, backend="reference", precision=precision, **kw)
    assert ((out.float() - ref.float()).norm() / ref.float().norm()).item() < 1e-3


def test_triton_op_through_the_dispatcher_path(pack):
    """The custom op on the Triton backend (interpreted on CPU) matches the reference."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 128, 2, 64, generator=g).half() for _ in range(3))
    out, dens = pack.ops.sol_attention(q, k, v, beta=float("-inf"), backend="triton")
    ref, _ = pack.ops.sol_attention(q, k, v, beta=float("-inf"), backend="reference")
    assert out.dtype == torch.float16 and dens.shape == (1, 2)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-3, rtol=2e-3)


def test_hunyuan_video_attention_layouts_on_the_triton_kernels(pack):
    """The q/k/v that ComfyUI's HunyuanVideo blocks hand to attention keep their memory layout
    into the Triton kernels (interpreted here): the single block passes k heads first and v as
    a view into its fused qkv projection, so K and V rows have different strides (V was once
    read with K's stride). Each call, in bf16 with its exact strides, matches the reference."""
    hy = H.build_hunyuan_video(0, depth=1, depth_single_blocks=1)
    calls = []

    def capture(func, *args, **kwargs):
        calls.append((args, kwargs))
        return func(*args, **kwargs)

    m = hy.patcher.clone()
    m.model_options.setdefault("transformer_options", {})["optimized_attention_override"] = capture
    H.sample(hy, steps=1, model=m)

    def bf16_same_layout(t):
        base = t if t._base is None else t._base
        assert base.is_contiguous()
        return base.to(torch.bfloat16).as_strided(t.shape, t.stride(), t.storage_offset())

    grid, n_video = (3, 4, 6), 72          # latent (1, 16, 3, 8, 12), patch (1, 2, 2); 16 text tokens
    joint = [(a, kw) for a, kw in calls if kw.get("skip_reshape") and a[0].shape[2] == n_video + 16]
    assert len(joint) == 2                  # one double block, one single block
    mixed = 0
    for args, kw in joint:
        q, k, v = (pack.calls.blhd(bf16_same_layout(t), args[3], True) for t in args[:3])
        mixed += k.stride(1) != v.stride(1)
        sinks = [(n_video, n_video + 16)]
        out, _ = pack.ops.sol_attention(q, k, v, beta=float("-inf"), sinks=sinks, backend="triton")
        ref, _ = pack.ops.sol_attention(q, k, v, beta=float("-inf"), sinks=sinks, backend="reference")
        torch.testing.assert_close(out.float(), ref.float(), atol=3e-2, rtol=3e-2)
        params = torch.tensor([[2, 0, 0, 1, 0, 0]])
        kw_psa = dict(grid=list(grid), params=params, tile=[1, 4, 4], extra_tokens=16)
        out = pack.ops.psa_attention(q, k, v, backend="triton", precision="bf16", **kw_psa)
        ref = pack.ops.psa_attention(q, k, v, backend="reference", precision="bf16", **kw_psa)
        torch.testing.assert_close(out.float(), ref.float(), atol=3e-2, rtol=3e-2)
    assert mixed == 1                       # the single block's K and V rows differ in stride
