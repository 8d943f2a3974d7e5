"""auto's tie rule for callers that pick from the cost model's ranking (docs/simulator.md "Ties in
auto's ranking"; csrc/policy/tie_rule.h is the engine's): predictions within ``_C.AUTO_TIE_RELATIVE``
of the smallest are a tie, which goes to the candidate listed first (``_C.predict_candidates``
lists them in the search's preference order). Python's ``min`` gives what rounding gives instead:
two candidates the model predicts alike are ordered by the last bit of their sums.
"""
import math

from commlib import _C


def tie_pick(items, key=lambda c: c["predicted_s"]):
    """The item auto picks among ``items`` (in preference order): the first whose ``key`` is within
    the tie of the smallest finite one. ValueError when no key is finite."""
    items = list(items)
    times = [key(c) for c in items]
    finite = [t for t in times if math.isfinite(t)]
    if not finite:
        raise ValueError("tie_pick: no candidate has a finite predicted time")
    limit = min(finite) * (1 + _C.AUTO_TIE_RELATIVE)
    return next(c for c, t in zip(items, times) if math.isfinite(t) and t <= limit)
