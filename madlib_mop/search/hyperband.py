"""Hyperband's schedule, as MADlib's hyperband_schedule computes it (Li et al., JMLR 2018).

R is the most iterations one configuration gets, eta the reduction factor.  With
s_max = floor(log_eta R), bracket s (s_max down to 0) starts n = floor((s_max + 1) / (s + 1))
eta^s configurations at r = R eta^-s iterations; its round i (0 .. s) has
n_i = floor(n eta^-i) configurations trained to r_i = round(r eta^i) iterations in all, and
the best n_{i+1} of them go on.  `skip_last` drops the last rounds of every bracket
(bracket s keeps rounds 0 .. s - skip_last; a bracket left with none is dropped).

MADlib rounds (s_max + 1) / (s + 1) down before multiplying, where the paper takes
ceil((s_max + 1) eta^s / (s + 1)): for R=81, eta=3 the brackets start 81, 27, 9, 6, 5
configurations here and in MADlib, 81, 34, 15, 8, 5 in the paper.  The r_i are the paper's.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from madlib_mop import errors
from madlib_mop.errors import MadlibMopError


@dataclass(frozen=True)
class Rung:
    s: int  # bracket
    i: int  # round within the bracket
    n_i: int  # configurations in the round
    r_i: int  # iterations each has had by the round's end


def s_max(R: int, eta: int) -> int:
    """floor(log_eta R), in integers (a float logarithm misrounds powers of eta)."""
    s, power = 0, eta
    while power <= R:
        s, power = s + 1, power * eta
    return s


def check(R, eta, skip_last, argument: str = "automl_params") -> None:
    for name, value, least in (("R", R, 1), ("eta", eta, 2), ("skip_last", skip_last, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise MadlibMopError(f"{argument}: {name} must be a whole number of at least {least}, "
                                 f"not {value!r}", sqlstate=errors.INVALID_PARAMETER_VALUE,
                                 hint="e.g. 'R=6, eta=3, skip_last=0'")
    if R < eta:
        raise MadlibMopError(f"{argument}: R ({R}) must be at least eta ({eta})",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="R is the most iterations a configuration gets; raise R or lower eta.")
    if skip_last > s_max(R, eta):
        raise MadlibMopError(
            f"{argument}: skip_last ({skip_last}) is more than the rounds of the largest bracket "
            f"({s_max(R, eta)} after the first)", sqlstate=errors.INVALID_PARAMETER_VALUE,
            hint=f"Pass skip_last between 0 and {s_max(R, eta)}.")


def schedule(R: int, eta: int = 3, skip_last: int = 0, argument: str = "automl_params") -> list[Rung]:
    """Every round of every bracket, bracket s_max first."""
    check(R, eta, skip_last, argument)
    top = s_max(R, eta)
    rungs = []
    for s in range(top, -1, -1):
        n = (top + 1) // (s + 1) * eta ** s
        for i in range(0, s + 1 - skip_last):
            r_i = Fraction(R * eta ** i, eta ** s)
            rungs.append(Rung(s, i, n // eta ** i, int(r_i + Fraction(1, 2))))  # half up
    return rungs


def bracket_rungs(R: int, eta: int, skip_last: int) -> dict[int, list[Rung]]:
    brackets: dict[int, list[Rung]] = {}
    for rung in schedule(R, eta, skip_last):
        brackets.setdefault(rung.s, []).append(rung)
    return brackets
