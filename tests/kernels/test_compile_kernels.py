"""Every kernel launch builds and fits on each GPU architecture users have — checked on the CPU.

The interpreter that runs the kernels elsewhere in CI does not apply Triton's type rules,
layouts or shared-memory limits; tools/compile_kernels.py compiles every launch configuration
the pack makes, with each architecture's launch configuration (kernels/engine/launch_config.py), down
to a cubin (Triton's bundled ptxas) without running it, and fails when one asks for more
shared memory than its architecture has. It runs with the Triton CI installs and with 3.6
(the Triton of torch 2.11, unpacked into .cache/ by `make triton36`).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # every kernel compiled for every architecture, in subprocesses

ROOT = Path(__file__).resolve().parents[2]
TRITON36 = ROOT / ".cache" / "triton-3.6.0"
ARCHS = ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"]
# compile_all builds every launch for all six: about 570 s on CI's 2 cores with a cold cache,
# too close to the suite's per-test limit (900 s, .ci/run) to share it.
COMPILE_ALL_TIMEOUT_S = 1800


def compile_all(tmp_path, extra_path=None):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if extra_path:
        env["PYTHONPATH"] = str(extra_path)
    out, ptx = tmp_path / "compiled.json", tmp_path / "ptx.json"
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "compile_kernels.py"), "--arch", ",".join(ARCHS),
                          "--json", str(out), "--ptx", str(ptx)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=COMPILE_ALL_TIMEOUT_S)
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]
    table = json.loads(out.read_text())
    check_ptx(table, json.loads(ptx.read_text()))
    return table, run.stdout


def run_probe(directory: Path, source: str, *args: str, timeout: int = 300) -> str:
    """Runs a probe script (``source``, written to a file in ``directory``: @triton.jit needs its
    source in one) without the interpreter, tools/ and ``args`` its arguments; its stdout."""
    probe = directory / "probe.py"
    probe.write_text(source)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(probe), str(ROOT / "tools"), *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-5000:]
    return run.stdout


def integer_mma(counts) -> bool:
    """An int8 tensor-core instruction: mma.sync / wgmma on s8, or Blackwell's tcgen05 kind::i8."""
    return any(("mma" in i and ".s8" in i) or "tcgen05.mma.cta_group::1.kind::i8" in i for i in counts)


# fp8 launches whose QKᵀ Triton builds from f16 MMAs instead: on sm_90 and sm_100 the fp8 MMAs
# are wgmma and tcgen05 alone, which need tiles of 64 rows or more, and 30-token blocks make
# 32-row query tiles (mma.sync takes e4m3 on sm_89 and sm_120 only). The e4m3 codes are
# converted to f16 first (exact: every e4m3 value is an f16 value), so the result is the same,
# at the f16 rate.
FP8_BY_F16_MMA = {("sm_90", "psa 30-token tiles, fp8"), ("sm_100", "psa 30-token tiles, fp8")}


def f16_mma_of_e4m3(counts) -> bool:
    return (any("cvt.rn.f16x2.e4m3x2" in i for i in counts)
            and any(i.startswith("mma.sync") and ".f16.f16" in i for i in counts))


def fp8_mma(counts, arch: str) -> bool:
    """The fp8 tensor-core instruction of ``arch`` on e4m3 operands: mma.sync (sm_89, sm_120),
    wgmma (sm_90), Blackwell's tcgen05 kind::f8f6f4 (sm_100, whose PTX does not name the
    operand type: the instruction descriptor holds it)."""
    if arch == "sm_100":
        return any("tcgen05.mma.cta_group::1.kind::f8f6f4" in i for i in counts)
    prefix = "wgmma.mma_async" if arch == "sm_90" else "mma.sync"
    return any(i.startswith(prefix) and ".e4m3.e4m3" in i for i in counts)


def check_ptx(table, ptx):
    """--ptx holds every compiled launch, and the Hopper loop's hold its warpgroup MMAs. The
    engine's int8 launches (portable kernel or Hopper loop) hold an int8 MMA (their QKᵀ) and
    the others none; its fp8 launches hold the architecture's e4m3 MMA and the others none; the
    fp8 codes are written by a conversion to e4m3 (exact: the values are on the e4m3 grid
    already); the key sums pass sums in float64, Sol's pooling pass never does."""
    launches = ptx["launches"]
    rows = {f"{r['arch']} {r['kernel']} {r['case']}": r for r in table["rows"] if "refused_by_triton" not in r}
    assert set(launches) == set(rows)
    for key, counts in launches.items():
        assert sum(counts.values()) > 100, key
        if "_ws_block_sparse_kernel" in key:
            assert any(i.startswith("wgmma.mma_async") for i in counts), key
        precision, arch = rows[key]["precision"], rows[key]["arch"]
        if rows[key]["kernel"] in ENGINE_KERNELS:
            assert integer_mma(counts) == (precision == "int8"), key
            if (arch, rows[key]["case"]) in FP8_BY_F16_MMA:
                assert not fp8_mma(counts, arch) and f16_mma_of_e4m3(counts), key
            else:
                assert fp8_mma(counts, arch) == (precision == "fp8"), key
        if rows[key]["kernel"] in ENGINE_KERNELS + ("_quantize_keys_kernel",):
            assert any("satfinite.e4m3x2" in i for i in counts) == (precision == "fp8"), key
        if rows[key]["kernel"] in ("_pool_kernel", "_key_sums_kernel"):
            assert any(i.startswith("add.f64") for i in counts) == (rows[key]["kernel"] == "_key_sums_kernel"), key


FP8_ARCHS = ["sm_89", "sm_90", "sm_100", "sm_120"]  # fp8 tensor cores; precision refuses fp8 before
ENGINE_KERNELS = ("_block_sparse_kernel", "_ws_block_sparse_kernel")  # the portable kernel, the Hopper loop


def check_fp8_refusals(table):
    """On sm_80 and sm_86 the pack refuses fp8, and Triton refuses float8e4nv: each fp8 launch of
    the engine and the key quantization, built as the sm_89 row makes it, fails there with
    Triton's own sentence; nothing else does."""
    refused = [r for r in table["rows"] if "refused_by_triton" in r]
    quantized_cases = {case + ", fp8" for case in table["quantized_cases"]}
    assert {(r["arch"], r["kernel"], r["case"]) for r in refused} == {
        (arch, kernel, case) for arch in set(ARCHS) - set(FP8_ARCHS)
        for kernel in ("_block_sparse_kernel", "_quantize_keys_kernel") for case in quantized_cases}
    assert all(r["refused_by_triton"].startswith("type fp8e4nv not supported in this architecture") for r in refused)
    assert not any(r["precision"] == "fp8" for r in table["rows"] if r["arch"] not in FP8_ARCHS
                   and "refused_by_triton" not in r)


def check_table(table):
    check_fp8_refusals(table)
    rows = [r for r in table["rows"] if "refused_by_triton" not in r]
    assert {r["arch"] for r in rows} == set(ARCHS)
    assert all(r["fits"] and r["shared"] <= r["limit"] for r in rows), [r for r in rows if not r.get("fits")]
    engine = [r for r in rows if r["kernel"] in ENGINE_KERNELS]
    bf16 = [r for r in engine if r["precision"] == "bf16"]
    quantized = [r for r in engine if r["precision"] != "bf16"]
    # TMA boxes exactly where the copy engine exists and the configuration takes them; the
    # warp-specialised loop on Hopper only, for every case it takes in every precision
    # (30-token tiles make no box; PSA's 64-token tiles, LTX-2's preset, run TMA boxes, since
    # the loop takes 64-row query tiles only with Sol's pooled term: hopper_loop.ws_supported).
    assert {r["arch"] for r in engine if r["tma"]} == {"sm_90", "sm_100"}
    assert {r["arch"] for r in engine if r["warp_specialized"]} == {"sm_90"}
    boxes_only = ("psa 30-token tiles", "psa ltx2 preset tile 2x4x8, 2-row edge")
    assert {r["case"] for r in bf16 if r["arch"] == "sm_90" and not r["warp_specialized"]} == set(boxes_only)
    assert {r["case"] for r in quantized if r["warp_specialized"]} == {
        r["case"] for r in quantized if r["arch"] == "sm_90" and not r["case"].startswith(boxes_only)}
    assert {r["case"] for r in quantized if r["arch"] == "sm_90" and not r["tma"]} == {
        "psa 30-token tiles, int8", "psa 30-token tiles, fp8"}
    # Every quantized case, int8 on every architecture and fp8 on those with fp8 tensor cores:
    # the engine's quantized launch (one of its two kernels), the key sums pass and the key
    # quantization; Sol's cases also their pooling pass, the same in every precision.
    assert {case.split()[0] for case in table["quantized_cases"]} == {"psa", "sol"}
    assert any("d64" in c for c in table["quantized_cases"])
    for precision, archs in (("int8", ARCHS), ("fp8", FP8_ARCHS)):
        cases = {case + ", " + precision for case in table["quantized_cases"]}
        for kernels in (ENGINE_KERNELS, ("_key_sums_kernel",), ("_quantize_keys_kernel",)):
            assert sorted((r["arch"], r["case"]) for r in rows if r["kernel"] in kernels
                          and r["precision"] == precision) == sorted(
                (arch, case) for arch in archs for case in cases), (kernels, precision)
        assert {r["case"] for r in rows if r["kernel"] == "_pool_kernel" and r["precision"] == precision} == {
            case for case in cases if case.startswith("sol")}
    # Sol's portable lowering (id lists from the bitmap) wherever the portable loop runs Sol:
    # in every precision but on sm_90 (the Hopper loop streams pairs).
    lists = [r for r in rows if r["kernel"] == "_lists_from_bits_kernel"]
    assert {r["arch"] for r in lists if r["precision"] == "bf16"} == set(ARCHS) - {"sm_90"}
    assert {r["arch"] for r in lists if r["precision"] == "int8"} == set(ARCHS) - {"sm_90"}
    assert {r["arch"] for r in lists if r["precision"] == "fp8"} == set(FP8_ARCHS) - {"sm_90"}
    # HunyuanVideo's single blocks (k heads first, v a view of qkv) still take the TMA path there,
    # in bf16, int8 and fp8 (whose k codes have a layout of their own).
    single = [r for r in engine if "single block" in r["case"] and r["arch"] in ("sm_90", "sm_100")]
    assert len(single) == 6 and all(r["tma"] for r in single)
    assert all(r["registers"] for r in rows)


@pytest.mark.timeout(COMPILE_ALL_TIMEOUT_S)
def test_every_launch_compiles_and_fits_every_architecture(tmp_path):
    table, stdout = compile_all(tmp_path)
    check_table(table)
    refused = sum("refused_by_triton" in r for r in table["rows"])
    assert f"{len(table['rows']) - refused} launches compiled, 0 failed; {refused} fp8 launches refused" in stdout


@pytest.mark.timeout(COMPILE_ALL_TIMEOUT_S)
@pytest.mark.skipif(not (TRITON36 / "triton").is_dir(), reason="Triton 3.6 not unpacked: run `make triton36`")
def test_every_launch_compiles_and_fits_with_triton_3_6(tmp_path):
    table, _ = compile_all(tmp_path, TRITON36)
    assert table["triton"] == "3.6.0"
    check_table(table)


def test_a_row_forced_on_an_h100_runs_wgmma_unless_mma_v3_is_disabled(tmp_path):
    """What a benchmark runs when it forces the RTX 40 row on an H100 (Triton compiles for the
    GPU it runs on): the engine's dots become Hopper's wgmma, not the row's own mma.sync, but
    for 32-row query tiles, which wgmma cannot take; with DISABLE_MMA_V3=1 (in Triton's cache
    key) they are the row's mma.sync again. Shared memory is held to the H100's limit."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    runs = {}
    for name, extra in (("native", {}), ("mma_sync", {"DISABLE_MMA_V3": "1"})):
        out = tmp_path / f"{name}.json"
        runs[name] = out, subprocess.Popen(
            [sys.executable, str(ROOT / "tools" / "compile_kernels.py"), "--arch", "sm_89", "--run-on", "sm_90",
             "--json", str(out)], cwd=ROOT, env={**env, **extra}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)
    tables = {}
    for name, (out, proc) in runs.items():
        stdout, _ = proc.communicate(timeout=1800)
        assert proc.returncode == 0, stdout[-20000:]
        tables[name] = [r for r in json.loads(out.read_text())["rows"] if r["kernel"] == "_block_sparse_kernel"]
    for name, rows in tables.items():
        assert rows and all(r["arch"] == "sm_89" and r["compiled_for"] == "sm_90" and r["limit"] == 232_448
                            for r in rows), name
    for r in tables["native"]:
        hopper = "30-token" not in r["case"]
        assert any(i.startswith("wgmma") for i in r["mma"]) == hopper, r
    assert all(r["mma"] and all(i.startswith("mma.sync") for i in r["mma"]) for r in tables["mma_sync"])
    assert subprocess.run([sys.executable, str(ROOT / "tools" / "compile_kernels.py"), "--run-on", "sm_75"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300).returncode == 2


PSA_CASES_PROBE = r"""
import json
import sys
sys.path.insert(0, sys.argv[1])
from compile_kernels import PSA_CASES, QUANTIZED_CASES
print(json.dumps([[list(grid), list(tile)] for name, grid, tile, *_ in PSA_CASES if name in QUANTIZED_CASES]))
"""


def build_of(grid, tile):
    """What of a grid makes a PSA launch a build of its own: the tile (constants of the
    kernel), the rows the grid leaves in the last block row (the Hopper loop's edge cover) and
    whether it cuts tiles in frames or columns (the padding bias there)."""
    rows = grid[1] - (-(-grid[1] // tile[1]) - 1) * tile[1]
    return tuple(tile), rows, grid[0] % tile[0] != 0 or grid[2] % tile[2] != 0


def test_every_shipped_preset_is_compiled_as_its_grid_cuts_its_tile_in_every_precision(tmp_path):
    """The launches a shipped preset makes (auto runs PSA in int8 on every row) are among those
    compiled for every architecture in bf16, int8 and fp8: a preset whose tile no case builds
    would reach users' GPUs with its shared memory and spills unchecked."""
    compiled = {build_of(grid, tile) for grid, tile in json.loads(run_probe(tmp_path, PSA_CASES_PROBE))}
    presets = sorted((ROOT / "mask_presets").glob("*.json"))
    assert len(presets) >= 7
    for path in presets:
        preset = json.loads(path.read_text())
        assert build_of(preset["grid"], preset["tile"]) in compiled, path.name


SPECIALIZATION_PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
import torch, triton, triton.language as tl
from compile_kernels import CapturedLaunch, compile_call

@triton.jit
def copy_rows(src, dst, n_rows, row_stride, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    for r in range(n_rows):
        tl.store(dst + r * row_stride + offs, tl.load(src + r * row_stride + offs))

launch = CapturedLaunch(copy_rows)
x = torch.zeros(64, 32)
launch[(1,)](x, x, 1, 32, BLOCK=32)
ttir = compile_call(launch.fn, *launch.calls.pop()).asm["ttir"]
print("signature:", next(line for line in ttir.splitlines() if "tt.func" in line))
"""


def test_launches_are_compiled_with_the_jits_argument_specialisation(tmp_path):
    """As on the device: a stride divisible by 16 carries tt.divisibility, a count of 1 is a
    constant (not an argument). Without this, shared-memory sizes and the passes' input
    differed from what the H200 compiles."""
    signature = run_probe(tmp_path, SPECIALIZATION_PROBE).split("signature:", 1)[1]
    assert "%row_stride: i32 {tt.divisibility = 16 : i32}" in signature, signature
    assert "%n_rows" not in signature, signature


MMA_LAYOUT_PROBE = r"""
import re
import sys
sys.path.insert(0, sys.argv[1])
import compile_kernels
from compile_kernels import ARCHITECTURES, capture_launches, compile_call, programs_per_sm, resource_usage

compile_kernels.checks.kernel_device_ok = lambda device: True
capability = int(sys.argv[2])
config = ARCHITECTURES[divmod(capability, 10)]
for case, launch, args, kw in capture_launches(config, ("bf16", "int8")):
    if launch.fn.__name__ == "_block_sparse_kernel" and case.startswith("sol 3D tiles, padded grid"):
        compiled = compile_call(launch.fn, args, kw, capability)
        warps = sorted(set(re.findall(r"nvidia_mma<\{[^}]*warpsPerCTA = (\[[^\]]*\])", compiled.asm["ttgir"])))
        registers = resource_usage(compiled.asm["cubin"])["registers"]
        programs = programs_per_sm(compiled.metadata.shared, registers, kw["num_warps"], config)
        print(f"{case}|{kw['BLOCK_M']}|{kw['HEAD_DIM']}|{kw['SPLIT_PV']}|{' '.join(warps)}|{kw['num_stages']}|"
              f"{compiled.metadata.shared}|{programs}")
"""


def sol_launches_of_a_row(capability: int, tmp_path_factory):
    """Sol's engine launches of one architecture's row (3D tiles, padded grid, text sinks; bf16
    and int8) compiled for it (``capability`` 89: sm_89): (case, BLOCK_M, HEAD_DIM, SPLIT_PV,
    warpsPerCTA, stages, shared bytes, programs an SM holds) each."""
    stdout = run_probe(tmp_path_factory.mktemp(f"sol_sm{capability}"), MMA_LAYOUT_PROBE, str(capability),
                       timeout=600)
    rows = [line.split("|") for line in stdout.splitlines() if "|" in line]
    assert [row[0] for row in rows] == ["sol 3D tiles, padded grid, text sinks",
                                        "sol 3D tiles, padded grid, text sinks, int8"], stdout
    return rows


@pytest.fixture(scope="module")
def sol_launches_of_the_rtx40_row(tmp_path_factory):
    return sol_launches_of_a_row(89, tmp_path_factory)


def test_sol_tiles_on_the_pointer_rows_lay_their_warps_along_the_query_rows(sol_launches_of_the_rtx40_row):
    """Sol's 64-row tiles at d 128 on the RTX 40 row, bf16 and int8: P·V split over the head
    dim's halves (``portable.split_pv``) makes Triton's ``mma.sync`` layout put the 4 warps
    along the rows ([4, 1]); one 64 × 128 P·V dot gave [1, 4], and every key step moved P
    between the warps through shared memory (kernels/DESIGN.md, "The portable loop")."""
    for case, block_m, head_dim, split, warps, *_ in sol_launches_of_the_rtx40_row:
        assert (block_m, head_dim, split, warps) == ("64", "128", "True", "[4, 1]"), case


def test_two_sol_programs_share_an_sm_of_the_100kb_rows(sol_launches_of_the_rtx40_row):
    """An RTX 30/40/50 SM holds 100 KB of shared memory: Sol's launches there take 2 stages
    (``LaunchConfig.sol_stages``), 49,664 bytes, so that two programs share an SM; 3 stages
    (81,920 bytes) left one, and ran 1.22x (bf16) / 1.14x (int8) slower with the sm_89 row forced
    on an H100 whose SM was held to 100 KB (benchmarks/sm_shared_memory.py)."""
    for case, *_, stages, shared, programs in sol_launches_of_the_rtx40_row:
        assert stages == "2", case
        assert int(programs) == 2, (case, shared)


@pytest.mark.parametrize("capability", [80, 100])
def test_two_sol_programs_share_an_sm_of_the_a100_and_b200_rows(capability, tmp_path_factory):
    """The A100 and B200 rows run Sol at 3 stages, two programs an SM (registers bind on the
    A100 first). The pooled term's loop keeps two chunks in flight (``attend_pooled_blocks``):
    at the kernel's 3 stages the B200 launch took 116,256 bytes, one program an SM."""
    for case, *_, stages, shared, programs in sol_launches_of_a_row(capability, tmp_path_factory):
        assert stages == "3", case
        assert int(programs) == 2, (case, shared)


PROGRAMS_PROBE = r"""
import sys
sys.path.insert(0, sys.argv[1])
from compile_kernels import ARCHITECTURES, programs_per_sm

rtx40, a100, h100 = ARCHITECTURES[(8, 9)], ARCHITECTURES[(8, 0)], ARCHITECTURES[(9, 0)]
print(programs_per_sm(81920, 255, 4, rtx40), programs_per_sm(49408, 255, 4, rtx40),
      programs_per_sm(81920, 255, 4, a100), programs_per_sm(81920, 255, 4, h100),
      programs_per_sm(49408, 168, 4, a100), programs_per_sm(98304, 128, 8, rtx40), programs_per_sm(0, 32, 4, h100))
"""


def test_programs_an_sm_holds_count_shared_memory_with_its_reserve_and_registers_by_the_warp(tmp_path):
    """Shared memory: 100 KB an RTX 40 SM holds one 81,920-byte program and two of 49,408 (with
    1 KB reserved each); 164 KB (A100) and 228 KB (H100) two of
    81,920. Registers: 255 a thread are allocated as 256, 8,192 a warp, so two 4-warp programs;
    168 (5,376 a warp) three."""
    stdout = run_probe(tmp_path, PROGRAMS_PROBE)
    assert stdout.split() == ["1", "2", "2", "2", "3", "1", "16"], stdout


PTX_PROBE = r"""
import sys
sys.path.insert(0, sys.argv[1])
from compile_kernels import compare_instructions, ptx_instructions

before = ptx_instructions("\n".join([
    ".visible .entry k(", "{", "\t.reg .b32 %r<9>;", "$L__BB0_1:", "\tadd.s32 %r3, %r1, %r2; // a comment",
    "\t.loc 1 12 4", "\tbra.uni $L__BB0_1;", "}", ".section\t.debug_info", "\t.b8 87 // DW_AT_call_column"]))
renumbered = ptx_instructions("\n".join([
    ".visible .entry k(", "{", "\t.reg .b32 %r<12>;", "$L__BB0_7:", "\tadd.s32 %r5, %r4, %r6;",
    "\tbra.uni $L__BB0_7;", "}", ".section\t.debug_info", "\t.b8 90 // DW_AT_call_column"]))
changed = ptx_instructions("\n".join([".visible .entry k(", "\tmul.lo.s32 %r5, %r4, %r6;", "\tbra.uni $L__BB0_7;"]))
print(sorted(before.items()))
print(before == renumbered)
for line in compare_instructions({"a": before, "b": before}, {"a": renumbered, "b": changed, "c": changed}):
    print(line)
"""


def test_ptx_instructions_ignore_renumbering_and_compare_launches(tmp_path):
    """--ptx / --ptx-against: register numbers, labels, comments, .loc lines and debug sections
    do not count, nor how many registers are declared; another instruction does, and a launch
    the old file lacks is new."""
    lines = run_probe(tmp_path, PTX_PROBE).splitlines()
    assert lines[0] == ("[('.reg .b32 %r<n>;', 1), ('.visible .entry k(', 1), ('add.s32 %r, %r, %r;', 1), "
                        "('bra.uni $L;', 1)]"), lines[0]
    assert lines[1] == "True"
    assert lines[2] == "same      a"
    assert lines[3].startswith("differs   b: +1 / -2 instructions (+1 mul.lo.s32 %r, %r, %r;"), lines[3]
    assert lines[4] == "new       c"


def test_ptx_against_a_file_that_is_not_one_is_a_usage_error(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    bad = tmp_path / "bad.json"
    bad.write_text('{"rows": []}')
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "compile_kernels.py"), "--arch", "sm_90",
                          "--ptx-against", str(bad)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "--ptx-against" in run.stderr and "not a --ptx file" in run.stderr, run.stderr


TUPLE_OF_DESCRIPTORS = '''
import sys
sys.path.insert(0, {tools!r})
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
import compile_kernels


@gluon.jit
def copy_first(DESCS):
    d = DESCS[0]
    smem = gl.allocate_shared_memory(d.dtype, d.block_type.shape, d.layout)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    mbarrier.expect(bar, d.block_type.nbytes)
    tma.async_copy_global_to_shared(d, [0, 0], bar, smem)
    mbarrier.wait(bar, 0)


x = torch.zeros(64, 64, dtype=torch.bfloat16)
layout = gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)
descs = tuple(TensorDescriptor(x, [64, 64], [64, 1], [64, 64], layout) for _ in range(2))
try:
    compile_kernels.compile_call(copy_first, (descs,), {{}})
except AssertionError:
    print("launcher refused")
else:
    print("launcher accepted")
'''


@pytest.mark.skipif(not (TRITON36 / "triton").is_dir(), reason="Triton 3.6 not unpacked: run `make triton36`")
def test_a_launch_its_launcher_refuses_fails_on_the_cpu(tmp_path):
    """Triton 3.6 compiles a Gluon kernel that takes TMA descriptors in a tuple argument, but its
    CUDA launcher refuses it when the kernel first runs; compile_call builds the
    launcher's source too, so the CPU sees what the GPU would."""
    script = tmp_path / "tuple_of_descriptors.py"
    script.write_text(TUPLE_OF_DESCRIPTORS.format(tools=str(ROOT / "tools")))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(TRITON36)
    run = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.stdout.strip().splitlines()[-1:] == ["launcher refused"], run.stdout[-3000:] + run.stderr[-3000:]
