"""Rank side of test_graph_capture.py (apart from the test module, so that the ranks import neither
pytest nor the test modules): kernel-path collectives captured in a graph on the emulated device
(commlib.emulated.graph), replayed between eager calls (issue #37, item 3)."""
import time

import numpy as np

import commlib

import commlib.emulated as emu
from commlib.testing.faults import arm_death
from kernel_path_cases import COPY_SETTINGS, KERNEL_SETTINGS, with_settings

SIZES = (3, 37, 1000)  # three all_reduces (LL chunks, then several slot chunks through 2 slots)
GATHER = 5             # one all_gather of this many int32 per rank
OTHER = 11             # the eager all_reduce between replays: this many float64
# Replays of the captured step (issue #37's acceptance: 100). A counter the replay does not advance
# (or advances on the host at capture) is wrong from the second replay on; 100 replays with their
# eager neighbours run every slot and LL-line parity many times over. A replay is made cheap, not
# rare: every input is uploaded once before the first, and each replay's loads, its eager
# neighbour and the copies of both results out are stream-ordered, with one host synchronize at
# the end. The LL flags' epoch (2^32 - 1 chunks) is crossed by test_kernel_protocols.py.
REPLAYS = 100
EAGER_EVERY = 10       # the eager step on the same inputs, compared bit for bit, every this many replays


def _inputs(rank, i):
    """Rank `rank`'s inputs of replay `i`: integer-valued floats, so that every sum is exact in any
    order and each rank knows every replay's results (the eager step's, bit for bit)."""
    rng = np.random.default_rng(7919 * i + rank)
    return ([rng.integers(-1000, 1000, n).astype(np.float32) for n in SIZES],
            rng.integers(-1000, 1000, GATHER).astype(np.int32))


def _expected(size, i):
    """Replay i's results on every rank: the all_reduces' sums, then the all_gather."""
    ins = [_inputs(q, i) for q in range(size)]
    sums = [sum(v[k] for v, _ in ins) for k in range(len(SIZES))]
    return np.concatenate(sums), np.concatenate([g for _, g in ins])


def _differing(size, replays, sampled, got, eager):
    """The replays (1..replays) whose results (`got`: every replay's floats and ints, host arrays)
    differ from the exact ones or, for the `sampled` replays, from the eager step's (`eager`: the
    sampled replays' results, in order) bit for bit."""
    n, m = sum(SIZES), GATHER * size
    differ = []
    for i in range(1, replays + 1):
        f, ints_i = got[0][(i - 1) * n:i * n], got[1][(i - 1) * m:i * m]
        want_f, want_i = _expected(size, i)
        if f.tobytes() != want_f.tobytes() or ints_i.tobytes() != want_i.tobytes():
            differ.append(i)
        elif i in sampled:
            k = sampled.index(i)
            if f.tobytes() != eager[0][k * n:(k + 1) * n].tobytes() or \
                    ints_i.tobytes() != eager[1][k * m:(k + 1) * m].tobytes():
                differ.append(i)
    return differ


class _Step:
    """The step's buffers (static, as a graph needs) and the step itself."""

    def __init__(self, size):
        self.xs = [emu.empty(n, "float32") for n in SIZES]
        self.g_in = emu.empty(GATHER, "int32")
        self.g_out = emu.empty(GATHER * size, "int32")

    def load(self, floats, ints, i):
        """Replay i's inputs, from `floats` / `ints` (every replay's, uploaded once): stream-ordered."""
        at = i * sum(SIZES)
        for x in self.xs:
            x.copy_(floats[at:at + x.count])
            at += x.count
        self.g_in.copy_(ints[i * GATHER:(i + 1) * GATHER])

    def run(self, comm):
        for x in self.xs:
            comm.all_reduce(x)
        comm.all_gather(self.g_out, self.g_in)

    def save(self, floats, ints, k):
        """The results into slot k of `floats` / `ints`: stream-ordered."""
        at = k * sum(SIZES)
        for x in self.xs:
            floats[at:at + x.count].copy_(x)
            at += x.count
        ints[k * self.g_out.count:(k + 1) * self.g_out.count].copy_(self.g_out)


def captured_step_matches_eager(comm):
    """The step captured once (after an eager warm-up), replayed REPLAYS times with new inputs each
    time, each replay followed by an eager all_reduce of another size and, every EAGER_EVERY
    replays, by the eager step on other buffers with the same inputs: (replays whose results differ
    from the eager step's or from the exact results, wrong eager results of the other size, eager
    steps compared, launches replayed as the kernel counted them)."""
    def run(sub):
        size, n = sub.size, sum(SIZES)
        ins = [_inputs(sub.rank, i) for i in range(REPLAYS + 1)]
        floats = emu.from_numpy(np.concatenate([np.concatenate(v) for v, _ in ins]))
        ints = emu.from_numpy(np.concatenate([g for _, g in ins]))
        others = emu.from_numpy(np.concatenate([np.full(OTHER, sub.rank + i, np.float64) for i in range(REPLAYS + 1)]))
        sampled = list(range(1, REPLAYS + 1, EAGER_EVERY))
        got_f, got_i = emu.empty(REPLAYS * n, "float32"), emu.empty(REPLAYS * GATHER * size, "int32")
        eager_f, eager_i = emu.empty(len(sampled) * n, "float32"), emu.empty(len(sampled) * GATHER * size, "int32")
        got_other = emu.empty(REPLAYS * OTHER, "float64")
        graphed, eager = _Step(size), _Step(size)
        other = emu.empty(OTHER, "float64")
        graphed.load(floats, ints, 0)
        graphed.run(sub)  # the warm-up: plans, scratch, the engine itself
        g = emu.Graph()
        with emu.graph(g):
            graphed.run(sub)
        replays_before = sub._device_route._last_engine.kernel_replays_done()
        for i in range(1, REPLAYS + 1):
            graphed.load(floats, ints, i)
            g.replay()
            graphed.save(got_f, got_i, i - 1)
            other.copy_(others[i * OTHER:(i + 1) * OTHER])
            sub.all_reduce(other)                      # eager, between the replays
            got_other[(i - 1) * OTHER:i * OTHER].copy_(other)
            if i in sampled:
                eager.load(floats, ints, i)
                eager.run(sub)
                eager.save(eager_f, eager_i, sampled.index(i))
        got_f, got_i, got_other = got_f.numpy(), got_i.numpy(), got_other.numpy()  # (one synchronize)
        eager_f, eager_i = eager_f.numpy(), eager_i.numpy()
        replayed = sub._device_route._last_engine.kernel_replays_done() - replays_before
        differ = _differing(size, REPLAYS, sampled, (got_f, got_i), (eager_f, eager_i))
        wrong_other = sum(int(not (got_other[(i - 1) * OTHER:i * OTHER] == sum(r + i for r in range(size))).all())
                          for i in range(1, REPLAYS + 1))
        return differ, wrong_other, len(sampled), replayed
    return with_settings(comm, KERNEL_SETTINGS, run)


def capture_error(fn):
    """What capturing `fn` in a new graph raises, as "Type: message", or "no error"."""
    try:
        with emu.graph(emu.Graph()):
            fn()
    except Exception as e:  # noqa: BLE001 - the message is the result
        return f"{type(e).__name__}: {e}"
    return "no error"


def capture_refusals(comm):
    """What capturing raises: before any device call (no engine), before the call shape's warm-up,
    and on the copy path; then whether the communicator still works: (messages..., result ok)."""
    def kernel(sub):
        x = emu.from_numpy(np.ones(8, np.float32))
        before_engine = capture_error(lambda: sub.all_reduce(x))
        sub.all_reduce(x)  # warms up this shape only
        other_shape = capture_error(lambda: sub.all_reduce(x[:5]))
        y = emu.from_numpy(np.ones(4, np.float32))
        sub.all_reduce(y)
        return before_engine, other_shape, bool((y.numpy() == sub.size).all())

    def copy(sub):
        x = emu.from_numpy(np.ones(8, np.float32))
        sub.all_reduce(x)
        refused = capture_error(lambda: sub.all_reduce(x))
        sub.all_reduce(x)
        return refused, bool((x.numpy() == sub.size ** 2).all())
    return with_settings(comm, KERNEL_SETTINGS, kernel), with_settings(comm, COPY_SETTINGS, copy)


def captured_avg_replays(comm, replays=4):
    """An avg all_reduce (its divide after the launch, gated on the stop word mirrored by a copy
    that is captured with it) captured after a warm-up, replayed with new inputs: whether every
    replay's result is the ranks' mean."""
    def run(sub):
        P, x = sub.size, emu.from_numpy(np.zeros(1000, np.float32))
        sub.all_reduce(x, op="avg")
        g = emu.Graph()
        with emu.graph(g):
            sub.all_reduce(x, op="avg")
        right = []
        for i in range(1, replays + 1):
            x.copy_(emu.from_numpy(np.full(1000, (sub.rank + 1) * i, np.float32)))
            g.replay()
            right.append(bool((x.numpy() == np.float32(i * (P + 1) / 2)).all()))
        return right
    return with_settings(comm, KERNEL_SETTINGS, run)


def captured_all_reduce(comm):
    """A sub-communicator whose all_reduce of 1000 ones is warmed up, captured in a graph and
    replayed once (complete): (sub, its buffer, the graph)."""
    sub = comm.split(0, timeout=30)
    x = emu.from_numpy(np.ones(1000, np.float32))
    sub.all_reduce(x)
    g = emu.Graph()
    with emu.graph(g):
        sub.all_reduce(x)
    g.replay()
    x.numpy()
    return sub, x, g


def kill_during_replay(comm, victim):
    """``victim`` dies (SIGKILL) while every rank replays a captured all_reduce (one rank, "late",
    starts its replay only after the kill, so the others are inside it): the survivors' next call
    raises PeerError naming the dead rank, found by the watchdog's watch of replays (the abort
    word releases the replayed kernel). Returns (message, seconds) on survivors."""
    sub, x, g = captured_all_reduce(comm)
    if arm_death(sub, victim):
        time.sleep(5)  # the kill arrives meanwhile
        return None
    t = time.monotonic()
    try:
        g.replay()
        x.numpy()  # returns once the engine failed and its abort word released the kernel
        sub.all_reduce(x)
        return None
    except commlib.PeerError as e:
        return str(e), time.monotonic() - t
    except commlib.CommError as e:
        return f"wrong type {type(e).__name__}: {e}", time.monotonic() - t


def captured_step_cuda(comm, replays=REPLAYS):
    """The same on a GPU with torch (``torch.cuda.graph``, global capture mode), made cheap the same
    way: every replay's inputs uploaded once, each replay's loads, its eager neighbour (an all_reduce
    of OTHER float64), the eager step every EAGER_EVERY replays and the copies of the results out
    all stream-ordered, one host synchronize at the end: (replays whose results differ from the
    exact ones or from the eager step's bit for bit, wrong eager neighbours, the error of a capture
    before the warm-up)."""
    import torch
    from commlib.settings import overridden
    with overridden(KERNEL_SETTINGS):
        sub = comm.split(0, timeout=60)
    try:
        dev = torch.device("cuda", 0)
        g_cold = torch.cuda.CUDAGraph()
        cold = torch.ones(8, device=dev)
        try:
            with torch.cuda.graph(g_cold):
                sub.all_reduce(cold)
            before_warm_up = "no error"
        except Exception as e:  # noqa: BLE001 - the message is the result
            before_warm_up = f"{type(e).__name__}: {e}"
        size, n, m = sub.size, sum(SIZES), GATHER * sub.size
        ins = [_inputs(sub.rank, i) for i in range(replays + 1)]
        floats = torch.from_numpy(np.concatenate([np.concatenate(v) for v, _ in ins])).to(dev)
        ints = torch.from_numpy(np.concatenate([g for _, g in ins])).to(dev)
        others = torch.from_numpy(np.concatenate([np.full(OTHER, sub.rank + i, np.float64)
                                                  for i in range(replays + 1)])).to(dev)
        sampled = list(range(1, replays + 1, EAGER_EVERY))
        got = torch.empty(replays * n, device=dev), torch.empty(replays * m, dtype=torch.int32, device=dev)
        eager_out = (torch.empty(len(sampled) * n, device=dev),
                     torch.empty(len(sampled) * m, dtype=torch.int32, device=dev))
        got_other = torch.empty(replays * OTHER, dtype=torch.float64, device=dev)
        other = torch.empty(OTHER, dtype=torch.float64, device=dev)

        def make():
            return [torch.empty(k, device=dev) for k in SIZES], torch.empty(GATHER, dtype=torch.int32, device=dev), \
                torch.empty(m, dtype=torch.int32, device=dev)

        def load(bufs, i):
            at = i * n
            for x in bufs[0]:
                x.copy_(floats[at:at + x.numel()])
                at += x.numel()
            bufs[1].copy_(ints[i * GATHER:(i + 1) * GATHER])

        def save(bufs, out, k):
            at = k * n
            for x in bufs[0]:
                out[0][at:at + x.numel()].copy_(x)
                at += x.numel()
            out[1][k * m:(k + 1) * m].copy_(bufs[2])

        def step(bufs):
            for x in bufs[0]:
                sub.all_reduce(x)
            sub.all_gather(bufs[2], bufs[1])

        graphed, eager = make(), make()
        load(graphed, 0)
        step(graphed)  # the warm-up
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step(graphed)
        for i in range(1, replays + 1):
            load(graphed, i)
            g.replay()
            save(graphed, got, i - 1)
            other.copy_(others[i * OTHER:(i + 1) * OTHER])
            sub.all_reduce(other)  # eager, between the replays
            got_other[(i - 1) * OTHER:i * OTHER].copy_(other)
            if i in sampled:
                load(eager, i)
                step(eager)
                save(eager, eager_out, sampled.index(i))
        torch.cuda.synchronize()
        host = tuple(t.cpu().numpy() for t in got)
        differ = _differing(size, replays, sampled, host, tuple(t.cpu().numpy() for t in eager_out))
        got_other = got_other.cpu().numpy()
        wrong_other = sum(int(not (got_other[(i - 1) * OTHER:i * OTHER] == sum(r + i for r in range(size))).all())
                          for i in range(1, replays + 1))
        return differ, wrong_other, before_warm_up
    finally:
        sub.close()


def captured_mapped_auto(comm):
    """An auto all_reduce of 256 KiB (3 ranks: each receives 512 KiB, the two-shot's size) on
    buffers every rank maps runs eagerly as the mapped two-shot; captured after that warm-up (the
    capture stages it, through the slots) and replayed with new inputs, its results equal bit for bit
    an eager mapped_fused_two_shot's on buffers no rank maps, staged in the staging arena between the
    replays: (the eager algorithm, replays that differ, the arena's bytes)."""
    n = 1 << 16

    def run(sub):
        x, y = emu.empty(n, "float32"), emu.empty(n, "float32", shareable=False)
        rng = np.random.default_rng(sub.rank)
        x.copy_(emu.from_numpy(rng.standard_normal(n).astype(np.float32)))
        sub.all_reduce(x)  # the warm-up
        algorithm = sub._device_route._last_engine.last_algorithm()
        g = emu.Graph()
        with emu.graph(g):
            sub.all_reduce(x)
        differ = []
        for i in range(3):
            v = rng.standard_normal(n).astype(np.float32)
            x.copy_(emu.from_numpy(v))
            y.copy_(emu.from_numpy(v))
            g.replay()
            sub.all_reduce(y, algorithm="mapped_fused_two_shot")
            if x.numpy().tobytes() != y.numpy().tobytes():
                differ.append(i)
        return algorithm, differ, sub._device_route._last_engine.kernel_staging_arena()
    return with_settings(comm, dict(KERNEL_SETTINGS, COMMLIB_DEVICE_SLOT_BYTES=str(256 << 10)), run)


def async_error_during_replay(comm, victim):
    """As kill_during_replay, but the survivors make no call after the kill: they poll
    ``async_error()`` (healthy: None, before the kill) until it reports the engine's failure.
    Returns (None before the kill?, the error's type and message, seconds until it came, the type
    the next call raises) on survivors."""
    sub, x, g = captured_all_reduce(comm)
    healthy = sub.async_error() is None
    if arm_death(sub, victim):
        time.sleep(5)  # the kill arrives meanwhile
        return None
    t = time.monotonic()
    g.replay()
    err = None
    while err is None and time.monotonic() - t < 30:
        err = sub.async_error()
        time.sleep(0.01)
    took = time.monotonic() - t
    again = sub.async_error()  # a query changes nothing: the same error again
    try:
        x.numpy()
        sub.all_reduce(x)
        then = "no error"
    except commlib.CommError as e:
        then = type(e).__name__
    return (healthy, None if err is None else (type(err).__name__, str(err)), took,
            again is not None and str(again) == str(err), then)



def capture_after_plan_eviction(comm):
    """The plan cache (256 plans) evicts alike on every rank, whatever graphs each holds: rank 0
    keeps a graph of a 7-float all_reduce while rank 1 destroys its copy, then 300 eager calls of
    other shapes fill the cache. Capturing the 7-float call again (no eager call of it since) is
    then refused with the warm-up error on every rank (rank 0 used to keep the plan its graph
    held in the cache and capture it, leaving rank 1 refused alone: a graph on one rank only);
    its graph keeps its plan, out of the cache. After a warm-up the capture runs on both.
    Returns (the capture's outcome, the new graph's replay right)."""
    def run(sub):
        x = emu.from_numpy(np.ones(7, np.float32))
        sub.all_reduce(x)
        g = emu.Graph()
        with emu.graph(g):
            sub.all_reduce(x)
        if sub.rank == 1:
            g.reset()
        emu.synchronize()
        for n in range(8, 308):
            sub.all_reduce(emu.from_numpy(np.ones(n, np.float32)))
        emu.synchronize()
        outcome = capture_error(lambda: sub.all_reduce(x))
        sub.all_reduce(x)  # the warm-up again
        x.copy_(emu.from_numpy(np.full(7, sub.rank, np.float32)))
        g2 = emu.Graph()
        with emu.graph(g2):
            sub.all_reduce(x)
        g2.replay()
        new_right = bool((x.numpy() == sum(range(sub.size))).all())
        del g
        return outcome, new_right
    return with_settings(comm, KERNEL_SETTINGS, run)
