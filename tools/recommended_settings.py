"""The "Recommended settings" of README.md as data: its one source.

    python tools/recommended_settings.py     # print the README table (paste it into README.md)

Read by tools/make_workflows.py (the Sparse Attention Patch settings of the shipped workflows)
and by the tests: tests/tools/test_recommended_settings.py checks that README.md holds exactly the
table printed here, tests/comfyui/test_workflows.py that every shipped workflow's patch uses its
row's settings (and the node's defaults for every other widget).

A setting is a value or a (low, high) range; a workflow uses the low end of a range (the
README's advice: start there and compare with ``method = dense`` before going higher).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Recommendation:
    models: str
    method: str
    settings: dict                  # widget -> value or (low, high)
    measured: str                   # the README's "measured" column: numbers and the benchmarks/results/ files they come from
    workflows: tuple = ()           # shipped workflows/*.json that follow this row
    shipped_preset: bool = False    # PSA: the shipped preset for the model and resolution
    remark: str = ""                # after the settings, in the README and the workflow notes

    def workflow_widgets(self) -> dict:
        """The patch widgets a shipped workflow sets: method and the settings (low end of a range)."""
        return {"method": self.method,
                **{k: v[0] if isinstance(v, tuple) else v for k, v in self.settings.items()}}

    def settings_text(self, code: str = "`") -> str:
        """The settings as the README writes them (``code`` quotes widget names)."""
        parts = ["shipped preset for the model and resolution"] if self.shipped_preset else []
        for name, value in self.settings.items():
            parts.append(f"{code}{name}{code} {_shown(value)}")
        return ", ".join(parts) + (f" ({self.remark})" if self.remark else "")


def _shown(value) -> str:
    """A value, or a range low–high with both ends to the same decimals (0.85–0.90)."""
    if not isinstance(value, tuple):
        return str(value)
    decimals = max(len(repr(float(v)).split(".")[1]) for v in value)
    return "–".join(f"{v:.{decimals}f}" for v in value)


NOT_MEASURED = "not measured yet"

RECOMMENDED = (
    Recommendation(
        models="Wan 2.1 / 2.2 A14B (t2v, i2v), 720p", method="sol_attn",
        settings={"target_sparsity": (0.85, 0.90), "warmup": 0.2, "dense_blocks": "0"},
        measured="Wan2.1-14B forward 2.13–2.14× (0.85) / 2.39× (0.90) "
                 "(`e2e_comfyui_h200_wan_{no_lists,routing_kernels}.json`)",
        workflows=("wan2.1_t2v_14B_720p_sol_attn.json", "wan2.2_i2v_A14B_two_stage_sol_attn.json")),
    Recommendation(
        models="Wan 2.1 / 2.2 A14B, 720p", method="psa", shipped_preset=True,
        settings={"warmup": 0.2, "dense_blocks": "0"},
        measured="Wan2.1-14B forward 1.85–1.86×, preset 66 % sparse (`e2e_comfyui_h200_wan_no_lists.json`, "
                 "`…_edge_cover*.json`)",
        workflows=("wan2.1_t2v_14B_720p_psa.json",)),
    Recommendation(
        models="Wan 2.1 14B / 2.2 A14B with a distilled 4–8 step LoRA (e.g. lightx2v), 720p", method="sol_attn",
        settings={"target_sparsity": 0.85, "warmup": 0.2, "dense_blocks": "0"},
        remark="warmup counts whole steps, halves up: 0.2 keeps the first step dense at 4–7 steps, "
               "the first 2 at 8; final_dense stays 0",
        measured="Wan2.1-14B forward 2.14× at 0.85 (2.39× at 0.90), CFG batch 2; 4 steps with the first dense "
                 "(or 8 with 2), computed from those forward times like the 50-step column: 1.67× (1.77×) "
                 "(`e2e_comfyui_h200_wan_routing_kernels.json`); not measured with a LoRA or at cfg 1"),
    Recommendation(
        models="Wan 2.2 TI2V 5B (t2v, ti2v), 1280×704", method="sol_attn",
        settings={"target_sparsity": (0.85, 0.90), "warmup": 0.2, "dense_blocks": "0"},
        measured="H100: Wan2.2-TI2V-5B forward 1.57× (0.85) / 1.65× (0.90) (self-attention is half of it; "
                 "`e2e_comfyui_h100_wan22_5b.json`)",
        workflows=("wan2.2_ti2v_5B_720p_sol_attn.json",)),
    Recommendation(
        models="Wan 2.2 TI2V 5B, 1280×704", method="psa", shipped_preset=True,
        settings={"warmup": 0.2, "dense_blocks": "0"},
        measured="H100: Wan2.2-TI2V-5B forward 1.32×, preset 62 % sparse (`e2e_comfyui_h100_wan22_5b.json`)"),
    Recommendation(
        models="HunyuanVideo 720p", method="psa", shipped_preset=True,
        settings={"warmup": 0.2, "dense_blocks": "0"},
        measured="HunyuanVideo-13B forward 2.32–2.35×, preset 70 % sparse "
                 "(`e2e_comfyui_h200_hunyuan_{pair_steps,per_head}.json`)",
        workflows=("hunyuan_video_t2v_720p_psa.json",)),
    Recommendation(
        models="HunyuanVideo 720p", method="sol_attn",
        settings={"target_sparsity": 0.85, "warmup": 0.2, "dense_blocks": "0"},
        remark="text tokens are kept exact",
        measured="HunyuanVideo-13B forward 2.65× at 0.85 (3.11× at 0.90), default 3D tiles "
                 "(`e2e_comfyui_h200_hunyuan_per_head.json`)"),
    Recommendation(
        models="HunyuanVideo 1.5 (t2v, i2v), 720p", method="psa", shipped_preset=True,
        settings={"warmup": 0.2, "dense_blocks": "0"},
        measured="H100: HunyuanVideo 1.5 8.3B forward 2.12×, preset 70 % sparse "
                 "(`e2e_comfyui_h100_hunyuan15.json`)",
        workflows=("hunyuan_video1.5_t2v_720p_psa.json",)),
    Recommendation(
        models="HunyuanVideo 1.5 (t2v, i2v), 720p", method="sol_attn",
        settings={"target_sparsity": 0.85, "warmup": 0.2, "dense_blocks": "0"},
        remark="text, glyph and vision tokens are kept exact",
        measured="H100: HunyuanVideo 1.5 8.3B forward 2.64× at 0.85 (3.09× at 0.90), default 3D tiles "
                 "(`e2e_comfyui_h100_hunyuan15.json`)"),
    Recommendation(
        models="LTX-Video 0.9 / LTX-2 / 2.3 / 2.5", method="sol_attn",
        settings={"target_sparsity": 0.85, "warmup": 0.2, "dense_blocks": "0"},
        measured="LTX-Video 0.9 2B forward 1.26× (self-attention is half of it; "
                 "`e2e_comfyui_h200_ltxv.json`); LTX-2, 2.3 and 2.5 not measured",
        workflows=("ltxv_t2v_sol_attn.json", "ltx2.5_t2v_720p_sol_attn.json")),
    Recommendation(
        models="LTX-2 / 2.3 / 2.5, 720p", method="psa", shipped_preset=True,
        settings={"warmup": 0.2, "dense_blocks": "0"}, measured=NOT_MEASURED),
)


def for_workflow(name: str) -> Recommendation:
    """The row a shipped workflow follows."""
    rows = [r for r in RECOMMENDED if name in r.workflows]
    if len(rows) != 1:
        raise KeyError(f"{name}: {len(rows)} rows of RECOMMENDED list it, expected 1")
    return rows[0]


def readme_table() -> str:
    lines = ["| model | method | settings | shipped workflow | measured |", "|---|---|---|---|---|"]
    for r in RECOMMENDED:
        flows = ", ".join(f"`{w}`" for w in r.workflows) or "–"
        lines.append(f"| {r.models} | `{r.method}` | {r.settings_text()} | {flows} | {r.measured} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(readme_table())
