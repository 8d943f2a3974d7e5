"""The bench report's explorer section (commlib/bench/report_sections.py): one explorer page per
collective the report compares, carrying the algorithms and world sizes it measured, so each
comparison links to the algorithms' steps."""
from __future__ import annotations

import os

import commlib._C as _C
from commlib.core.call_spec import COLLECTIVE
from commlib.explain.data import MAX_RANKS, explorer_data
from commlib.explain.page import write

__all__ = ["COUNT", "TOPOLOGY", "write_pages"]

COUNT = 8              # elements: a few per rank, so every block of the holdings table is readable
TOPOLOGY = "dgx-h100"  # the simulator's model for the step times (the report's machine is not modelled)


def write_pages(compared: dict, outdir: str) -> dict:
    """``compared``: {collective: {world size: [algorithms]}} as the report compares them. Writes
    ``outdir/explorer/<collective>.html`` for each collective with schedules and returns
    {(collective, P, algorithm): link relative to outdir} for every registered algorithm at a world
    size the explorer draws (2..MAX_RANKS); "auto" and names that are not registered are left out."""
    links = {}
    folder = os.path.join(outdir, "explorer")
    if os.path.isdir(folder):  # pages an earlier report left: the folder holds this report's only
        for name in os.listdir(folder):
            if name.endswith(".html"):
                os.remove(os.path.join(folder, name))
    for coll, by_size in sorted(compared.items()):
        if coll not in COLLECTIVE or coll == "barrier":
            continue
        known = set(_C.algorithms(COLLECTIVE[coll]))
        sizes = sorted(P for P in by_size if 2 <= P <= MAX_RANKS)
        algs = sorted({a for P in sizes for a in by_size[P] if a in known})
        if not sizes or not algs:
            continue
        rel = os.path.join("explorer", f"{coll}.html")
        write(explorer_data(coll, algs[0], sizes[0], COUNT, topology=TOPOLOGY, sizes=sizes, counts=[COUNT],
                            algorithms=algs), os.path.join(outdir, rel))
        for P in sizes:
            for a in by_size[P]:
                if a in known:
                    links[(coll, P, a)] = f"{rel}#alg={a}&P={P}&count={COUNT}"
    return links
