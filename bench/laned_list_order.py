"""The laned algorithms' schedules again as Python algorithms, for an A/B of the host executor's lanes
in flight against list order (docs/DESIGN.md "Laned calls"): ``commlib bench --import laned_list_order``
(with ``bench/`` on PYTHONPATH) registers ``<name>_in_list_order`` for each of LANED, the very same
schedule, which the executor runs step by step in list order (schedule/lanes.h: a Python algorithm's
lane fields are not lanes). The schedules need the host map: LANED_AB_HOSTS contiguous groups of
equal size, as ``commlib bench --hosts`` places the ranks (default 1). E.g. on 8 ranks in 2 hosts::

    LANED_AB_HOSTS=2 PYTHONPATH=bench commlib bench --np 8 --hosts 2 --peers none --import laned_list_order \\
        --algorithms rail_ring,rail_ring_in_list_order,rail_split,rail_split_in_list_order \\
        -b 64K -e 16M -f 4 --passes 5 all_reduce
"""
import os

import commlib
from commlib import _C
from commlib.core.call_spec import COLLECTIVE

LANED = (("all_reduce", "rail_ring"), ("all_gather", "rail_ring"), ("reduce_scatter", "rail_ring"),
         ("all_reduce", "rail_split"), ("all_reduce", "rail_lanes"), ("all_reduce", "rail_window"))


def _hosts(size):
    H = max(1, int(os.environ.get("LANED_AB_HOSTS", "1")))
    return [r * H // size for r in range(size)]


def _register():
    for collective, algorithm in LANED:
        def build(rank, size, count, root, collective=collective, algorithm=algorithm):
            s = _C.schedule(COLLECTIVE[collective], algorithm, rank, size, count, root, _C.DType.float32,
                            _hosts(size))
            return {k: v for k, v in s.items() if k in ("steps", "scratch_count")}
        commlib.register_algorithm(collective, f"{algorithm}_in_list_order", build)


_register()
