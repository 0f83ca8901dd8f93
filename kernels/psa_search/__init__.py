"""PSA-Search: per-head stripe masks under an error budget, from loss tables.

How a call is evaluated
-----------------------
For one attention call (q, k, v of shape (B, L, H, D), L = T*H*W + extra_tokens) and one
head, the output of *any* block mask is assembled from per-(query row, key block) partial
softmax results, computed once:

    m[r, b] = max_j s[r, j]            over the real keys j of key block b
    l[r, b] = sum_j exp(s[r, j] - m[r, b])
    P[r, b] = sum_j exp(s[r, j] - m[r, b]) v[j]          (a D-vector)

With w[r, b] = exp(m[r, b] - max_b' m[r, b']), the output of a mask A is

    o_A[r] = sum_b A[q(r), b] w[r, b] P[r, b]  /  sum_b A[q(r), b] w[r, b] l[r, b]

and the dense output is the same with A = 1. For the rows of one query block all candidates
come from a single (C × n_blocks) @ (n_blocks × rows·D) product. The extra (non-grid) tokens
form one more column that every candidate keeps.

Subsampling (documented cost knob): per call, ``query_tiles`` query blocks are drawn
uniformly without replacement, and ``rows_per_tile`` real query rows from each (all rows
when the block has fewer). The draw depends only on (seed, layer, step bucket, call number),
never on the process, so a distributed search draws the same rows as a single process.

Loss tables
-----------
Per (layer, step bucket, head, candidate) the table keeps float64 sums: the squared error
``sq_err`` between candidate and dense outputs, ``ref_sq`` the squared dense output, and
``count`` the number of output elements (rows × D). Two losses are read from them:

* ``"mse"``: sq_err / count, the mean squared error of the output ("the L2 loss between the
  outputs of the sparse attention and the full attention"; the default);
* ``"rel"``: sq_err / ref_sq, the same relative to the output's energy (scale-free).

Sparsity of a candidate is ``1 - density`` over block pairs of the padded block grid (the
kernel's work). Selection (the dual interface) only re-reads the table:

* ``select(alpha=α)``: per head, the sparsest candidate with loss <= α (ties: lower loss,
  then lower index); if none qualifies, the lowest-loss candidate.
* ``select(target_sparsity=ρ)``: per head, the lowest-loss candidate with sparsity >= ρ
  (ties: sparser, then lower index); if none reaches ρ, the sparsest candidate.

Candidate space
---------------
:func:`candidate_space` adapts the paper's appendix C.2 to a grid: ``0 < Tw < nT`` and
``0 < Sw < nW`` plus the full widths (Tw = nT, Sw = nH*nW: the SVG and uniform heads),
To ∈ {0, ±1, ±2}, Ts ∈ {1, 2, 3, ∞}, So ∈ {0, ±1}, Ss ∈ {1, 3, 5, 6, nW, nW + 1, ∞}
(strides >= the axis length are ∞). Combinations giving the same block mask are merged
(first in enumeration order wins); anchors (SVG/STA shapes: zero offsets, Ts = ∞,
Ss ∈ {∞, nW}) and the dense mask are always kept, the rest is sampled uniformly with a fixed
seed down to ``max_candidates``; ``extra`` candidates are always added. Every range is an
argument.

Several processes
-----------------
``owned=(layer, head) -> bool`` restricts the heads an accumulator evaluates;
:func:`search_calls` takes attention calls as ``(layer, step, load)`` (:func:`search_samples`
over saved sample files, ``benchmarks/search_bench.py`` over generated q/k/v), assigns
(layer, head) pairs round-robin over the ranks of an initialised ``torch.distributed`` group,
loads a call only on ranks that own one of its heads and sums the tables with ``all_reduce``
(entries of other ranks are exact zeros, so the result equals the single-process one bit for
bit under the same math-library thread settings; note that torchrun sets OMP_NUM_THREADS=1,
which changes CPU float rounding, not the selections in practice).

Searching under torchrun (gloo on CPU, NCCL on GPUs, one GPU per process)::

    torchrun --nproc_per_node 2 -m kernels.psa_search search SAMPLES_DIR --tile 3 8 16 \
        --out wan14b_720p.table.safetensors
    python -m kernels.psa_search select wan14b_720p.table.safetensors --alpha 0.007 \
        --out wan14b_720p.json --name wan14b_720p --family wan2.1 \
        --model-name Wan2.1-T2V-14B --fingerprint 40 40 128 5120 --prompts 2
    python -m kernels.psa_search show wan14b_720p.table.safetensors --sparsity 0.6

Command line: ``python -m kernels.psa_search --help``. Bad input (a missing or unreadable
file, an empty folder, a table or sample that is not one) ends the command with a one-line
``error:`` message and exit status 2.

Files
-----
Loss tables and samples are safetensors files with a JSON header in their metadata. Reading
one checks everything before it is used: the format and version first, then every header
field (grid and tile within the limits of ``kernels.preset_file``/``kernels.layout``, layers,
bucket edges, heads, the known settings) and every tensor (name, dtype, shape, values).
Any problem is a ``ValueError`` that starts with the file's path and names the field, e.g.
``t.safetensors: header.tile[1]: expected an integer in [1, 256], got 0``. Writing runs the
same checks first (``LossTable.save``; ``save_qkv_sample`` refuses NaN/inf values, which a
search could not turn into a readable table), so what is written always reads back; it goes
through ``kernels._files.write_file`` (never through a symbolic link; atomic replace). A call
whose dense output is not finite is refused by ``PSASearchAccumulator.add`` and not counted.
"""
from .accumulator import PSASearchAccumulator
from .candidates import candidate_space
from .loss_table import LossTable, Selection
from .samples import estimate_sample_bytes, load_qkv_sample, read_sample_header, save_qkv_sample
from .search import search_calls, search_samples, write_preset

__all__ = [
    "candidate_space",
    "PSASearchAccumulator",
    "LossTable",
    "Selection",
    "search_calls",
    "search_samples",
    "write_preset",
    "save_qkv_sample",
    "load_qkv_sample",
    "read_sample_header",
    "estimate_sample_bytes",
]
