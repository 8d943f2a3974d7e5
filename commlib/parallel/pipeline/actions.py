"""Pipeline schedules as data: per-rank ordered lists of compute actions.

A schedule is built the way commlib builds collective schedules: a pure function of its sizes
(stages ``S``, ranks ``P``, micro-batches ``m``, the schedule kind) returning, for every rank, the
order in which that rank runs its compute actions

    F(stage, mb)  forward          B(stage, mb)  backward (input and weight gradients)
    I(stage, mb)  input gradient   W(stage, mb)  weight gradient      (zero-bubble only)

Stage ``s`` lives on rank ``s % P`` (S = P: one stage per rank; S = v·P: the looping pipeline,
v stages per rank). Orders come from a list scheduler: a unit-time simulation in which every idle
rank picks, among the actions whose inputs are ready, the one its policy prefers (GPipe: all
forwards first; 1F1B: backward first, at most ``P - r`` micro-batches in flight; interleaved:
Megatron's depth-first order of micro-batch groups; zero-bubble: input gradients first, weight
gradients fill the idle slots). Only ready actions are picked, so every order the builder returns
can run to completion; :func:`check_orders` proves it again independently (the tests run it on
every configuration) and the runtime follows the orders verbatim. Nothing here touches torch.
"""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Tuple

__all__ = ["Action", "KINDS", "build_orders", "check_orders", "simulate", "peak_in_flight", "order_bubble",
           "theory_bubble"]

KINDS = ("gpipe", "1f1b", "interleaved", "zero_bubble")

# Unit costs of the simulation that orders the actions (a backward costs about two forwards;
# zero-bubble splits it into equal input- and weight-gradient halves, as ZB-H1 assumes).
COST = {"F": 1, "B": 2, "I": 1, "W": 1}


class Action(NamedTuple):
    kind: str   # "F", "B", "I" or "W"
    stage: int
    mb: int

    def __repr__(self):
        return f"{self.kind}{self.stage}.{self.mb}"


def _deps(a: Action, S: int) -> List[Action]:
    """Actions whose results ``a`` consumes (on this or another rank)."""
    if a.kind == "F":
        return [Action("F", a.stage - 1, a.mb)] if a.stage > 0 else []
    if a.kind == "W":
        return [Action("I", a.stage, a.mb)]
    grad_kind = a.kind  # B consumes the next stage's B, I the next stage's I
    own = [Action("F", a.stage, a.mb)]
    return own + ([Action(grad_kind, a.stage + 1, a.mb)] if a.stage + 1 < S else [])


def _rank_actions(kind: str, r: int, S: int, P: int, m: int) -> List[Action]:
    back = ("I", "W") if kind == "zero_bubble" else ("B",)
    return [Action(k, s, i) for s in range(r, S, P) for i in range(m) for k in ("F",) + back]


def _in_flight_limit(kind: str, r: int, S: int, P: int, m: int) -> int:
    """How many (stage, micro-batch) forwards may wait for their backward on rank ``r``."""
    v = S // P
    if kind == "gpipe":
        return v * m
    if kind == "interleaved" or v > 1:
        # Megatron: (P - r - 1) * 2 + (v - 1) * P warm-up forwards, plus one; enough for micro-batch
        # 0 to reach the last stage through every chunk of the loop
        return min(v * m, 2 * (P - r - 1) + (v - 1) * P + 1)
    return min(m, P - r)  # 1F1B and ZB-H1: P - r micro-batches held (Megatron's warm-up, plus one)


def _priority(kind: str, a: Action, P: int, v: int):
    """Smaller sorts first. Backward work first (it frees memory and feeds upstream ranks); with
    several stages per rank, forwards go depth-first over groups of P micro-batches (Megatron's
    interleaved order), which keeps micro-batch 0 moving to the last stage."""
    group, chunk = a.mb // P, a.stage // P
    fwd = (group, chunk, a.mb) if v > 1 else (a.mb, a.stage)
    bwd = (group, -chunk, a.mb) if v > 1 else (a.mb, -a.stage)
    if kind == "gpipe":
        return (0, fwd) if a.kind == "F" else (1, bwd)
    rank_of_kind = {"I": 0, "B": 0, "F": 1, "W": 2}[a.kind]
    return (rank_of_kind, fwd if a.kind == "F" else bwd)


def simulate(kind: str, S: int, P: int, m: int) -> Tuple[List[List[Action]], List[List[Tuple[int, int, Action]]]]:
    """Run the unit-time list scheduler; returns (orders per rank, timeline per rank of
    (start, end, action))."""
    if kind not in KINDS:
        raise ValueError(f"kind: must be one of {KINDS}, got {kind!r}")
    if P < 1 or S < P or S % P:
        raise ValueError(f"stages: {S} stages do not place evenly on {P} ranks")
    if m < 1:
        raise ValueError(f"n_microbatches: must be >= 1, got {m}")
    todo = [_rank_actions(kind, r, S, P, m) for r in range(P)]
    done_at: Dict[Action, int] = {}
    free_at = [0] * P
    in_flight = [0] * P
    pending_w = [0] * P
    orders: List[List[Action]] = [[] for _ in range(P)]
    timeline: List[List[Tuple[int, int, Action]]] = [[] for _ in range(P)]
    limits = [_in_flight_limit(kind, r, S, P, m) for r in range(P)]
    gpipe_forwards_left = [sum(1 for a in t if a.kind == "F") for t in todo]
    t, remaining = 0, sum(len(x) for x in todo)
    while remaining:
        picked = False
        for r in range(P):
            if free_at[r] > t or not todo[r]:
                continue
            ready = [a for a in todo[r] if all(done_at.get(d, t + 1) <= t for d in _deps(a, S))]
            if kind == "gpipe" and gpipe_forwards_left[r]:
                ready = [a for a in ready if a.kind == "F"]
            if in_flight[r] >= limits[r]:
                ready = [a for a in ready if a.kind != "F"]
            if pending_w[r] > (S // P) * (P - r - 1) and any(a.kind == "W" for a in ready):
                # ZB-H1's memory bound: at most P - r - 1 weight gradients deferred per stage
                ready = [a for a in ready if a.kind == "W"]
            if not ready:
                continue
            picked = True
            a = min(ready, key=lambda x: _priority(kind, x, P, S // P))
            todo[r].remove(a)
            remaining -= 1
            end = t + COST[a.kind]
            free_at[r] = end
            done_at[a] = end
            orders[r].append(a)
            timeline[r].append((t, end, a))
            if a.kind == "F":
                in_flight[r] += 1
                gpipe_forwards_left[r] -= 1
            elif a.kind in ("B", "I"):
                # ZB-H1 lets the next forward in once the input gradient left, as 1F1B does
                # after a backward; the deferred weight gradients fill the idle slots
                in_flight[r] -= 1
            pending_w[r] += {"I": 1, "W": -1}.get(a.kind, 0)
        if not picked and all(f <= t for f in free_at):
            # Every rank idle and none may start: only the in-flight cap can cause this (a rare
            # m not divisible by P); let the ranks holding forwards run one more.
            limits = [lim + 1 for lim in limits]
            continue
        t += 1
        if t > 100 * (S * m * 4 + P):  # a policy bug, never a legal outcome
            raise RuntimeError(f"pipeline scheduler stalled: kind={kind} S={S} P={P} m={m}")
    return orders, timeline


def megatron_interleaved(S: int, P: int, m: int) -> List[List[Action]]:
    """Megatron-LM's interleaved 1F1B orders (m a multiple of P): rank r runs
    ``2(P-r-1) + (v-1)P`` warm-up forwards, then alternates one forward and one backward, then
    drains the backwards. Forwards go chunk by chunk over groups of P micro-batches; backwards
    likewise with the chunks reversed."""
    v = S // P
    orders = []
    for r in range(P):
        fwd = [Action("F", c * P + r, g * P + i) for g in range(m // P) for c in range(v) for i in range(P)]
        bwd = [Action("B", c * P + r, g * P + i) for g in range(m // P) for c in reversed(range(v))
               for i in range(P)]
        warm = min(len(fwd), 2 * (P - r - 1) + (v - 1) * P)
        order = fwd[:warm]
        for k in range(len(fwd) - warm):
            order += [fwd[warm + k], bwd[k]]
        orders.append(order + bwd[len(fwd) - warm:])
    return orders


def build_orders(kind: str, S: int, P: int, m: int) -> List[List[Action]]:
    """Per-rank action orders of schedule ``kind`` (see the module docstring). The interleaved
    schedule with m a multiple of P is Megatron's exact order; every other case comes from the
    list scheduler."""
    if kind == "interleaved" and S > P and m % P == 0:
        return megatron_interleaved(S, P, m)
    return simulate(kind, S, P, m)[0]


def replay(orders: List[List[Action]], S: int) -> List[List[Tuple[int, int, Action]]]:
    """Timeline of ``orders`` under the unit costs: each rank runs its list in order, each action
    as soon as the rank is free and its inputs are done."""
    P = len(orders)
    pos, free_at, done_at = [0] * P, [0] * P, {}
    timeline: List[List[Tuple[int, int, Action]]] = [[] for _ in range(P)]
    progressed = True
    while progressed:
        progressed = False
        for r in range(P):
            while pos[r] < len(orders[r]):
                a = orders[r][pos[r]]
                deps = _deps(a, S)
                if not all(d in done_at for d in deps):
                    break
                start = max([free_at[r]] + [done_at[d] for d in deps])
                done_at[a] = free_at[r] = start + COST[a.kind]
                timeline[r].append((start, done_at[a], a))
                pos[r] += 1
                progressed = True
    if any(pos[r] < len(orders[r]) for r in range(P)):
        raise ValueError("replay: the orders deadlock")
    return timeline


def check_orders(orders: List[List[Action]], S: int, P: int, m: int, zero_bubble: bool = False):
    """Raise AssertionError unless ``orders`` run every action exactly once, each on its stage's
    rank, and can all complete when each rank runs its list in order (no wait cycle)."""
    back = ("I", "W") if zero_bubble else ("B",)
    want = {Action(k, s, i) for s in range(S) for i in range(m) for k in ("F",) + back}
    got = [a for o in orders for a in o]
    assert len(got) == len(set(got)) == len(want) and set(got) == want, "actions missing or repeated"
    for r, o in enumerate(orders):
        assert all(a.stage % P == r for a in o), f"rank {r} runs another rank's stage"
    pos, done = [0] * P, set()
    progressed = True
    while progressed:
        progressed = False
        for r in range(P):
            while pos[r] < len(orders[r]) and all(d in done for d in _deps(orders[r][pos[r]], S)):
                done.add(orders[r][pos[r]])
                pos[r] += 1
                progressed = True
    stuck = {r: orders[r][pos[r]] for r in range(P) if pos[r] < len(orders[r])}
    assert not stuck, f"orders deadlock: ranks wait at {stuck}"


def peak_in_flight(orders: List[List[Action]]) -> List[int]:
    """Per rank, the most (stage, micro-batch) activations held at once (forward done, the
    backward that frees them not yet run)."""
    peaks = []
    for o in orders:
        live = peak = 0
        for a in o:
            live += 1 if a.kind == "F" else -1 if a.kind in ("B", "W") else 0
            peak = max(peak, live)
        peaks.append(peak)
    return peaks


def order_bubble(kind: str, S: int, P: int, m: int) -> float:
    """Idle fraction of the built orders under the simulation's unit costs (F=1, B=2, I=W=1): what
    the orders achieve on an ideal machine, next to the textbook :func:`theory_bubble`."""
    timeline = replay(build_orders(kind, S, P, m), S)
    span = max(t[-1][1] for t in timeline if t)
    busy = sum(end - start for t in timeline for start, end, _ in t)
    return 1.0 - busy / (P * span)


def theory_bubble(kind: str, S: int, P: int, m: int) -> float:
    """Textbook idle fraction of a step: (P-1)/(m+P-1) for GPipe and 1F1B, (P-1)/(v·m+P-1) with
    v stages per rank (looping), (P-1)/(3m+P-1) for ZB-H1 (F = I = W in cost: a third of 1F1B's)."""
    v = S // P
    if kind == "zero_bubble":
        return (P - 1) / (3 * m + P - 1)
    return (P - 1) / (v * m + P - 1)
