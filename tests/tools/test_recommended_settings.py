"""README.md's "Recommended settings" table is tools/recommended_settings.py's, and every
shipped workflow follows exactly one of its rows (that its patch nodes use the row's values
is checked against the real node definitions in tests/comfyui/test_workflows.py)."""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))

import recommended_settings as rs  # noqa: E402


def test_readme_table_is_the_recommendations():
    readme = (REPO / "README.md").read_text()
    table = rs.readme_table()
    assert table in readme, ("README.md's 'Recommended settings' table differs from tools/recommended_settings.py; "
                             f"`python tools/recommended_settings.py` prints it:\n{table}")


def test_every_shipped_workflow_follows_one_row():
    shipped = sorted(p.name for p in (REPO / "workflows").glob("*.json"))
    listed = sorted(w for row in rs.RECOMMENDED for w in row.workflows)
    assert listed == shipped
    for name in shipped:
        rs.for_workflow(name)  # exactly one row


def test_a_workflow_takes_the_low_end_of_a_range():
    row = rs.for_workflow("wan2.1_t2v_14B_720p_sol_attn.json")
    assert row.settings["target_sparsity"] == (0.85, 0.90)
    assert row.workflow_widgets()["target_sparsity"] == 0.85
    assert "`target_sparsity` 0.85–0.90" in row.settings_text()
