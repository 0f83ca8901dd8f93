"""Compile every kernel launch the pack makes, for each GPU architecture, on a machine without a GPU.

CI has no GPU and runs the kernels through Triton's interpreter, which does not apply the
compiler's type rules, layouts or shared-memory limits. This tool builds each launch the pack
makes (the launchers run on CPU tensors with each architecture's ``LaunchConfig``; the kernel
call is captured instead of run) and compiles it to a cubin with Triton's bundled LLVM and
ptxas for that architecture, so a kernel that would not build or not fit there fails here.
With Triton 3.6 it also writes each launch's launcher source, as the CUDA driver does on a
kernel's first run, so an argument the launcher refuses fails here too. It never runs a kernel.

    python tools/compile_kernels.py --arch sm_80,sm_86,sm_89,sm_90,sm_100,sm_120
    PYTHONPATH=.cache/triton-3.6.0 python tools/compile_kernels.py ...   # another Triton
    python tools/compile_kernels.py --arch sm_80,sm_89 --run-on sm_90     # rows forced on an H100

``--run-on ARCH`` compiles each row's launches for ARCH instead: what a benchmark that forces
the row on that GPU runs, since Triton compiles for the GPU it runs on. On sm_90 the rows'
dots then become Hopper's ``wgmma``, not the ``mma.sync`` an A100 or RTX card runs;
``DISABLE_MMA_V3=1`` in the environment makes Triton emit ``mma.sync`` there (the variable is
part of Triton's cache key). Each line names the launch's tensor-core instructions.

The cases run in bf16 (the input dtype), and the cases of ``QUANTIZED_CASES`` again with int8
and with fp8 exact blocks (``precision="int8"`` / ``"fp8"``: the portable kernel's quantized
variant, Sol's pooling pass with the float64 key sums, PSA's key sums, the key quantization
kernel); their names
end in ", int8" / ", fp8". On the architectures where ``precision`` refuses "fp8" (sm_80,
sm_86: no fp8 tensor cores), the fp8 launches of the key quantization and the engine (taken as
the sm_89 row makes them, with this architecture's launch row otherwise) are compiled anyway to
record what Triton does there: they must fail with Triton's "fp8e4nv not supported" (a row
with ``refused_by_triton``), and one that compiles fails the run (the refusal would then need
another look).

One line per (architecture, kernel variant): shared memory against the architecture's limit
per block, registers per thread (``cuobjdump -res-usage`` of the cubin), spills, and how many
programs of the launch an SM of that architecture holds at once (``programs_per_sm``). Exit 1 when
any launch fails to compile or asks for more shared memory than its architecture has.
``--json FILE`` also writes the table. ``--ptx FILE`` writes every launch's PTX instructions
(register numbers, labels, comments and debug sections dropped, counted), and ``--ptx-against
FILE`` compares this build's with such a file: a refactor that should not change the code can
be checked without a GPU. Must run without TRITON_INTERPRET.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("compile_kernels.py: unset TRITON_INTERPRET (the interpreter compiles nothing)")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton._C.libtriton import native_specialize_impl  # noqa: E402
from triton.backends.compiler import BaseBackend, GPUTarget  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

import kernels  # noqa: E402
import kernels._checks as checks  # noqa: E402
import kernels.engine.hopper_loop as hopper_loop  # noqa: E402
import kernels.engine.id_lists as id_lists  # noqa: E402
import kernels.engine.launch_order as launch_order  # noqa: E402
import kernels.engine.pair_streams as pair_streams  # noqa: E402
import kernels.engine.portable as portable  # noqa: E402
import kernels.engine.quantize as quantize  # noqa: E402
import kernels.sol_gpu_routing as sol_gpu_routing  # noqa: E402
from kernels.engine.launch_config import ARCHITECTURES  # noqa: E402
from kernels.engine.precision import FP8_MIN_CAPABILITY, check_fp8_row  # noqa: E402

# Shared memory per block a launch may ask for (cudaDevAttrMaxSharedMemoryPerBlockOptin).
SHARED_MEMORY_LIMIT = {80: 166_912, 86: 101_376, 89: 101_376, 90: 232_448, 100: 232_448, 120: 101_376}
DEFAULT_ARCHS = "sm_80,sm_86,sm_89,sm_90,sm_100,sm_120"


class CapturedLaunch:
    """Stands in for a @triton.jit kernel: ``kernel[grid](*args, **kw)`` records the call."""

    def __init__(self, fn):
        self.fn = fn
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kw: self.calls.append((args, kw))


def compile_call(fn, args, kw, capability: int = 90):
    """Compile one captured launch for ``capability`` as the JIT would on that GPU.

    Arguments are specialised the way a launch does it (``native_specialize_impl``): an
    integer or pointer divisible by 16 carries ``tt.divisibility``, an integer 1 becomes a
    constant. That changes the IR (vector widths, and what later passes see), so a kernel
    that builds without it may still fail on the device.
    """
    bound = dict(zip(fn.arg_names, args))
    bound.update({k: v for k, v in kw.items() if k in fn.arg_names})
    signature, constexprs, attrs = {}, {}, {}
    for i, p in enumerate(fn.params):
        if p.is_constexpr:
            signature[p.name] = "constexpr"
            constexprs[(i,)] = bound[p.name]
            continue
        kind, key = native_specialize_impl(BaseBackend, bound[p.name], p.is_const, not p.do_not_specialize,
                                           not p.do_not_specialize_on_alignment)
        signature[p.name] = kind
        if kind == "constexpr":
            constexprs[(i,)] = bound[p.name]
        elif isinstance(key, str):
            attrs[(i,)] = BaseBackend.parse_attr(key)
    options = {"num_warps": kw.get("num_warps", 4), "num_stages": kw.get("num_stages", 3)}
    if "maxnreg" in kw:
        options["maxnreg"] = kw["maxnreg"]
    target = GPUTarget("cuda", capability, 32)
    source = GluonASTSource if getattr(fn, "is_gluon", lambda: False)() else ASTSource
    src = source(fn, signature, constexprs, attrs)
    compiled = triton.compile(src, target=target, options=options)
    launcher_source(src, compiled.metadata)
    return compiled


def launcher_source(src, metadata):
    """The C source of the launcher the CUDA driver builds for a compiled kernel (as Triton
    3.6's ``CudaLauncher`` makes it, not compiled): its argument rules are checked at launch,
    after the kernel compiled (3.6 takes no TMA descriptor inside a tuple argument).
    None with a Triton whose driver builds launchers another way (3.8)."""
    import triton.backends.nvidia.driver as driver

    make_launcher = getattr(driver, "make_launcher", None)
    if make_launcher is None:
        return None
    arg_idx = lambda x: (src.fn.arg_names.index(x),) if isinstance(x, str) else x  # noqa: E731
    constants = {arg_idx(idx): value for idx, value in src.constants.items()}
    return make_launcher(constants, dict(src.signature), getattr(metadata, "tensordesc_meta", None))


def resource_usage(cubin: bytes) -> dict:
    """Registers per thread and stack (spill) bytes from ``cuobjdump -res-usage`` (Triton's copy)."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    regs = re.search(r"REG:(\d+)", text)
    stack = re.search(r"STACK:(\d+)", text)
    return {"registers": int(regs.group(1)) if regs else None, "stack_bytes": int(stack.group(1)) if stack else None}


def programs_per_sm(shared: int, registers: int, num_warps: int, config) -> int:
    """Programs of one launch that an SM of ``config``'s GPU holds at once, as its shared memory
    (plus the 1 KB the GPU reserves a block, against ``config.shared_memory_per_sm``) and its
    registers (a warp's allocated in units of 256, 64K an SM) allow. The warp and block limits
    per SM (48-64 warps) never bind first for the engine kernels (4-8 warps, at most a few
    programs), so they are not counted."""
    by_shared = config.shared_memory_per_sm // (shared + 1024)
    warp_registers = -(-registers * 32 // 256) * 256
    by_registers = 65536 // warp_registers // num_warps
    return min(by_shared, by_registers)


def qkv(B, L, H, D, dtype, layout):
    """q, k, v (B, L, H, D) in a model's memory layout: "blhd" (Wan, LTX: (B, L, H·D)),
    "heads_first" (HunyuanVideo double blocks) or "single_block" (HunyuanVideo single
    blocks: q, k heads first, v a view into the fused qkv projection)."""
    q, k, v = (torch.randn(B, L, H, D, dtype=dtype) for _ in range(3))
    if layout == "blhd":
        return q, k, v
    heads_first = [x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v)]
    if layout == "heads_first":
        return tuple(heads_first)
    return heads_first[0], heads_first[1], torch.stack([q, k, v], dim=2)[:, :, 2]


PSA_PARAMS = torch.tensor([[2, 0, 0, 3, 0, 0], [1, 1, 2, 2, -1, 4]])

# (name, grid, tile, extra tokens, dtype, head dim, layout)
PSA_CASES = [
    ("psa wan720p tile, bf16", (6, 16, 32), (3, 8, 16), 0, torch.bfloat16, 128, "blhd"),
    ("psa wan720p tile, padded grid", (6, 15, 32), (3, 8, 16), 0, torch.bfloat16, 128, "blhd"),
    ("psa wan720p tile, 5-row edge (edge cover)", (6, 13, 32), (3, 8, 16), 0, torch.bfloat16, 128, "blhd"),
    ("psa wan720p tile, 4-row edge, cut frames and columns (edge cover)", (5, 12, 40), (3, 8, 16), 0,
     torch.bfloat16, 128, "blhd"),
    ("psa 4x8x16 tile, 6-row edge, every cover step whole (edge cover)", (8, 22, 48), (4, 8, 16), 0, torch.bfloat16,
     128, "heads_first"),
    ("psa hunyuan single block, text", (6, 16, 32), (3, 8, 16), 256, torch.bfloat16, 128, "single_block"),
    ("psa hunyuan768p tile, fp16 d64", (6, 16, 16), (6, 8, 8), 77, torch.float16, 64, "heads_first"),
    ("psa 30-token tiles", (4, 6, 10), (2, 3, 5), 0, torch.bfloat16, 128, "blhd"),
    # The rest of the shipped presets (mask_presets/): a tile, the rows its grid leaves in the
    # last block row and a cut in frames or columns make a build of their own. HunyuanVideo 1.5
    # (31, 45, 80), Wan 2.2 5B 720p (31, 22, 40), Wan 2.1 1.3B 480p (21, 30, 52), LTX-2 (16, 22, 40).
    ("psa hunyuan1.5 preset grid, 5-row edge, cut frames", (7, 13, 32), (3, 8, 16), 0, torch.bfloat16, 128,
     "heads_first"),
    ("psa wan2.2 5b preset tile 2x8x8, 6-row edge", (5, 14, 16), (2, 8, 8), 0, torch.bfloat16, 128, "blhd"),
    ("psa wan2.1 1.3b preset tile 3x8x8, 6-row and 4-column edges", (6, 14, 20), (3, 8, 8), 0, torch.bfloat16, 128,
     "blhd"),
    ("psa ltx2 preset tile 2x4x8, 2-row edge", (4, 10, 16), (2, 4, 8), 0, torch.bfloat16, 128, "blhd"),
]

# (name, L, grid, dtype, head dim, layout, estimator)
SOL_CASES = [
    ("sol 3D tiles, padded grid, text sinks", 6 * 15 * 32 + 256, (6, 15, 32), torch.bfloat16, 128, "single_block",
     "exact"),
    ("sol 3D tiles, fp16 d64", 4 * 16 * 16, (4, 16, 16), torch.float16, 64, "heads_first", "diag"),
    ("sol row-major, ragged tail", 4133, None, torch.bfloat16, 128, "blhd", "diag"),
]


# Cases built again with int8 and with fp8 exact blocks: both loops (TMA boxes and the pointer
# loop), text blocks, padding, fp16 and d 64, a view of a fused qkv, every shipped preset's tile,
# Sol's pooled term, row-major blocks.
QUANTIZED_CASES = ("psa wan720p tile, padded grid", "psa wan720p tile, 5-row edge (edge cover)",
                   "psa hunyuan single block, text", "psa hunyuan768p tile, fp16 d64",
                   "psa 30-token tiles", "psa hunyuan1.5 preset grid, 5-row edge, cut frames",
                   "psa wan2.2 5b preset tile 2x8x8, 6-row edge",
                   "psa wan2.1 1.3b preset tile 3x8x8, 6-row and 4-column edges",
                   "psa ltx2 preset tile 2x4x8, 2-row edge",
                   "sol 3D tiles, padded grid, text sinks", "sol 3D tiles, fp16 d64",
                   "sol row-major, ragged tail")
PRECISION_SUFFIXES = {"bf16": "", "int8": ", int8", "fp8": ", fp8"}
assert set(QUANTIZED_CASES) <= {case[0] for case in PSA_CASES + SOL_CASES}, \
    "QUANTIZED_CASES names a case that does not exist"
# The kernels an fp8 launch gives float8e4nv codes to (the others are as in int8).
FP8_KERNELS = ("_block_sparse_kernel", "_quantize_keys_kernel")

KERNELS = ((portable, "_block_sparse_kernel"), (hopper_loop, "_ws_block_sparse_kernel"),
           (sol_gpu_routing, "_pool_kernel"), (sol_gpu_routing, "_route_kernel"),
           (id_lists, "_lists_from_bits_kernel"), (launch_order, "_heaviest_first_kernel"),
           (pair_streams, "_pair_steps_kernel"), (quantize, "_key_sums_kernel"), (quantize, "_quantize_keys_kernel"))


def capture_launches(config, precisions=tuple(PRECISION_SUFFIXES)):
    """Every kernel launch of the cases above under ``config`` in ``precisions``: [(case name,
    kernel, args, kw)]."""
    originals = {name: getattr(mod, name) for mod, name in KERNELS}
    captured = {name: CapturedLaunch(fn) for name, fn in originals.items()}
    for mod, name in KERNELS:
        setattr(mod, name, captured[name])
    launches = []
    precisions = [(PRECISION_SUFFIXES[p], p) for p in precisions]
    try:
        for (suffix, precision), (name, grid, tile, extra, dtype, D, layout) in itertools.product(precisions,
                                                                                                 PSA_CASES):
            if precision != "bf16" and name not in QUANTIZED_CASES:
                continue
            L = grid[0] * grid[1] * grid[2] + extra
            q, k, v = qkv(1, L, 2, D, dtype, layout)
            kernels.psa_attention(q, k, v, grid=grid, params=PSA_PARAMS, tile=tile, extra_tokens=extra,
                                  config=config, precision=precision)
            launches += [(name + suffix, captured[n], *c) for n in captured for c in captured[n].calls]
            for c in captured.values():
                c.calls.clear()
        for (suffix, precision), (name, L, grid, dtype, D, layout, estimator) in itertools.product(precisions,
                                                                                                  SOL_CASES):
            if precision != "bf16" and name not in QUANTIZED_CASES:
                continue
            q, k, v = qkv(1, L, 2, D, dtype, layout)
            kernels.sol_attention(q, k, v, beta=1.0, grid=grid, estimator=estimator, config=config,
                                  precision=precision)
            launches += [(name + suffix, captured[n], *c) for n in captured for c in captured[n].calls]
            for c in captured.values():
                c.calls.clear()
    finally:
        for mod, name in KERNELS:
            setattr(mod, name, originals[name])
    return launches


def fp8_allowed(config) -> bool:
    """Whether ``precision`` takes "fp8" on this launch row."""
    try:
        check_fp8_row(config)
    except ValueError:
        return False
    return True


def precision_of(case: str) -> str:
    """The precision a case name's suffix says (none: bf16)."""
    return next((p for p, suffix in PRECISION_SUFFIXES.items() if suffix and case.endswith(suffix)), "bf16")


def triton_refusal(exc: Exception):
    """Triton's sentence when a launch failed because the architecture has no float8e4nv, else None."""
    match = re.search(r"type fp8e4nv not supported in this architecture\.?(?: The supported fp8 dtypes are \([^)]*\))?",
                      str(exc))
    return match.group(0) if match else None


def ptx_instructions(ptx: str) -> collections.Counter:
    """The instructions of a PTX text, counted, with what a harmless change renumbers dropped:
    register numbers and counts, labels, comments, ``.loc`` lines and the debug sections."""
    counts = collections.Counter()
    for line in ptx.split(".section\t.debug")[0].splitlines():
        line = line.split("//")[0].strip()
        if not line or line in ("{", "}") or line.endswith(":") or line.startswith((".loc", ".file")):
            continue
        line = re.sub(r"%[a-z]+\d+", "%r", " ".join(line.split()))
        line = re.sub(r"<\d+>", "<n>", line)  # register declarations: how many, not which
        counts[re.sub(r"\$L__\w+", "$L", line)] += 1
    return counts


def tensor_core_instructions(counts) -> list[str]:
    """The distinct tensor-core instructions of counted PTX (``ptx_instructions``), operands dropped."""
    return sorted({i.split()[0] for i in counts if i.startswith(("mma.sync", "wgmma.mma_async", "tcgen05.mma"))})


def compare_instructions(before: dict, after: dict) -> list[str]:
    """One line per launch of ``after``: whether its instructions equal ``before``'s."""
    lines = []
    for key, new in after.items():
        old = before.get(key)
        if old is None:
            lines.append(f"new       {key}")
            continue
        old, new = collections.Counter(old), collections.Counter(new)
        added, removed = new - old, old - new
        if not added and not removed:
            lines.append(f"same      {key}")
        else:
            shown = ", ".join([f"+{c} {i}" for i, c in list(added.items())[:3]]
                              + [f"-{c} {i}" for i, c in list(removed.items())[:3]])
            lines.append(f"differs   {key}: +{sum(added.values())} / -{sum(removed.values())} instructions ({shown})")
    return lines


def parse_archs(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        m = re.fullmatch(r"sm_(\d+)", part.strip())
        if not m or int(m.group(1)) not in SHARED_MEMORY_LIMIT:
            raise ValueError(f"{part.strip()!r} is not one of {DEFAULT_ARCHS}")
        out.append(int(m.group(1)))
    return out


def write_table(path, table):
    """The ``--json`` table, one launch per line (a reviewable diff when a launch changes)."""
    rows = table["rows"]
    head = {k: v for k, v in table.items() if k != "rows"}
    with open(path, "w") as f:
        f.write("{\n" + "".join(f" {json.dumps(k)}: {json.dumps(v)},\n" for k, v in head.items()) + ' "rows": [\n')
        f.write(",\n".join("  " + json.dumps(row) for row in rows) + "\n ]\n}\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/compile_kernels.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default=DEFAULT_ARCHS, help=f"comma-separated targets (default {DEFAULT_ARCHS})")
    ap.add_argument("--json", help="also write the table to this file")
    ap.add_argument("--ptx", help="also write every launch's counted PTX instructions to this file")
    ap.add_argument("--ptx-against", help="compare every launch's PTX instructions with this --ptx file")
    ap.add_argument("--run-on", help="compile every row for this architecture (a row forced on that GPU), e.g. sm_90")
    args = ap.parse_args(argv)
    try:
        archs = parse_archs(args.arch)
    except ValueError as e:
        ap.error(f"--arch: {e}")
    run_on = None
    if args.run_on:
        try:
            [run_on] = parse_archs(args.run_on)
        except ValueError as e:
            ap.error(f"--run-on: {e}")
    before = None
    if args.ptx_against:
        try:
            with open(args.ptx_against) as f:
                before = json.load(f)["launches"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            ap.error(f"--ptx-against {args.ptx_against}: not a --ptx file ({type(e).__name__}: {e})")
    instructions = {}
    # The launchers refuse CPU tensors unless interpreting; here they only build the launches.
    checks.kernel_device_ok = lambda device: True
    failures, rows = 0, []
    print(f"Triton {triton.__version__}", flush=True)
    for cap in archs:
        config = ARCHITECTURES[divmod(cap, 10)]
        target = run_on or cap
        limit = SHARED_MEMORY_LIMIT[target]
        seen = set()
        fp8_runs = fp8_allowed(config)
        launches = [(*launch, False) for launch in capture_launches(config, tuple(
            p for p in PRECISION_SUFFIXES if fp8_runs or p != "fp8"))]
        if not fp8_runs:  # what Triton does with the fp8 launches the pack refuses here
            launches += [(*launch, True) for launch in capture_launches(
                dataclasses.replace(config, capability=FP8_MIN_CAPABILITY), ("fp8",))
                if launch[1].fn.__name__ in FP8_KERNELS]
        for case, launch, cargs, kw, refused in launches:
            kernel = launch.fn.__name__
            key = (kernel, case)
            if key in seen:
                continue
            seen.add(key)
            ws = kernel == "_ws_block_sparse_kernel"
            row = {"arch": f"sm_{cap}", "compiled_for": f"sm_{target}", "triton": triton.__version__, "case": case,
                   "kernel": kernel,
                   "precision": precision_of(case),
                   "tma": ws or bool(kw.get("TMA", False)), "warp_specialized": ws, "num_warps": kw.get("num_warps", 4),
                   "num_stages": kw.get("num_stages", 3), "limit": limit}
            try:
                compiled = compile_call(launch.fn, cargs, kw, target)
                if refused:
                    failures += 1
                    row["error"] = "compiled, though precision refuses fp8 on this architecture"
                    print(f"FAIL sm_{cap} {kernel} {case}: {row['error']}", flush=True)
                    rows.append(row)
                    continue
                row.update(shared=compiled.metadata.shared, **resource_usage(compiled.asm["cubin"]))
                row["programs_per_sm"] = programs_per_sm(row["shared"], row["registers"], row["num_warps"],
                                                         ARCHITECTURES[divmod(target, 10)])
                counts = ptx_instructions(compiled.asm["ptx"])
                row["mma"] = tensor_core_instructions(counts)
                instructions[f"sm_{cap} {kernel} {case}"] = counts
                row["fits"] = row["shared"] <= limit
                failures += not row["fits"]
                print(f"{'ok  ' if row['fits'] else 'FAIL'} sm_{cap} {kernel:<21} {case}: TMA={row['tma']} WS={ws} "
                      f"shared {row['shared']} of {limit} bytes, {row['registers']} registers, "
                      f"stack {row['stack_bytes']} bytes, {row['programs_per_sm']} an SM"
                      + (f", {' '.join(row['mma'])}" if row["mma"] else ""),
                      flush=True)
            except Exception as exc:  # report every case, fail at the end
                reason = triton_refusal(exc) if refused else None
                if reason:
                    row["refused_by_triton"] = reason
                    print(f"refused sm_{cap} {kernel:<21} {case}: {reason}", flush=True)
                else:
                    failures += 1
                    row["error"] = traceback.format_exc(limit=3)[-2000:]
                    print(f"FAIL sm_{cap} {kernel} {case}:\n{traceback.format_exc()}", flush=True)
            rows.append(row)
    if args.json:
        write_table(args.json, {"triton": triton.__version__, "quantized_cases": list(QUANTIZED_CASES), "rows": rows})
    if args.ptx:
        with open(args.ptx, "w") as f:
            json.dump({"triton": triton.__version__, "launches": instructions}, f)
    if before is not None:
        for line in compare_instructions(before, instructions):
            print(line, flush=True)
    refusals = sum("refused_by_triton" in row for row in rows)
    print(f"{len(rows) - refusals} launches compiled, {failures} failed; {refusals} fp8 launches refused by Triton "
          "where precision refuses fp8", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
