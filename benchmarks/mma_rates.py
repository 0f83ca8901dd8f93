"""The tensor-core rate of Triton's ``tl.dot`` per operand type on this GPU, as Triton compiles it
here: ``wgmma`` on Hopper, or, with ``DISABLE_MMA_V3=1`` in the environment, ``mma.sync``, the
instruction the pointer loop runs on sm_80, sm_86, sm_89 and sm_120. A launch row forced on
an H100 (``bench_kernels --loops sm89``) compiles for the H100 and so runs ``wgmma``; under
``DISABLE_MMA_V3=1`` it runs the users' instruction, and this script says what that
instruction's 8-bit rate is against bf16 on this GPU, i.e. how far the forced rows can show
an 8-bit gain at all.

Each program loads one (BM × BK) and one (BK × BN) tile and accumulates their product
``--iters`` times; the result is checked against PyTorch's product (exact for int8, whose
int32 sums wrap alike), and each row records the MMA instruction found in the PTX. The rate
comes from the time of ``2 · iters`` products less that of ``iters``, which leaves the launch
and the loads out and shows when a compiler computed the loop-invariant product once and only
added it up (it did for fp8 under ``DISABLE_MMA_V3=1`` on an H100 with ``acc += tl.dot(a, b)``):
a row whose time does not grow by half with the doubled chain gets no rate. Without
CUDA it runs through Triton's interpreter (TRITON_INTERPRET=1): a check of the kernel on a few
programs, not a timing (with fp16, int8 and fp8: Triton 3.8's interpreter multiplies bf16
tiles wrongly in ``tl.dot``).

    python3 benchmarks/mma_rates.py --out mma_rates_wgmma.json
    DISABLE_MMA_V3=1 TRITON_CACHE_DIR=/tmp/mma_sync_cache python3 benchmarks/mma_rates.py \\
        --out mma_rates_mma_sync.json
"""
from __future__ import annotations

import argparse
import datetime
import os
import re
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.kernel_device import kernel_device  # noqa: E402
from benchmarks.results_file import write_results  # noqa: E402

# (BM, BN, BK, warps): Sol's 64-row query tile against 128 keys of d 128, and PSA's 128 rows.
SHAPES = ((64, 128, 128, 4), (128, 128, 128, 8))
OPERANDS = {"bf16": torch.bfloat16, "fp16": torch.float16, "int8": torch.int8, "fp8": torch.float8_e4m3fn}


@triton.jit
def _repeated_dot_kernel(a_ptr, b_ptr, out_ptr, iters, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                         INT_ACC: tl.constexpr):
    """out[program] = iters · (a @ b), one MMA chain per program."""
    offs_m = tl.arange(0, BM)
    offs_n = tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    a = tl.load(a_ptr + offs_m[:, None] * BK + offs_k[None, :])
    b = tl.load(b_ptr + offs_k[:, None] * BN + offs_n[None, :])
    acc = tl.zeros((BM, BN), dtype=tl.int32 if INT_ACC else tl.float32)
    for _ in range(iters):
        acc = tl.dot(a, b, acc, out_dtype=acc.dtype)
    tl.store(out_ptr + tl.program_id(0) * BM * BN + offs_m[:, None] * BN + offs_n[None, :], acc)


def operands(name: str, rows: int, cols: int, device, generator) -> torch.Tensor:
    """Random operands of a type, small enough that fp32 sums of a few hundred products stay exact."""
    if name == "int8":
        return torch.randint(-8, 8, (rows, cols), device=device, dtype=torch.int8, generator=generator)
    x = torch.randint(-4, 5, (rows, cols), device=device, generator=generator).float() / 4
    return x.to(OPERANDS[name])


def mma_instruction(compiled) -> str:
    """The first tensor-core instruction of a compiled kernel's PTX, without its operands."""
    found = re.search(r"\b(wgmma\.mma_async\S*|mma\.sync\S*|tcgen05\.mma\S*)", compiled.asm.get("ptx", ""))
    return found.group(1) if found else "none"


# The doubled chain's time over the single one's below which the products did not run in the
# loop (2 when they all did; 1 when the loop only added a product computed once).
MIN_GROWTH = 1.5


def chain_rate(ms: float, ms_doubled: float, flops: float):
    """Tera-operations a second of the ``flops`` that doubling the chain added, or None when
    the time grew by less than :data:`MIN_GROWTH` (the products did not all run in the loop)."""
    return flops / (ms_doubled - ms) / 1e9 if ms_doubled >= MIN_GROWTH * ms else None


def measure(name, shape, programs, iters, rep_ms, device):
    BM, BN, BK, warps = shape
    g = torch.Generator(device=device).manual_seed(0)
    a, b = operands(name, BM, BK, device, g), operands(name, BK, BN, device, g)
    int_acc = name == "int8"
    out = torch.full((programs, BM, BN), -1, device=device, dtype=torch.int32 if int_acc else torch.float32)

    def run(chain=iters):
        return _repeated_dot_kernel[(programs,)](a, b, out, chain, BM=BM, BN=BN, BK=BK, INT_ACC=int_acc,
                                                 num_warps=warps)

    compiled = run()
    if int_acc:
        expected = (a.cpu().long() @ b.cpu().long() * iters).to(torch.int32)  # wraps as int32 sums do
    else:  # sums of multiples of 1/16 below 2^20 in magnitude: exact in float32 in any order
        expected = (a.cpu().double() @ b.cpu().double() * iters).float()
    equal = bool(torch.equal(out.cpu(), expected.expand(programs, BM, BN)))
    row = {"operands": name, "bm": BM, "bn": BN, "bk": BK, "warps": warps, "programs": programs, "iters": iters,
           "equal_to_torch": equal}
    if device == "cuda":
        ms = triton.testing.do_bench(run, rep=rep_ms, return_mode="median")
        ms_doubled = triton.testing.do_bench(lambda: run(2 * iters), rep=rep_ms, return_mode="median")
        row.update(instruction=mma_instruction(compiled), ms=ms, ms_doubled_chain=ms_doubled,
                   tops=chain_rate(ms, ms_doubled, 2 * BM * BN * BK * iters * programs))
        if row["tops"] is None:
            row["no_rate"] = (f"the doubled chain took {ms_doubled / ms:.2f}x the time, not about 2x: the products "
                              f"did not all run in the loop")
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="results file (JSON)")
    ap.add_argument("--operands", default="bf16,fp16,int8,fp8", help=f"comma separated: {', '.join(OPERANDS)}")
    ap.add_argument("--iters", type=int, default=512, help="products accumulated per program")
    ap.add_argument("--programs", type=int, default=0, help="programs per launch (default: 8 per SM)")
    ap.add_argument("--rep-ms", type=int, default=200)
    args = ap.parse_args(argv)
    names = [x for x in args.operands.split(",") if x]
    unknown = [x for x in names if x not in OPERANDS]
    if unknown or not names:
        ap.error(f"--operands: unknown {unknown or 'none given'}; choose from {', '.join(OPERANDS)}")
    if args.iters < 1 or args.programs < 0:
        ap.error(f"--iters must be positive and --programs not negative, got {args.iters} and {args.programs}")
    device = kernel_device(ap)
    cuda = device == "cuda"
    programs = args.programs or (8 * torch.cuda.get_device_properties(0).multi_processor_count if cuda else 2)
    rows = []
    for shape in SHAPES:
        base = None
        for name in names:
            try:
                row = measure(name, shape, programs, args.iters, args.rep_ms, device)
            except Exception as exc:  # an operand type this GPU or Triton refuses is recorded
                row = {"operands": name, "bm": shape[0], "error": f"{type(exc).__name__}: {exc}"[:300]}
            if row.get("tops"):
                base = row["tops"] if name == "bf16" else base
                row["rate_vs_bf16"] = row["tops"] / base if base else None
            print(row, flush=True)
            rows.append(row)
    write_results(args.out, {
        "command": "python3 " + " ".join([os.path.relpath(__file__)] + (argv if argv is not None else sys.argv[1:])),
        "disable_mma_v3": os.environ.get("DISABLE_MMA_V3", ""),
        "started": datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S"),
        "device": torch.cuda.get_device_name() if cuda else "cpu (Triton interpreter)",
        "torch": torch.__version__, "triton": triton.__version__,
        "rows": rows})
    return 0 if all(r.get("equal_to_torch") for r in rows if "error" not in r) else 1


if __name__ == "__main__":
    raise SystemExit(main())
