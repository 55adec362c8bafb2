"""The text of an export document: JSON with one line per tensor and per operator, so that plan
files diff well (as graph files do)."""

from __future__ import annotations

import json
from typing import Any


def to_text(doc: dict[str, Any]) -> str:
    """``doc`` as JSON: scalars and the mesh on one line each, then one line per entry of every
    dict-valued field."""
    lines = []
    for key, value in doc.items():
        if isinstance(value, dict) and key != "mesh":
            items = [f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in value.items()]
            body = "{\n" + ",\n".join(items) + "\n  }" if items else "{}"
            lines.append(f"  {json.dumps(key)}: {body}")
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"
