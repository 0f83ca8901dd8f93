"""How the benchmark scripts write their results: JSON whose objects put each field on its own
line and whose lists of objects (the measured rows) put each row on one line, so a results
file stays short and a re-run's diff shows the rows that moved."""
from __future__ import annotations

import json
import os


def results_text(value, indent: str = "") -> str:
    inner = indent + " "
    if isinstance(value, dict) and value:
        fields = (f"{inner}{json.dumps(str(k))}: {results_text(v, inner)}" for k, v in value.items())
        return "{\n" + ",\n".join(fields) + f"\n{indent}}}"
    if isinstance(value, list) and any(isinstance(x, dict) for x in value):
        return "[\n" + ",\n".join(inner + json.dumps(row) for row in value) + f"\n{indent}]"
    return json.dumps(value)


def write_results(path, doc) -> None:
    """Write ``doc`` to ``path`` as :func:`results_text` (``json.load`` reads it back), through
    a temporary file, so a reader never sees half a file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(results_text(doc) + "\n")
    os.replace(tmp, path)
