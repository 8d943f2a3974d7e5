"""Timelines of pipeline steps: gather, measure the bubble, plot (PNG) and export (Chrome trace).

Every schedule records its last step's compute actions in ``schedule.timeline`` (one dict per
action: rank, kind F/B/I/W, stage, micro-batch, start, end in ``time.perf_counter`` seconds).
:func:`gather_timeline` collects every rank's onto every rank. Ranks of one host share the
monotonic clock that ``perf_counter`` reads, so their times compare directly; across hosts the
clocks would need aligning (not done: commlib pipelines run on one host today).

The measured bubble is the idle share of the ranks' time from the first action's start to the
last one's end: ``1 - busy / (P * span)``, next to :func:`commlib.parallel.pipeline.actions.theory_bubble`.
"""
from __future__ import annotations

import json
from typing import Dict, List, Optional

import torch

__all__ = ["gather_timeline", "bubble_fraction", "chrome_trace", "write_chrome_trace", "plot_timeline"]

_KINDS = "FBIW"
COLOURS = {"F": "#4c72b0", "B": "#55a868", "I": "#8fd19e", "W": "#dd8452"}


def gather_timeline(schedule) -> List[dict]:
    """Every rank's events of the schedule's last step, on every rank (collective over its comm)."""
    ev = schedule.timeline
    mine = torch.tensor([[e["rank"], _KINDS.index(e["kind"]), e["stage"], e["mb"], e["start"], e["end"]]
                         for e in ev], dtype=torch.float64).reshape(-1, 6)
    comm = schedule.comm
    counts = torch.zeros(comm.size, dtype=torch.int64)
    comm.all_gather(counts, torch.tensor([mine.shape[0]], dtype=torch.int64))
    n = int(counts.max())
    padded = torch.full((n, 6), -1.0, dtype=torch.float64)
    padded[:mine.shape[0]] = mine
    every = torch.empty(comm.size * n, 6, dtype=torch.float64)
    comm.all_gather(every, padded)
    out = []
    for row in every.tolist():
        if row[0] < 0:
            continue
        out.append({"rank": int(row[0]), "kind": _KINDS[int(row[1])], "stage": int(row[2]), "mb": int(row[3]),
                    "start": row[4], "end": row[5]})
    return out


def _span(events: List[dict]):
    t0 = min(e["start"] for e in events)
    return t0, max(e["end"] for e in events) - t0


def bubble_fraction(events: List[dict], n_ranks: Optional[int] = None) -> float:
    """Idle share of ``n_ranks`` ranks between the first start and the last end of ``events``."""
    P = n_ranks or len({e["rank"] for e in events})
    _, span = _span(events)
    busy = sum(e["end"] - e["start"] for e in events)
    return 1.0 - busy / (P * span) if span > 0 else 0.0


def chrome_trace(events: List[dict], name: str = "pipeline") -> Dict:
    """A Chrome-trace (Perfetto) document: one track per rank, one slice per action (microseconds)."""
    t0, _ = _span(events)
    trace = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": name}}]
    for r in sorted({e["rank"] for e in events}):
        trace.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": r, "args": {"name": f"rank {r}"}})
    for e in events:
        trace.append({"name": f"{e['kind']}{e['mb']}", "cat": e["kind"], "ph": "X", "pid": 0, "tid": e["rank"],
                      "ts": (e["start"] - t0) * 1e6, "dur": (e["end"] - e["start"]) * 1e6,
                      "args": {"stage": e["stage"], "microbatch": e["mb"]}})
    return {"traceEvents": trace, "displayTimeUnit": "ms"}


def write_chrome_trace(events: List[dict], path: str, name: str = "pipeline"):
    with open(path, "w") as f:
        json.dump(chrome_trace(events, name), f)


def plot_timeline(events: List[dict], path: str, title: str = "", theory: Optional[float] = None):
    """Save a PNG: one row per rank, a block per action coloured by kind, labelled with its
    micro-batch (and stage when a rank holds several)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    t0, span = _span(events)
    ranks = sorted({e["rank"] for e in events})
    several = len({e["stage"] for e in events}) > len(ranks)
    fig, ax = plt.subplots(figsize=(11, 0.55 * len(ranks) + 1.3))
    for e in events:
        x, w = (e["start"] - t0) * 1e3, (e["end"] - e["start"]) * 1e3
        ax.broken_barh([(x, w)], (e["rank"] - 0.4, 0.8), facecolors=COLOURS[e["kind"]], edgecolor="white", lw=0.5)
        if w > span * 1e3 / 90:
            label = f"{e['mb']}" + (f"/{e['stage']}" if several else "")
            ax.text(x + w / 2, e["rank"], label, ha="center", va="center", fontsize=6, color="white")
    ax.set_yticks(ranks)
    ax.set_yticklabels([f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("ms since the step's first action")
    measured = bubble_fraction(events, len(ranks))
    sub = f"bubble {measured:.0%}" + (f" (theory {theory:.0%})" if theory is not None else "")
    ax.set_title(f"{title}  —  {sub}" if title else sub, fontsize=10)
    kinds = sorted({e["kind"] for e in events}, key=_KINDS.index)
    names = {"F": "forward", "B": "backward", "I": "input grad", "W": "weight grad"}
    ax.legend(handles=[Patch(color=COLOURS[k], label=names[k]) for k in kinds], loc="upper right",
              fontsize=7, ncol=len(kinds))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
