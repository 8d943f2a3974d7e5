"""Rank side of test_kernel_protocols.py (apart from the test module so that the ranks import
neither pytest nor the test modules): which protocol the kernel path's chunks took, as the kernel
recorded it; the LL flags' epoch crossed; the plan cache's eviction inside an enqueue while a
stream of the device is parked in a wait."""

import numpy as np

import commlib.emulated as emu
from commlib.settings import overridden
from kernel_path_cases import KERNEL_SETTINGS, with_settings

LL_COUNT = 4      # int32: 16-byte messages, LL chunks (COMMLIB_DEVICE_LL_BYTES=1024)
SLOT_COUNT = 512  # 2048 bytes: over the LL limit, one chunk through a slot (4096 bytes)
EPOCH = 2**32 - 1  # chunks per LL flag epoch (csrc/kernels/plan_ll.cuh)
# One slot: every chunk of a pair goes through slot 0, so a line written D chunks earlier is in the
# slot the current chunk polls for any D.
ONE_SLOT = dict(KERNEL_SETTINGS, COMMLIB_DEVICE_SLOTS="1")


def _all_reduce(sub, n, value):
    x = emu.from_numpy(np.full(n, value, np.int32))
    sub.all_reduce(x, algorithm="direct")
    return x.numpy()  # waits for the current stream


def chunks_by_protocol(comm, settings):
    """Per all_reduce (an LL-sized one, a slot-sized one): (LL chunks, slot chunks) this rank's
    kernel moved in it, sent and received, and whether the result was right."""
    def run(sub):
        out, want = [], sub.size * (sub.size + 1) // 2
        for n in (LL_COUNT, SLOT_COUNT):
            before = sub._device().kernel_chunks()
            ok = bool((_all_reduce(sub, n, sub.rank + 1) == want).all())
            after = sub._device().kernel_chunks()
            out.append((after["ll"] - before["ll"], after["slots"] - before["slots"], ok))
        return out
    return with_settings(comm, settings, run)


def _jump(sub, n):
    """Every rank's chunk numbers continue from n, once every rank's kernels are done."""
    sub.barrier()
    sub._device()._start_kernel_chunk_numbers_at(n)
    sub.barrier()


def cross_the_ll_epoch(comm, cycles=4):
    """Each cycle: an LL all_reduce at chunk number B (its lines stay in the slot), slot-protocol
    all_reduces from B + D - 4 (as if the chunks between had gone through the slot, which leaves
    the lines alone), then an LL all_reduce at chunk B + D with other data. D = 2^32: a 32-bit flag
    taken modulo 2^32 takes chunk B's line for chunk B + D's; D = 2^32 - 1 (the epoch): so does a
    flag modulo the epoch unless the receiver scrubbed the slot at the epoch's end, which B = aE + t
    (t <= 2) puts among the slot-protocol calls. t alternates 0, 2 so that a cycle's first line
    never has the flag the previous cycle's last one left. Returns the wrong results, (D, cycle,
    value expected, values got)."""
    def run(sub):
        wrong, P = [], sub.size
        _all_reduce(sub, SLOT_COUNT, 1)  # creates the engine the jumps set (and leaves the LL lines zero)
        for k in range(cycles):
            for D, t in ((2**32, 0), (EPOCH, 2)):
                base = (3 * k + 1) * EPOCH + t
                _jump(sub, base)
                for n, value, at in ((LL_COUNT, 10 + k, None), (SLOT_COUNT, 1, base + D - 4), (SLOT_COUNT, 1, None),
                                     (SLOT_COUNT, 1, None), (SLOT_COUNT, 1, None), (LL_COUNT, 1000 + k, None)):
                    if at is not None:
                        _jump(sub, at)
                    got = _all_reduce(sub, n, value)
                    if not (got == P * value).all():
                        wrong.append((D, k, P * value, sorted(set(got.tolist()))))
        return wrong
    return with_settings(comm, ONE_SLOT, run)


def evict_plans_while_a_receive_waits(comm, shapes=257):
    """Rank 0 parks a receive on one lane until rank 1 sends (after its collectives), while the
    kernel lane runs `shapes` all_reduces of distinct counts: the 257th call shape evicts the
    cached plans inside its enqueue, but not the plan of a graph captured before (the graph pins it
    for its life: issue #37, item 3), which then replays right. Returns (frees that waited for busy
    streams meanwhile, all results right, the replay after the eviction right)."""
    lane_p = comm.split(0, device="emulated:0")
    with overridden(KERNEL_SETTINGS):
        lane_k = comm.split(0, device="emulated:0")
    s_p, s_k = emu.Stream(0), emu.Stream(0)
    got = emu.empty(64, "int64", 0, stream=s_p)
    graphed = emu.from_numpy(np.full(shapes + 1, comm.rank + 1, np.int32), 0, stream=s_k)  # a shape of its own
    lane_k.all_reduce(graphed, stream=s_k, algorithm="direct")  # the warm-up
    g = emu.Graph()
    with emu.graph(g, stream=s_k):
        lane_k.all_reduce(graphed, stream=s_k, algorithm="direct")
    before = emu.rule_counts()["frees_while_busy"]
    if comm.rank == 0:
        lane_p.recv(got, 1, stream=s_p)  # parked until rank 1's send below
    xs = []
    for n in range(1, shapes + 1):
        x = emu.from_numpy(np.full(n, comm.rank + 1, np.int32), 0, stream=s_k)
        lane_k.all_reduce(x, stream=s_k, algorithm="direct")
        xs.append(x)
    during = emu.rule_counts()["frees_while_busy"] - before
    if comm.rank == 1:
        lane_p.send(emu.from_numpy(np.arange(64, dtype=np.int64), 0, stream=s_p), 0, stream=s_p)
    graphed.copy_(emu.from_numpy(np.full(shapes + 1, comm.rank + 1, np.int32), 0, stream=s_k), stream=s_k)
    g.replay(s_k)  # its plan outlived the eviction
    s_k.synchronize()
    want = comm.size * (comm.size + 1) // 2
    replayed = bool((graphed.numpy() == want).all())
    ok = all((x.numpy() == want).all() for x in xs) and lane_k._device_route.last_path() == "kernel"
    if comm.rank == 0:
        s_p.synchronize()
        ok = ok and np.array_equal(got.host_view_unsynchronized(), np.arange(64))
    lane_p.close()
    lane_k.close()
    return during, ok, replayed
