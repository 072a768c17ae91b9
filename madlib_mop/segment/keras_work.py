"""A worker session's answers to the Keras questions of a calling session
(`runtime.model_facts`): the caller sends the configurations, never code, and gets shapes,
sizes and step-0 states back.  The functions read no table and run as the worker session's
role (the caller's)."""

from __future__ import annotations

import json
from typing import Any

from madlib_mop.json_values import json_value
from madlib_mop.runtime import model_facts as facts
from madlib_mop.runtime.tf_runtime import import_tensorflow


def model_facts(plpy: Any, request: Any) -> str:
    request = json_value(request)
    import_tensorflow(request.get("threads"))
    return json.dumps(facts.facts(request))


def initial_states(plpy: Any, request: Any, weights: list[bytes | None] | None,
                   token: str | None) -> dict:
    request = json_value(request)
    import_tensorflow(request.get("threads"))
    states, sizes = facts.initial_states(request, weights, token)
    return {"states": states, "sizes": sizes}
