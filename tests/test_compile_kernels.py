"""Every kernel launch builds and fits on each GPU architecture users have — checked on the CPU.

The interpreter that runs the kernels elsewhere in CI does not apply Triton's type rules,
layouts or shared-memory limits; tools/compile_kernels.py compiles every launch configuration
the pack makes, with each architecture's launch configuration (kernels/launch_config.py), down
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

ROOT = Path(__file__).resolve().parent.parent
TRITON36 = ROOT / ".cache" / "triton-3.6.0"
ARCHS = ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"]


def compile_all(tmp_path, extra_path=None):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if extra_path:
        env["PYTHONPATH"] = str(extra_path)
    out = tmp_path / "compiled.json"
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "compile_kernels.py"), "--arch", ",".join(ARCHS),
                          "--json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]
    return json.loads(out.read_text()), run.stdout


def check_table(table):
    rows = table["rows"]
    assert {r["arch"] for r in rows} == set(ARCHS)
    assert all(r["fits"] and r["shared"] <= r["limit"] for r in rows), [r for r in rows if not r.get("fits")]
    engine = [r for r in rows if r["kernel"] in ("_block_sparse_kernel", "_ws_block_sparse_kernel")]
    # TMA boxes exactly where the copy engine exists and the configuration takes them; the
    # warp-specialised loop on Hopper only, for every case it takes (30-token tiles make no box;
    # bare 64-key lists run faster on the portable loop: hopper_loop.ws_supported).
    assert {r["arch"] for r in engine if r["tma"]} == {"sm_90", "sm_100"}
    assert {r["arch"] for r in engine if r["warp_specialized"]} == {"sm_90"}
    assert ({r["case"] for r in engine if r["arch"] == "sm_90" and not r["warp_specialized"]}
            == {"psa 30-token tiles", "sol without the pooled term"})
    # HunyuanVideo's single blocks (k heads first, v a view of qkv) still take the TMA path there.
    single = [r for r in engine if "single block" in r["case"] and r["arch"] in ("sm_90", "sm_100")]
    assert len(single) == 2 and all(r["tma"] for r in single)
    assert all(r["registers"] for r in rows)


def test_every_launch_compiles_and_fits_every_architecture(tmp_path):
    table, stdout = compile_all(tmp_path)
    check_table(table)
    assert f"{len(table['rows'])} launches compiled, 0 failed" in stdout


@pytest.mark.skipif(not (TRITON36 / "triton").is_dir(), reason="Triton 3.6 not unpacked: run `make triton36`")
def test_every_launch_compiles_and_fits_with_triton_3_6(tmp_path):
    table, _ = compile_all(tmp_path, TRITON36)
    assert table["triton"] == "3.6.0"
    check_table(table)


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
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    probe = tmp_path / "probe.py"  # @triton.jit needs its source in a file
    probe.write_text(SPECIALIZATION_PROBE)
    run = subprocess.run([sys.executable, str(probe), str(ROOT / "tools")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    signature = run.stdout.split("signature:", 1)[1]
    assert "%row_stride: i32 {tt.divisibility = 16 : i32}" in signature, signature
    assert "%n_rows" not in signature, signature
