"""PSA mask search inside an ordinary ComfyUI sampling run: the q, k, v of the video
self-attention are only there while a sampler runs, so the search measures them there.

:class:`SearchMethod` is the method strategy of a dispatcher (:class:`~.dispatch.SparseAttention`)
whose override always returns the dense attention — the workflow's own video is unchanged —
and, for every video self-attention call of the chosen steps, feeds q, k, v to the library's
``PSASearchAccumulator`` (every candidate mask evaluated against that call's dense output,
per layer, head and step bucket). At the end of a sampling run the loss table is written as
safetensors (``LossTable.save``) to ``models/psa_loss_tables/<name>.safetensors``; with
``accumulate`` an existing table of the same name is merged (``LossTable.merge``: one run per
prompt adds up). Optionally each evaluated call's q/k/v is saved for the offline search CLI to
``models/psa_qkv_samples/<name>/``, after a size estimate is logged, and only when the
estimate plus the samples already in that folder fit ``qkv_max_gb`` (the cap is on the
folder, which runs with ``accumulate`` keep filling).

Units: the accumulator's ``step`` is the denoising progress step / total steps in [0, 1)
(the unit of preset step buckets), computed on the full schedule (KSamplerAdvanced splits
included).

An existing table that cannot be extended never drops the run: one that cannot be read
(corrupt, not a loss table) is moved aside to ``<name>.corrupt-<time>.safetensors``, one made
for another grid, tile, candidate set or model to ``<name>.replaced-<time>.safetensors``; the
new table is written and the run summary (``search.warnings``), the log and the ComfyUI
frontend (text on the node being executed, :func:`show_in_ui`) say so. Nothing is written
through a symbolic link (the library refuses): a link in place of the table or of the q/k/v
folder is refused, and the refusal reported the same way. So are Q/K/V samples that are not
written (over ``qkv_max_gb``, a file in place of the folder, a failed write: ``search.qkv_refused``
says why; the calls are evaluated all the same). A cancelled run (ComfyUI's interrupt,
which the guards here let through) writes no table.
"""
from __future__ import annotations

import logging
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Optional

from ._kernels import kernels
from .calls import kernel_inputs, tokens_of
from .config import PatchConfig, parse_block_list, parse_tile
from .dispatch import SparseAttention
from .policy import Dense, is_cancel, progress, self_attention_refusal, video_span
from .presets import model_fingerprint, preset_family
from .widgets import parse_float

log = logging.getLogger("sparse_video_attention")

TABLES_SUBFOLDER = "psa_loss_tables"
QKV_SUBFOLDER = "psa_qkv_samples"
# the names move_aside gives: kept for the user to look at or delete, never offered by Select
SET_ASIDE = re.compile(r".*\.(?:corrupt|replaced)-[0-9]{8}-[0-9]{6}(?:-[0-9]+)?\.safetensors", re.ASCII)
MAX_CANDIDATES = 4096  # the widget's maximum; candidates × blocks² also meets the library's mask size limit


@dataclass(frozen=True)
class SearchConfig:
    name: str
    tile: tuple
    steps: tuple               # parsed step ranges (config.parse_block_list); () = all
    steps_text: str
    bucket_edges: tuple
    max_candidates: Optional[int]
    query_tiles: Optional[int]
    rows_per_tile: Optional[int]
    seed: int
    accumulate: bool
    save_qkv: bool
    qkv_max_gb: float


def make_search_config(name="psa_search", tile="3,8,16", steps="", bucket_edges="",
                       max_candidates=128, query_tiles=32, rows_per_tile=32, seed=0,
                       accumulate=True, save_qkv=False, qkv_max_gb=20.0) -> SearchConfig:
    """Validate the search node's widgets; errors name the widget."""
    kernels.check_preset_name(name, "table_name")
    t = parse_tile(tile, "tile")
    if t is None:
        raise ValueError("tile: the search needs a PSA tile bt,bh,bw in tokens, e.g. \"3,8,16\"")
    step_ranges = parse_block_list(steps, "steps", "step")
    try:
        edges = tuple(parse_float(x, "bucket_edges")
                      for x in re.split(r"[,\s]+", str(bucket_edges).strip()) if x)
    except ValueError:
        raise ValueError(f"bucket_edges: expected progress values in (0, 1) separated by "
                         f"commas, e.g. \"0.5\", got {kernels.shown(bucket_edges)}") from None
    edges = tuple(kernels.check_bucket_edges(edges, "bucket_edges"))
    ints = {}
    for key, v, lo, hi in (("max_candidates", max_candidates, 1, MAX_CANDIDATES),
                           ("query_tiles", query_tiles, 0, None), ("rows_per_tile", rows_per_tile, 0, None),
                           ("seed", seed, 0, None)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
            rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise ValueError(f"{key}: expected a whole number {rng}, got {kernels.shown(v)}")
        ints[key] = v
    if not isinstance(qkv_max_gb, (int, float)) or not qkv_max_gb >= 0:
        raise ValueError(f"qkv_max_gb: expected a number >= 0, got {kernels.shown(qkv_max_gb)}")
    return SearchConfig(name=name, tile=t, steps=step_ranges, steps_text=str(steps),
                        bucket_edges=edges, max_candidates=ints["max_candidates"],
                        query_tiles=ints["query_tiles"] or None,
                        rows_per_tile=ints["rows_per_tile"] or None, seed=ints["seed"],
                        accumulate=bool(accumulate), save_qkv=bool(save_qkv),
                        qkv_max_gb=float(qkv_max_gb))


def resolve_steps(ranges, total: int) -> frozenset:
    """Step indices of ``ranges`` in a schedule of ``total`` steps (negative from the end;
    indices outside the schedule are dropped). ``()`` means every step."""
    if not ranges:
        return frozenset(range(total))
    out = set()
    for a, b in ranges:
        ra = a + total if a < 0 else a
        rb = b + total if b < 0 else b
        out.update(i for i in range(ra, rb + 1) if 0 <= i < total)
    return frozenset(out)


def _models_path(sub: str) -> str:
    """The first folder registered for ``models/<sub>``."""
    import folder_paths
    return folder_paths.get_folder_paths(sub)[0]


def _folder(sub: str) -> str:
    """:func:`_models_path`, created."""
    path = _models_path(sub)
    os.makedirs(path, exist_ok=True)
    return path


def _bytes_in(folder: str) -> int:
    """Bytes of the regular files directly in ``folder`` (links not followed)."""
    with os.scandir(folder) as entries:
        return sum(e.stat(follow_symlinks=False).st_size for e in entries if e.is_file(follow_symlinks=False))


def register_folders() -> None:
    """Register models/psa_loss_tables and models/psa_qkv_samples with folder_paths."""
    from .presets import register_models_subfolder
    register_models_subfolder(TABLES_SUBFOLDER, (".safetensors",))
    register_models_subfolder(QKV_SUBFOLDER, (".safetensors",))


def patch_model_for_search(model, search: SearchConfig):
    """A clone of ``model`` whose sampling runs feed the PSA mask search (the output stays
    dense). Raises ValueError for a model family the pack has no adapter for."""
    from .adapters import adapter_for
    from .patching import install
    dm = model.get_model_object("diffusion_model")
    adapter = adapter_for(dm)
    if adapter is None:
        raise ValueError(f"model: {type(dm).__name__} is not a supported video model (Wan, "
                         "HunyuanVideo, LTX-Video, LTX-2); nothing to search")
    name = type(model.model).__name__ if hasattr(model, "model") else ""
    config = PatchConfig(method="search", dense_blocks=(), warmup=0.0)
    method = SearchMethod(search, name or type(adapter).__name__)
    return install(model, SparseAttention(config, adapter, adapter.info(dm), method))


def table_path(name: str) -> str:
    return os.path.join(_folder(TABLES_SUBFOLDER), f"{name}.safetensors")


def move_aside(path: str, why: str) -> str:
    """Rename ``path`` (a table that cannot be extended) to ``<stem>.<why>-<time>.safetensors``
    beside it, without overwriting anything; returns the new path."""
    stem = path[: -len(".safetensors")] if path.endswith(".safetensors") else path
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = f"{stem}.{why}-{stamp}.safetensors"
    n = 1
    while os.path.lexists(aside):
        n += 1
        aside = f"{stem}.{why}-{stamp}-{n}.safetensors"
    os.replace(path, aside)  # renames a link itself, never its target
    return aside


def show_in_ui(text: str) -> bool:
    """Show ``text`` under the node being executed in the ComfyUI frontend (its progress
    text); False when there is no server or no executing node (scripts, tests)."""
    server = sys.modules.get("server")  # only ComfyUI's own, never imported here
    prompt_server = getattr(getattr(server, "PromptServer", None), "instance", None)
    try:
        from comfy_execution.utils import get_executing_context
    except ImportError:
        return False
    ctx = get_executing_context()
    if prompt_server is None or ctx is None:
        return False
    prompt_server.send_progress_text(text, ctx.node_id)
    return True


class SearchMethod:
    """The search strategy of a dispatcher (see module docstring). One per "PSA Mask Search"
    output; ``d`` in its methods is the dispatcher."""
    name = "search"
    runs_sparse = False
    preset = None

    def __init__(self, search: SearchConfig, model_name: str):
        self.search = search
        self.model_name = model_name
        self.start_run(None)

    def fresh(self) -> "SearchMethod":
        return SearchMethod(self.search, self.model_name)

    def meta(self) -> dict:
        return {"search": {"table_name": self.search.name, "tile": list(self.search.tile)}}

    def start_run(self, d) -> None:
        self.acc = None
        self.acc_key = None
        self.pbar = None
        self.evaluated = 0
        self.qkv_dir = None
        self.qkv_files = 0
        self.qkv_bytes = 0
        self.qkv_refused = ""
        self.run_id = time.strftime("%Y%m%d-%H%M%S")
        self.warnings = []  # this run's problems with its table or samples (_warn)

    # ------------------------------------------------------------------ run
    def finish_run(self, d, summary: dict) -> None:
        info = summary["search"] = {
            "table_name": self.search.name, "evaluated_calls": self.evaluated, "table": None,
            "qkv_dir": self.qkv_dir, "qkv_files": self.qkv_files, "qkv_bytes": self.qkv_bytes}
        if self.qkv_refused:
            info["qkv_refused"] = self.qkv_refused
        try:
            self.write_table(d, info)
        except Exception as e:  # never fail the workflow after its video is done
            if is_cancel(e):
                raise
            info["error"] = f"{type(e).__name__}: {e}"
            self._warn(f"could not write the loss table ({type(e).__name__}: {e})")
        if self.warnings:
            info["warnings"] = self.warnings

    def _warn(self, text: str) -> None:
        """A problem with this run's table or samples: in the log, the run summary
        (``search.warnings``) and the frontend."""
        log.warning("[sparse-video-attention] PSA mask search: %s", text)
        self.warnings.append(text)
        show_in_ui(f"PSA Mask Search warning: {text}")

    def _refuse_qkv(self, why: str) -> None:
        """No (more) Q/K/V samples this run, and why."""
        self.qkv_dir = None
        self.qkv_refused = f"{why}; no samples written" if not self.qkv_files else \
            f"{why}; no samples written after the first {self.qkv_files}"
        self._warn(f"Q/K/V samples: {self.qkv_refused}")

    def _steps_this_run(self, d):
        """(the chosen steps, how many of them this sampler call runs), None without a schedule."""
        sc = d.schedule
        if sc is None:
            return None, None
        total = sc.total_steps
        chosen = resolve_steps(self.search.steps, total)
        here = range(sc.offset, sc.offset + len(sc.sigmas) - 1)
        return chosen, sum(1 for i in here if i in chosen)

    def write_table(self, d, info: dict):
        """Write (or extend) this run's loss table; ``info`` is the run summary's ``search``."""
        if self.acc is None:
            log.warning("[sparse-video-attention] PSA mask search: no video self-attention "
                        "call was evaluated in this run; no loss table written")
            return
        table = self.acc.table()
        table.settings.update({
            "family": preset_family(d.info), "model_name": self.model_name,
            "fingerprint": model_fingerprint(d.info), "prompts": 1,
            "steps": self.search.steps_text or "all",
        })
        path = table_path(self.search.name)
        if self.search.accumulate and os.path.isfile(path) and not os.path.islink(path):
            try:
                old = kernels.LossTable.load(path)
            except ValueError as e:  # unreadable: kept aside, this run's table written
                aside = move_aside(path, "corrupt")
                self._warn(f"the existing loss table cannot be read ({e}); moved it to {aside} "
                           "and wrote this run's table")
            else:
                try:
                    if old.settings.get("fingerprint") != table.settings["fingerprint"]:
                        raise ValueError(f"model fingerprint {old.settings.get('fingerprint')} vs "
                                         f"{table.settings['fingerprint']}")
                    merged = old.merge(table)
                    merged.settings = dict(table.settings, prompts=int(old.settings.get("prompts", 1)) + 1)
                    table = merged
                except ValueError as e:
                    aside = move_aside(path, "replaced")
                    self._warn(f"the existing loss table {path} cannot be merged with this run ({e}); "
                               f"moved it to {aside} and wrote this run's table")
        table.save(path)
        info["table"] = path
        info["prompts"] = table.settings["prompts"]
        log.info("[sparse-video-attention] PSA mask search: %d calls evaluated, loss table "
                 "written to %s (%s)", self.evaluated, path, table.summary())

    # ------------------------------------------------------------------ the override
    def attend(self, d, func, args, kwargs, call, in_video: bool):
        """The override's answer to one call: the dense output, and the call evaluated."""
        out = d.dense(func, args, kwargs)   # the workflow's own output stays dense
        verdict = self.plan(d, call)
        if not isinstance(verdict, Dense):
            try:
                verdict = self.run(d, call, verdict)
            except Exception as e:  # never crash a workflow
                if is_cancel(e):
                    raise
                verdict = Dense("search_error", f"{type(e).__name__}: {e}")
        d.log.note(d.stats, verdict.reason, verdict.detail)
        d.count(verdict.reason)
        return out

    def plan(self, d, call):
        """The video tokens of a call to evaluate (a :class:`~.calls.VideoSpan`), else why it
        is not evaluated (a :class:`~.policy.Dense` reason)."""
        refusal = self_attention_refusal(call, d.fwd)
        if refusal is not None:
            return refusal
        chosen, _ = self._steps_this_run(d)
        if chosen is not None and d.fwd.step is not None and d.fwd.step not in chosen:
            return Dense("search_step")
        if call.scale is not None or call.enable_gqa:
            return Dense("search_call_options")
        lq = tokens_of(call.q, call.skip_reshape)
        span = video_span(d.adapter, lq, d.fwd)
        if span is None:
            return Dense("grid", f"{lq} tokens, latent grid {d.fwd.grid}")
        return span

    def run(self, d, call, span):
        """Evaluate the candidate masks on the call (and save its q/k/v)."""
        q4, k4, v4 = kernel_inputs(call, span)
        grid, extra = span.grid, span.seq_len - span.count
        key = (grid, extra, q4.shape[2])
        if self.acc is None:
            self._start(d, key, q4)
        elif key != self.acc_key:
            return Dense("search_grid", f"first call {self.acc_key}, this call {key}")
        at = progress(d.fwd)
        block = d.fwd.block
        self.acc.add(q4, k4, v4, layer=block, step=at)
        self.evaluated += 1
        if self.qkv_dir is not None:
            name = f"{self.run_id}_s{d.fwd.step if d.fwd.step is not None else 0:04d}_L{block:03d}" \
                   f"_c{self.evaluated:05d}.safetensors"
            try:
                self.qkv_bytes += kernels.save_qkv_sample(os.path.join(self.qkv_dir, name), q4, k4, v4,
                                                          layer=block, step=at, grid=grid,
                                                          extra_tokens=extra)
            except ValueError as e:  # the call itself was evaluated
                self._refuse_qkv(f"writing {name} failed ({e})")
            else:
                self.qkv_files += 1
        if self.pbar is not None:
            self.pbar.update(1)
        return Dense("search_evaluated")

    def _start(self, d, key, q4):
        """First evaluated call of a run: accumulator, progress bar, Q/K/V size check."""
        import comfy.utils
        grid, extra, num_heads = key
        s = self.search
        cands = kernels.candidate_space(grid, s.tile, max_candidates=s.max_candidates, seed=s.seed)
        self.acc = kernels.PSASearchAccumulator(
            grid, s.tile, num_heads, candidates=cands, extra_tokens=extra,
            bucket_edges=s.bucket_edges, query_tiles=s.query_tiles,
            rows_per_tile=s.rows_per_tile, seed=s.seed)
        self.acc_key = key
        _, steps_here = self._steps_this_run(d)
        expected = (steps_here if steps_here is not None else 1) * d.info.num_blocks
        self.pbar = comfy.utils.ProgressBar(max(1, expected))
        log.info("[sparse-video-attention] PSA mask search: grid %s, tile %s, %d candidates, "
                 "about %d calls to evaluate", grid, s.tile, cands.shape[0], expected)
        if s.save_qkv:
            per_call = kernels.estimate_sample_bytes(tuple(q4.shape), q4.dtype)
            total = per_call * expected
            folder = os.path.join(_models_path(QKV_SUBFOLDER), s.name)  # created when samples fit
            log.info("[sparse-video-attention] PSA mask search: Q/K/V samples: about %.2f GB "
                     "(%d calls x %.1f MB) to %s", total / 1e9, expected, per_call / 1e6, folder)
            self._open_sample_folder(folder, total)

    def _open_sample_folder(self, folder: str, estimate: int) -> None:
        """Set ``qkv_dir`` to ``folder`` when this run's ``estimate`` (bytes) plus the samples
        already there fit ``qkv_max_gb`` and the folder can be written; else say why not."""
        cap = self.search.qkv_max_gb
        if os.path.islink(folder):
            return self._refuse_qkv(f"{folder} is a symbolic link, never written through")
        if os.path.lexists(folder) and not os.path.isdir(folder):
            return self._refuse_qkv(f"{folder} is a file, not a folder (move it away)")
        try:
            present = _bytes_in(folder) if os.path.isdir(folder) else 0
            if estimate + present > cap * 1e9:
                return self._refuse_qkv(f"this run's estimated {estimate / 1e9:.3g} GB plus the "
                                        f"{present / 1e9:.3g} GB already in {folder} exceeds qkv_max_gb={cap:g}")
            os.makedirs(folder, exist_ok=True)
        except OSError as e:
            return self._refuse_qkv(f"cannot use the folder {folder} ({e.strerror or type(e).__name__})")
        self.qkv_dir = folder
