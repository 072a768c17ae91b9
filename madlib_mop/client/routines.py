"""The extension's routines as the server describes them (pg_proc), and the statement that
calls one with Python arguments in PostgreSQL's named notation."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from madlib_mop.client import frames


@dataclass(frozen=True)
class Routine:
    name: str
    kind: str  # 'f' function, 'p' procedure
    arguments: tuple[tuple[str, str], ...]  # (name, type), input arguments in order
    returns_set: bool
    returns_void: bool


class RoutineCatalog:
    """The routines of the extension installed in `schema`, by name (overloads in order of
    their argument count)."""

    def __init__(self, engine: sa.Engine, schema: str):
        self.engine, self.schema = engine, schema
        self.routines = self._routines()

    def _routines(self) -> dict[str, list[Routine]]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.text(
                "SELECT p.proname, p.prokind, p.proretset, p.prorettype = 'void'::regtype AS void, "
                "  coalesce(p.proargnames, '{}') AS names, "
                "  coalesce(p.proargmodes::text[], '{}') AS modes, "
                "  ARRAY(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) t) AS types "
                "FROM pg_proc p JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid "
                "JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'madlib_mop' "
                "WHERE d.deptype = 'e' AND p.proname NOT LIKE '\\_%' "
                "ORDER BY p.proname, p.pronargs")).all()
        routines: dict[str, list[Routine]] = {}
        for name, kind, retset, void, names, modes, types in rows:
            input_names = [n for k, n in enumerate(names)
                           if not modes or modes[k] in ("i", "b", "v")]
            routines.setdefault(name, []).append(Routine(
                name, kind, tuple(zip(input_names, types)), retset, void))
        return routines

    def help(self, name: str) -> str:
        """The signatures of routine `name`."""
        return "\n".join(
            f"{'CALL ' if r.kind == 'p' else ''}{self.schema}.{name}("
            + ", ".join(f"{a} {t}" for a, t in r.arguments) + ")"
            for r in self.routines.get(name, []))

    def _candidates(self, name: str, args: tuple, kwargs: dict) -> list[Routine]:
        """The signatures of `name` these arguments fit (by count and names)."""
        candidates = [r for r in self.routines.get(name, [])
                      if len(r.arguments) >= len(args) + len(kwargs)
                      and set(kwargs) <= {a for a, _ in r.arguments[len(args):]}]
        if not candidates:
            raise TypeError(f"{self.schema}.{name} takes no such arguments; it has:\n"
                            + (self.help(name) or "(no such routine)"))
        return candidates

    def statement(self, name: str, args: tuple, kwargs: dict) -> tuple[str, dict, Routine]:
        candidates = self._candidates(name, args, kwargs)
        routine = candidates[0]
        # The declared types are cast to when one signature fits (so that a Python int
        # reaches an integer[] parameter); between overloads, the server chooses.
        typed = len(candidates) == 1
        parts, params = [], {}
        types = dict(routine.arguments)
        for k, value in enumerate(args):
            arg, kind = routine.arguments[k]
            parts.append(self._bind(f"a{k}", value, kind if typed else None, params))
        for arg, value in kwargs.items():
            parts.append(f"{frames.quote(arg)} => " + self._bind(arg, value, types[arg] if typed else None, params))
        call = f"{frames.quote(self.schema)}.{frames.quote(name)}({', '.join(parts)})"
        if routine.kind == "p":
            return f"CALL {call}", params, routine
        if routine.returns_set:
            return f"SELECT * FROM {call}", params, routine
        return f"SELECT {call}", params, routine

    @staticmethod
    def _bind(key: str, value: Any, kind: str | None, params: dict) -> str:
        if isinstance(value, (dict, list)) and kind in ("text", "character varying", "json", "jsonb"):
            value = json.dumps(value)  # a grid or parameter list given as Python data
        params[key] = value
        return f"CAST(:{key} AS {kind})" if kind else f":{key}"
