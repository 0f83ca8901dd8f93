"""Write the PTX and SASS of the warp-specialised loop's launches for one architecture (CPU only).

    PYTHONPATH=.cache/triton-3.6.0 python benchmarks/results/sol_floors_h200/call3_solo/dump_sass.py \
        --arch sm_90 --out /tmp/sass [--case sol]

Session 17 read solo's spills with it (49 STL, 62 LDL at d 128, some inside the step loops;
NOTES #51). It compiles the tree's kernels/ as tools/compile_kernels.py does."""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 4))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import compile_kernels as ck  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--out", required=True)
    ap.add_argument("--case", default="", help="only the cases whose name holds this text")
    args = ap.parse_args(argv)
    cap = ck.parse_archs(args.arch)[0]
    ck.checks.kernel_device_ok = lambda device: True
    os.makedirs(args.out, exist_ok=True)
    disasm = os.path.join(os.path.dirname(ck.triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    for case, launch, cargs, kw in ck.capture_launches(ck.ARCHITECTURES[divmod(cap, 10)]):
        if launch.fn.__name__ != "_ws_block_sparse_kernel" or args.case not in case:
            continue
        name = re.sub(r"[^a-z0-9]+", "_", case.lower()).strip("_")
        compiled = ck.compile_call(launch.fn, cargs, kw, cap)
        with open(os.path.join(args.out, name + ".ptx"), "w") as f:
            f.write(compiled.asm["ptx"])
        cubin = os.path.join(args.out, name + ".cubin")
        with open(cubin, "wb") as f:
            f.write(compiled.asm["cubin"])
        sass = subprocess.run([disasm, "-c", cubin], capture_output=True, text=True).stdout
        with open(os.path.join(args.out, name + ".sass"), "w") as f:
            f.write(sass)
        print(f"{case}: {len(sass.splitlines())} SASS lines, {sass.count('STL')} STL, {sass.count('LDL')} LDL")


if __name__ == "__main__":
    main()
