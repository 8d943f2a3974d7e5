"""Rank-side cases of laned schedules on device buffers across emulated hosts
(test_device_laned_plans.py): the collective matrix of the laned algorithms on a sub-communicator
whose plans are resolved with a pipeline segment (COMMLIB_HIER_SEGMENT), so that rail_window and
rail_lanes have lanes (rail_ring and rail_split have theirs at any segment)."""
from __future__ import annotations

import device_cases
from kernel_path_cases import with_settings


def laned_matrix(comm, cases, segment):
    """device_cases.check_cases over `cases` with COMMLIB_HIER_SEGMENT=`segment` (every call's plan
    is resolved inside the setting)."""
    return with_settings(comm, {"COMMLIB_HIER_SEGMENT": str(segment)}, device_cases.check_cases, cases)
