"""Rank side of test_graph_capture.py's staging-arena tests (apart from graph_cases.py, whose
step is the message plans'): one-sided collectives captured in a graph while staged in the kernel
path's staging arena (csrc/stream/kernel_path_arena.cc), replayed while eager calls grow the arena,
and the retired arenas freed once the graph is destroyed (issues #37 and #38)."""
import numpy as np

import commlib.emulated as emu
from kernel_path_cases import KERNEL_SETTINGS, with_settings


# The captured step staged in the staging arena (issue #38 with #37: kernel_path_arena.cc): one-sided
# calls on buffers no rank can map (staged), with slots far too small for them (4 KiB: the capture
# would be refused through the slots), so the capture stages in the arena and the graph pins it.
ARENA_STEP = (("all_reduce", "mapped_fused_two_shot", 20011), ("all_reduce", "mapped_two_shot", 12345),
              ("all_gather", "mapped", 7001))
ARENA_REPLAYS = 40
ARENA_EAGER_EVERY = 4   # the eager step on other buffers with the same inputs, compared bit for bit
ARENA_GROW_AT = (10, 20, 30)  # an eager call before these replays grows the arena (at least doubles it)


class _ArenaStep:
    """ARENA_STEP's buffers (unshareable: staged) and the step; inputs as _inputs' (integer-valued)."""

    def __init__(self, size):
        self.bufs = []
        for coll, _, n in ARENA_STEP:
            if coll == "all_reduce":
                self.bufs.append((emu.empty(n, "float32", shareable=False),))
            else:
                self.bufs.append((emu.empty(n * size, "int32", shareable=False), emu.empty(n, "int32", shareable=False)))

    def load(self, rank, i):
        rng = np.random.default_rng(104729 * i + rank)
        for (coll, _, n), b in zip(ARENA_STEP, self.bufs):
            dtype = np.float32 if coll == "all_reduce" else np.int32
            b[-1].copy_(emu.from_numpy(rng.integers(-1000, 1000, n).astype(dtype), shareable=False))

    def run(self, comm):
        for (coll, algo, _), b in zip(ARENA_STEP, self.bufs):
            if coll == "all_reduce":
                comm.all_reduce(b[0], algorithm=algo)
            else:
                comm.all_gather(b[0], b[1], algorithm=algo)

    def results(self):
        return b"".join(b[0].numpy().tobytes() for b in self.bufs)


def _arena_expected(size, i):
    """Replay i's results (every rank's, the same bytes): _ArenaStep.load's draws, reduced or gathered."""
    draws = []
    for q in range(size):
        rng = np.random.default_rng(104729 * i + q)
        draws.append([rng.integers(-1000, 1000, n) for _, _, n in ARENA_STEP])
    out = []
    for k, (coll, _, _) in enumerate(ARENA_STEP):
        if coll == "all_reduce":
            out.append(sum(d[k].astype(np.float32) for d in draws).tobytes())
        else:
            out.append(np.concatenate([d[k].astype(np.int32) for d in draws]).tobytes())
    return b"".join(out)


def captured_arena_step(comm):
    """ARENA_STEP captured after an eager warm-up (its calls staged in the arena), replayed
    ARENA_REPLAYS times with new inputs; before replays ARENA_GROW_AT an eager staged all_reduce
    grows the arena past twice its size (the graph keeps reading the arena it captured), and every
    ARENA_EAGER_EVERY replays the eager step on other buffers with the same inputs (staged in the
    current arena). Then the graph is destroyed on every rank, and two eager staged calls (a host
    barrier between) let every rank say it is done with the retired arenas and free them.
    Returns (replays differing from the exact results, replays differing from the eager step,
    eager steps compared, wrong growth calls, arena counts after the capture, before the graph's
    destruction, after it, exports freed while a peer mapped them)."""
    def run(sub):
        engine = None
        freed_while_mapped = emu.rule_counts()["exports_freed_while_mapped"]
        graphed, eager = _ArenaStep(sub.size), _ArenaStep(sub.size)
        graphed.load(sub.rank, 0)
        graphed.run(sub)  # the warm-up: plans, the arena (1 MiB) and its tables for these shapes
        engine = sub._device_route._last_engine
        g = emu.Graph()
        with emu.graph(g):
            graphed.run(sub)
        captured = engine.kernel_arena_counts()
        wrong, differ_eager, compared, wrong_growth = [], [], 0, 0
        for i in range(1, ARENA_REPLAYS + 1):
            if i in ARENA_GROW_AT:  # every rank alike: the arena grows to at least twice its bytes
                n = engine.kernel_staging_arena() // 4 + 4099
                big = emu.from_numpy(np.full(n, sub.rank + i, np.float32), shareable=False)
                sub.all_reduce(big, algorithm="mapped_fused_two_shot")
                wrong_growth += int(not (big.numpy() == sum(q + i for q in range(sub.size))).all())
            graphed.load(sub.rank, i)
            g.replay()
            got = graphed.results()  # (a synchronize)
            if got != _arena_expected(sub.size, i):
                wrong.append(i)
            if i % ARENA_EAGER_EVERY == 0:
                eager.load(sub.rank, i)
                eager.run(sub)
                compared += 1
                if eager.results() != got:
                    differ_eager.append(i)
        before = engine.kernel_arena_counts()
        g.reset()  # the graph destroyed (its last replay ran: results() synchronized)
        emu.synchronize()
        sub.barrier()
        for _ in range(2):  # the first: every rank is done with the retired arenas; the second frees them
            eager.load(sub.rank, 0)
            eager.run(sub)
            eager.results()
            sub.barrier()
        after = engine.kernel_arena_counts()
        return (wrong, differ_eager, compared, wrong_growth, captured, before, after,
                emu.rule_counts()["exports_freed_while_mapped"] - freed_while_mapped)
    return with_settings(comm, KERNEL_SETTINGS, run)


def _retire_a_graphs_arena(sub, engine, step):
    """step staged in the current arena (the warm-up), captured (the graph pins that arena), one
    replay, then an eager staged call that grows the arena (the graph's retired), and the graph
    destroyed on every rank: its retired arena is no rank's any more, and nothing stages after."""
    step.load(sub.rank, 0)
    step.run(sub)
    g = emu.Graph()
    with emu.graph(g):
        step.run(sub)
    big = emu.from_numpy(np.ones(engine.kernel_staging_arena() // 4 + 4099, np.float32), shareable=False)
    sub.all_reduce(big, algorithm="mapped_fused_two_shot")
    g.replay()
    step.results()  # (a synchronize)
    g.reset()
    emu.synchronize()
    sub.barrier()


def retired_arenas_freed_without_staging(comm):
    """A job that stops staging does not keep its retired arenas (kernel_path_arena.cc: collected at
    every eager call, not only at staged ones). Twice a graph's arena is retired and the graph
    destroyed (_retire_a_graphs_arena); then no call stages: (1) two message-plan all_reduces
    ("ring": no route agreed) with a barrier between, the first publishing every rank's done bit,
    the second freeing; (2) one mapped one-sided all_reduce (every rank's buffers shared: agreed,
    not staged), which frees within the call (every rank published before the agreement).
    Returns [(arena counts with the graph destroyed, after the calls, the current arena's bytes,
    the calls' results right), for (1) and (2)], and the exports freed while a peer mapped them."""
    def run(sub):
        freed_while_mapped = emu.rule_counts()["exports_freed_while_mapped"]
        step = _ArenaStep(sub.size)
        step.load(sub.rank, 0)
        step.run(sub)  # the engine and the first arena
        engine = sub._device_route._last_engine
        want = float(sum(range(sub.size)))
        cycles = []
        for calls, algorithm in ((2, "ring"), (1, "mapped_two_shot")):
            _retire_a_graphs_arena(sub, engine, step)
            before, right = engine.kernel_arena_counts(), True
            for k in range(calls):
                x = emu.from_numpy(np.full(1000, sub.rank, np.float32), shareable=True)
                sub.all_reduce(x, algorithm=algorithm)
                right = right and bool((x.numpy() == want).all())
                if k + 1 < calls:
                    sub.barrier()
            cycles.append((before, engine.kernel_arena_counts(), engine.kernel_staging_arena(), right))
        return cycles, emu.rule_counts()["exports_freed_while_mapped"] - freed_while_mapped
    return with_settings(comm, KERNEL_SETTINGS, run)


def captured_arena_step_cuda(comm):
    """captured_arena_step on GPU 0 with torch (``torch.cuda.graph``), buffers from torch's
    cudaMallocAsync backend (a pool no peer can map: every call stages, in the arena; the test sets
    PYTORCH_CUDA_ALLOC_CONF), 4 KiB slots: (replays differing from the exact results, from the eager
    step, wrong growth calls, arena counts before the graph's destruction and after)."""
    import torch

    from commlib.settings import overridden

    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    with overridden(KERNEL_SETTINGS):
        sub = comm.split(0, timeout=30)
    try:
        def make():
            return [(torch.empty(n, device=dev),) if coll == "all_reduce" else
                    (torch.empty(n * sub.size, dtype=torch.int32, device=dev), torch.empty(n, dtype=torch.int32, device=dev))
                    for coll, _, n in ARENA_STEP]

        def load(bufs, i):
            rng = np.random.default_rng(104729 * i + sub.rank)
            for (coll, _, n), b in zip(ARENA_STEP, bufs):
                b[-1].copy_(torch.from_numpy(rng.integers(-1000, 1000, n).astype(
                    np.float32 if coll == "all_reduce" else np.int32)).to(dev))

        def step(bufs):
            for (coll, algo, _), b in zip(ARENA_STEP, bufs):
                if coll == "all_reduce":
                    sub.all_reduce(b[0], algorithm=algo)
                else:
                    sub.all_gather(b[0], b[1], algorithm=algo)

        def results(bufs):
            return b"".join(b[0].cpu().numpy().tobytes() for b in bufs)

        graphed, eager = make(), make()
        load(graphed, 0)
        step(graphed)  # the warm-up
        torch.cuda.synchronize()
        engine = sub._device_route._last_engine
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step(graphed)
        wrong, differ_eager, wrong_growth = [], [], 0
        for i in range(1, ARENA_REPLAYS + 1):
            if i in ARENA_GROW_AT:
                big = torch.full((engine.kernel_staging_arena() // 4 + 4099,), float(sub.rank + i), device=dev)
                sub.all_reduce(big, algorithm="mapped_fused_two_shot")
                wrong_growth += int(not bool((big == float(sum(q + i for q in range(sub.size)))).all()))
            load(graphed, i)
            g.replay()
            got = results(graphed)
            if got != _arena_expected(sub.size, i):
                wrong.append(i)
            if i % ARENA_EAGER_EVERY == 0:
                load(eager, i)
                step(eager)
                if results(eager) != got:
                    differ_eager.append(i)
        before = engine.kernel_arena_counts()
        del g
        torch.cuda.synchronize()
        sub.barrier()
        for _ in range(2):
            load(eager, 0)
            step(eager)
            results(eager)
            sub.barrier()
        return wrong, differ_eager, wrong_growth, before, engine.kernel_arena_counts()
    finally:
        sub.close()


def retired_arena_freed_during_a_global_capture(comm):
    """The collection of retired arenas closes imports and frees memory (driver calls a capture in
    CUDA's global mode prohibits, and is invalidated by), now at every eager call: a graph's arena
    retired and the graph destroyed, then this thread begins a global-mode capture on a side stream
    (not its current one) and makes two eager message-plan all_reduces (warmed up) on its current
    stream, a barrier between. Returns (the capture's end: "ok" or its error, the calls right,
    arena counts after)."""
    def run(sub):
        step = _ArenaStep(sub.size)
        step.load(sub.rank, 0)
        step.run(sub)
        engine = sub._device_route._last_engine
        x = emu.from_numpy(np.full(1000, sub.rank, np.float32))
        sub.all_reduce(x, algorithm="ring")  # warmed up: its plan uploaded, nothing to allocate later
        _retire_a_graphs_arena(sub, engine, step)
        ys = [emu.from_numpy(np.full(1000, sub.rank, np.float32)) for _ in range(2)]
        emu.synchronize()
        g = emu.Graph()
        g.capture_begin(emu.Stream(), "global")
        for k, y in enumerate(ys):
            sub.all_reduce(y, algorithm="ring")
            if k == 0:
                sub.barrier()
        try:
            g.capture_end()
            ended = "ok"
        except Exception as e:  # noqa: BLE001 - the message is the result
            ended = f"{type(e).__name__}: {e}"
        right = all(bool((y.numpy() == sum(range(sub.size))).all()) for y in ys)
        return ended, right, engine.kernel_arena_counts()
    return with_settings(comm, KERNEL_SETTINGS, run)
