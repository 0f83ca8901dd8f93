"""Sol's fidelity with each remainder tiling of branch sol-row-bands (run it on that branch:
main has no bands), float32 reference against dense attention; see ../README.md."""
import os, sys, torch, time
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
sys.path.insert(0, ROOT); sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
torch.set_num_threads(2)
import kernels.sol_routing as sr
from kernels.sol_reference import sol_attention_reference
from workload import video_qkv
grid=(9,45,80); H=8
q,k,v,kinds=video_qkv(grid, heads=H, head_dim=64, dtype=torch.float32, seed=5)
L=q.shape[1]; scale=64**-0.5
def dense(q,k,v):
    out=torch.empty_like(q)
    for h in range(H):
        qh,kh,vh=q[0,:,h],k[0,:,h],v[0,:,h]
        for r in range(0,L,4096):
            out[0,r:r+4096,h]=torch.softmax(qh[r:r+4096]@kh.T*scale,-1)@vh
    return out
ref=dense(q,k,v)
def rel(a,b): return ((a-b).norm()/b.norm()).item()
variants={"uniform":((45,(1,8,8)),),
          "D_248_818":((40,(1,8,8)),(4,(2,4,8)),(1,(8,1,8))),
          "D_248_1164":((40,(1,8,8)),(4,(2,4,8)),(1,(1,1,64))),
          "D_248_2132":((40,(1,8,8)),(4,(2,4,8)),(1,(2,1,32)))}
for name in sys.argv[1:]:
    sr.sol_bands=lambda g,t: variants[name]
    for beta in [1.0,1.2]:
        t0=time.time()
        out,st=sol_attention_reference(q,k,v,beta=beta,grid=grid,return_stats=True)
        print(name, sr.sol_layout(L,grid).n_blocks, beta, f"density {st['density'].mean():.4f} relL2 {rel(out,ref):.4f} ({time.time()-t0:.0f}s)", flush=True)
