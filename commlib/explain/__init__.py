"""The schedule explorer: ``commlib explain`` writes one self-contained page per collective that
shows, from the real schedules of every rank, each step's messages as arrows, what every rank's
buffers hold after it (the verifier's symbolic contributions) and its time and link use on a
modelled cluster (the simulator), with step, play, compare, P and count controls.

    from commlib import explain
    explain.write_page("all_reduce", "ring", 4, 8, "out/all_reduce.html")

Data: commlib/explain/data.py; the page: page.py and template/; docs/explorer.md.
"""
from commlib.explain.data import MAX_RANKS, explorer_data
from commlib.explain.page import embedded_data, render, write

__all__ = ["explorer_data", "render", "write", "write_page", "embedded_data", "MAX_RANKS"]


def write_page(collective: str, algorithm: str, size: int, count: int, path: str, **kwargs) -> str:
    """explorer_data(collective, algorithm, size, count, **kwargs) written as a page at ``path``."""
    return write(explorer_data(collective, algorithm, size, count, **kwargs), path)
