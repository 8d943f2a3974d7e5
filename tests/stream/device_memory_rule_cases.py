"""Rank side of test_device_memory_rules.py: CUDA's memory rules on the emulated device (issue #23,
items 7 and 9), each counted by the emulated device in ``commlib.emulated.rule_counts()``:

* cudaFree synchronises the device, so a free inside an enqueue stalls the host while a stream of
  that device is parked in a wait for a peer (``frees_while_busy``): the nccl link's scratch
  grows with stream-ordered allocation instead;
* memory must not be freed while a peer maps it (``exports_freed_while_mapped``): close() closes
  the imports, a store barrier, then frees the exported inbox.
"""
from __future__ import annotations

import time

import numpy as np

import commlib.emulated as emu


def _count(name):
    return emu.rule_counts()[name]


def grow_scratch_while_a_receive_waits(comm):
    """Rank 0 posts a receive that waits until rank 1 sends (a second after its collectives), then
    all_reduces of growing size over the nccl link (its reducing receives land in a scratch that
    grows). Returns (frees that waited for busy streams during the collectives, received ok)."""
    dev = comm.rank  # one device per rank, as NCCL needs
    lane_p = comm.split(0, device=f"emulated:{dev}")
    lane_c = comm.split(0, device=f"emulated:{dev}")
    s_p, s_c = emu.Stream(dev), emu.Stream(dev)
    got = emu.empty(64, "int64", dev, stream=s_p)
    before = _count("frees_while_busy")
    if comm.rank == 0:
        lane_p.recv(got, 1, stream=s_p)  # parked until rank 1's send below
    for n in (1000, 300_000):
        x = emu.from_numpy(np.full(n, comm.rank + 1, np.float32), dev, stream=s_c)
        lane_c.all_reduce(x, stream=s_c, algorithm="ring")  # its receives reduce: the link's scratch
    during = _count("frees_while_busy") - before
    if comm.rank == 1:
        time.sleep(1.0)  # rank 0 meanwhile enqueues its collectives with its receive still parked
        lane_p.send(emu.from_numpy(np.arange(64, dtype=np.int64), dev, stream=s_p), 0, stream=s_p)
    s_c.synchronize()
    ok = bool((x.numpy() == 3).all())
    if comm.rank == 0:
        s_p.synchronize()
        ok = ok and np.array_equal(got.host_view_unsynchronized(), np.arange(64))
    lane_p.close()
    lane_c.close()
    return during, ok


def close_with_a_late_peer(comm, late_s=0.3):
    """Every rank maps its peers' inboxes; rank 1 closes ``late_s`` later than the others. Returns
    how many exported allocations this rank freed while a peer still mapped them."""
    before = _count("exports_freed_while_mapped")
    sub = comm.split(0, device="emulated:0")
    x = emu.from_numpy(np.ones(4096, np.float32))
    sub.all_reduce(x)
    assert (x.numpy() == comm.size).all()
    if comm.rank == 1:
        time.sleep(late_s)
    sub.close()
    comm.barrier()  # every rank closed: a free counted by now was a free under a peer's mapping
    return _count("exports_freed_while_mapped") - before
