"""JSON as the package stores and reads it: values with NaN as null (PostgreSQL's json has
no NaN), and json or jsonb values as they come back, text or already decoded (PL/Python
and psycopg give either, by type and driver)."""

from __future__ import annotations

import json
import math
from typing import Any


def finite_json(value: Any) -> str:
    """JSON text of `value` with every NaN or infinite float as null: PostgreSQL's json
    has no such numbers, and a diverged model's metrics must not break what is stored."""
    def finite(item: Any) -> Any:
        if isinstance(item, float):
            return item if math.isfinite(item) else None
        if isinstance(item, dict):
            return {key: finite(v) for key, v in item.items()}
        if isinstance(item, (list, tuple)):
            return [finite(v) for v in item]
        return item
    return json.dumps(finite(value))


def json_value(value: Any) -> Any:
    """A json or jsonb value as Python objects, whether it came as text or already decoded."""
    return json.loads(value) if isinstance(value, (str, bytes)) else value
