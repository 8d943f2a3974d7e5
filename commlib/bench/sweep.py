"""The sweep: for every collective, algorithm, size and mode, warm up, time, check, record.

One engine serves every backend (commlib's and the interface in backends.py, gloo in gloo_peer.py,
MPI in mpi_peer.py): the timed loop is a backend's zero-argument callable between two
``perf_counter`` reads.

How a time is measured (documented in the report and the README):

1. ``-w`` warm-up calls per (algorithm, mode), timed: the slowest rank's estimate sets how many
   calls that shape gets, at least ``-n`` and enough for ``--min-time`` seconds of samples (at
   most ``--max-iters``; see :func:`iteration_counts`), then a barrier;
2. those timed calls back to back (no barrier between them), split into ``--rounds`` rounds that
   interleave the algorithms of one size (see :class:`Sweep`), and ``--close-rounds`` more rounds of
   the series whose medians so far decide a close verdict (T5, or Open MPI against auto or
   commlib's best row: see commlib/bench/close_calls.py; the record's ``close_rounds`` says so);
   every rank records each call's duration; a call's time is the **maximum over ranks** of that
   call's duration (a collective is done when its slowest rank is done);
3. the row's ``time`` is the **median** of those per-call times (min, max and the loop average,
   i.e. the slowest rank's total loop time / n as nccl-tests reports, are kept in the JSON);
4. beside the times, what the calls cost whatever the machine's load: ``cpu_us``, the CPU time
   (user + system, every thread) of all ranks together per call, and ``switches``, their context
   switches per call, voluntary (sleeps) and involuntary (preemptions, yields that gave the core)
   (getrusage around each round's loop; a rank's barrier is outside it); and ``huge_pages``, the
   share of rank 0's send and receive buffers (2 MiB and more) on huge pages, which a peer's
   single-copy read of them costs less on (commlib/bench/huge_pages.py).

With ``-c`` every (algorithm, size, mode) gets one more call on fresh data whose result every rank
compares against a reference computed locally; ``#wrong`` is the number of wrong elements summed
over ranks.
"""
from __future__ import annotations

import resource
import sys
import time
import zlib

import numpy as np

from commlib.bench.backends import Backend
from commlib.bench.huge_pages import buffer_share
from commlib.bench.references import Reference, make_buffers, numel
from commlib.perf import common as C
from commlib.perf.table import Table


def _usage():
    """(CPU seconds user + system, voluntary switches, involuntary switches) of this process so far."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return np.array([ru.ru_utime + ru.ru_stime, ru.ru_nvcsw, ru.ru_nivcsw], np.float64)


def _hook(backend, name, default):
    """``backend``'s method ``name`` (backends.Backend's hooks), or one returning ``default`` for a
    backend written without them."""
    return getattr(backend, name, lambda *_a: default)


def iteration_counts(seconds_per_call, cfg) -> list:
    """Timed calls per call shape: at least ``-n``, and more for fast calls, until the shape has
    about ``--min-time`` seconds of samples (at most ``--max-iters`` calls).

    ``seconds_per_call`` is the slowest rank's warm-up estimate per shape, so every rank computes
    the same counts. A median over 20 calls of a 1 us collective is dominated by the calls right
    after the barrier (ranks waking up, skew); a few hundred calls measure the steady state, the
    way osu_latency and nccl-tests' longer runs do.
    """
    n_min = cfg["iters"]
    n_max = max(n_min, cfg.get("max_iters", 1000))
    budget = cfg.get("min_time", 0.0)
    out = []
    for t in seconds_per_call:
        n = n_min
        if budget > 0 and t > 0:
            n = int(min(n_max, max(n_min, np.ceil(budget / t))))
        out.append(n)
    return out


def round_order(keys, collective, size, rnd):
    """The order round ``rnd`` of one size takes its series in: the listed order in round 0, then a
    permutation seeded by (collective, size, round), the same on every rank without a word between
    them. Why: in a fixed order a series always follows the same one, on buffers the other mode's
    series left cold in cache, right after the same kind of call (single-copy reads, a peer's); what
    that costs or saves then lands on one series in every round, a bias the median keeps (auto's
    row read 8-21% over the row of the algorithm it ran, all_gather 16 MiB, out of place, in three
    runs of session 35: auto always followed rail_ring in place). Permuted, it lands on different
    series round by round, and the median over rounds absorbs it."""
    keys = list(keys)
    if rnd == 0 or len(keys) < 2:
        return keys
    seed = zlib.crc32(f"{collective}|{size}|{rnd}".encode())  # not hash(): randomised per process
    return [keys[i] for i in np.random.default_rng(seed).permutation(len(keys))]


class Sweep:
    """Runs the sweep of one backend; rank 0 prints the table and keeps the records.

    Order: collective, then size, then ``rounds`` rounds over every (algorithm, mode), each round
    timing iters/rounds calls: the algorithms of one size are measured interleaved, seconds apart,
    so a burst of load from other processes, or a slow spell of the machine (its two cores'
    cache-line hand-offs 4x slower for minutes at a time, bench/RESULTS_collectives.md session 24),
    hits them alike and their ratios stay meaningful. A peer run in the same rank processes
    (``Backend.peers_inline``: Open MPI under the same ``mpirun``, same_job.py) is one more entry
    of every round, so commlib-to-MPI ratios get the same protection. Each round takes the series
    in its own order (:func:`round_order`), so no series always follows the same one.
    """

    def __init__(self, backend: Backend, cfg: dict, out=sys.stdout, progress=None):
        self.b = backend
        self.cfg = cfg
        self.out = out
        self.records = []
        self.wrong_total = 0
        self.progress = progress  # callable(done, total, label) or None
        self._warm = False
        self.order = []  # per size measured: the "algorithm/mode" keys one round takes, listed order
        self.round_orders = []  # per size measured: per round, the keys in the order it took them

    def _algos(self, collective):
        req = self.cfg.get("algorithms") or ["all"]
        if self.b.name != "commlib":
            return [self.b.name]
        known = self.b.algorithms(collective)
        if "all" not in req:
            # "<algorithm>@<path>" (the device bench's paths) is selected by its algorithm
            known = [a for a in known if a in req or a.partition("@")[0] in req]
        # --compress: "<algorithm>+<codec>" beside each algorithm compress= can run here
        return known + [f"{a}+{c}" for c in self.cfg.get("compress") or [] for a in known
                        if self.b.compressible(collective, a, c)] + _hook(self.b, "peers_inline", [])(collective)

    def _plan(self):
        cfg, b = self.cfg, self.b
        modes = cfg.get("modes", list(C.MODES))
        plan = []
        for coll in cfg["collectives"]:
            use_op = cfg["op"] if coll in C.REDUCING else "sum"
            ms = [m for m in (modes if b.name == "commlib" else [C.COMPARE_MODE[coll]])
                  if b.supports(coll, m, use_op, cfg["dtype"])]
            algos = self._algos(coll)
            if ms and algos:
                plan.append((coll, algos, ms, use_op))
        return plan

    def run(self):
        cfg, b = self.cfg, self.b
        P, rank = b.size, b.rank
        dtype, root = cfg["dtype"], cfg.get("root", 0)
        plan = self._plan()
        total = len(plan) * len(cfg["sizes"])
        done = 0
        t_start = time.perf_counter()
        for i, (coll, algos, ms, op) in enumerate(plan):
            table = None
            if rank == 0:
                table = Table(coll, P, self.out, modes=C.MODES if b.name == "commlib" else ms)
                links = f" links: {cfg['links']};" if cfg.get("links") else ""
                table.header(f"{b.name} {coll} ranks={P} transport={b.transport}{links} algorithms: {', '.join(algos)} "
                             f"[{i + 1}/{len(plan)}, {time.perf_counter() - t_start:.0f} s]")
            seen = set()
            for size_req in cfg["sizes"]:
                done += 1
                count, block, size = C.geometry(coll, size_req, dtype, P)
                if size in seen:  # small sizes round up to one element per rank
                    continue
                seen.add(size)
                recs = self._measure_size(coll, algos, ms, count, block, size, dtype, op, root)
                if rank == 0:
                    for algo in algos:
                        table.row(size, count, dtype, op if coll in C.REDUCING else "none",
                                  root if coll in C.ROOTED else -1, recs[algo], algorithm=algo)
                    if self.progress:
                        self.progress(done, total, f"{b.name} {coll} {C.fmt_bytes(size)}")
            if rank == 0:
                table.footer()
        return self.records

    def _close_keys(self, coll, keys, times, size, dtype):
        """The (algorithm, mode) keys of this size whose medians so far decide a close verdict
        (close_calls.close_series), in the comparison mode; every rank gets the same list."""
        from commlib.bench.close_calls import close_series
        mode = C.COMPARE_MODE[coll]
        cm = [k for k in keys if k[1] == mode and "+" not in k[0]]
        if len(cm) < 2:
            return []
        per_call = self.b.gather_stats(np.concatenate([np.asarray(times[k], np.float64) for k in cm])).max(axis=0)
        medians, start = {}, 0
        for k in cm:
            medians[k[0]] = float(np.median(per_call[start:start + len(times[k])]))
            start += len(times[k])
        peers = [a for a in _hook(self.b, "peers_inline", [])(coll) if a in medians]
        auto_alg = self.b.resolve(coll, "auto", size, dtype) if "auto" in medians else None
        close = close_series(medians, auto_alg, peers[0] if peers else None, self.cfg.get("close_margin", 0.10))
        return [k for k in cm if k[0] in close]

    def _measure_size(self, coll, algos, ms, count, block, size, dtype, op, root):
        b, cfg = self.b, self.cfg
        w = cfg["warmup"]
        ref = Reference(coll, count, block, dtype, op, b.rank, b.size, root) if cfg.get("check") else None
        bufs = {m: make_buffers(coll, m, block, dtype, b.rank, b.size, root) for m in ms}
        for m in ms:
            if ref is not None:
                ref.prepare(bufs[m])
            elif bufs[m]["send"] is not None:
                C.fill(bufs[m]["send"], np.ones(numel(bufs[m]["send"])))
        # Every (algorithm, mode) of this size, in the order the rounds take them; a peer measured
        # in these processes (same_job.py) runs only its comparison mode, beside commlib's.
        keys = [(a, m) for a in algos for m in ms if _hook(b, "runs", True)(coll, a, m, op, dtype)]
        fns = {(a, m): b.make(coll, a, m, bufs[m], op, root) for a, m in keys}
        pc = time.perf_counter
        # Warm up every call shape, timing the warm-up calls: they set how many calls each shape
        # gets (see iteration_counts). First calls of the job pay for connections and page faults.
        # A call the backend may refuse at this size (`refusable`: refused with a ValueError before
        # anything is sent, alike on every rank) is left out of this size, saying why.
        est, refused = [], {}
        for key in keys:
            fn = fns[key]
            warm = max(w, 1) + (0 if self._warm else 20)
            wt = [0.0] * warm
            try:
                for j in range(warm):
                    t0 = pc()
                    fn()
                    wt[j] = pc() - t0
            except ValueError as e:
                if not getattr(b, "refusable", lambda _c, _a: False)(coll, key[0]):
                    raise
                refused[key] = str(e)
                if b.rank == 0:
                    print(f"# {coll} {key[0]} ({key[1]}) at {size} B refused: {e}", file=self.out, flush=True)
                continue
            self._warm = True
            est.append(float(np.median(wt[len(wt) // 2:])))  # the later, warmer half
        keys = [k for k in keys if k not in refused]
        if not keys:
            return {a: {m: None for m in ms} for a in algos}
        self.order.append([f"{a}/{m}" for a, m in keys])  # what each round takes, in order (tests)
        iters = iteration_counts(b.gather_stats(np.array(est, np.float64)).max(axis=0), cfg)
        iters = dict(zip(keys, iters))
        times = {k: [] for k in keys}
        loops = {k: 0.0 for k in keys}
        usage = {k: np.zeros(3) for k in keys}  # _usage() over the timed loops
        rounds = max(1, min(cfg.get("rounds", 2), min(iters.values())))
        began = time.time()  # wall clock of this size's rounds (bench/spells.py --levels lines them up)

        taken = []
        self.round_orders.append(taken)

        def one_round(rnd, round_keys, calls_of):
            round_keys = round_order(round_keys, coll, size, rnd)
            taken.append([f"{a}/{m}" for a, m in round_keys])
            for key in round_keys:
                k_iters = calls_of(key)
                fn = fns[key]
                if rnd:  # re-warm after the other shapes ran
                    fn()
                b.barrier()
                ts = [0.0] * k_iters
                u0 = _usage()
                t_loop = pc()
                for j in range(k_iters):
                    t0 = pc()
                    fn()
                    ts[j] = pc() - t0
                loops[key] += pc() - t_loop
                usage[key] += _usage() - u0
                times[key] += ts

        for rnd in range(rounds):
            one_round(rnd, keys, lambda key: iters[key] // rounds + (1 if rnd < iters[key] % rounds else 0))
        # Close decisions (close_calls.py): the series deciding them get more rounds, interleaved as
        # before, each round as many calls as a regular one; the record's iters counts every call.
        close = self._close_keys(coll, keys, times, size, dtype) if cfg.get("close_rounds", 0) else []
        for rnd in range(cfg.get("close_rounds", 0) if close else 0):
            one_round(rounds + rnd, close, lambda key: max(1, iters[key] // rounds))
        for key in close:
            iters[key] = len(times[key])
        at = [round(began, 3), round(time.time(), 3)]
        # which of this rank's buffers sit on huge pages (rank 0's are recorded): what a peer's
        # single-copy read of them costs depends on it, and it depends on the process's history
        pages = {m: {k: buffer_share(v) for k, v in bufs[m].items()} for m in ms} if b.rank == 0 else {}
        wrong = {k: 0 for k in keys}
        if ref is not None:
            for key in keys:
                ref.prepare(bufs[key[1]])
                b.barrier()
                fns[key]()
                wrong[key] = ref.wrong(bufs[key[1]], key[0].partition("+")[2])
        vec = []
        for key in keys:
            vec += times[key] + [loops[key], wrong[key]] + list(usage[key])
        stats = b.gather_stats(np.array(vec, np.float64))
        # every mode of the table's columns, None where not run (refused, or a peer's other mode)
        out = {a: {m: None for m in ms} for a in algos}
        start = 0
        for algo, mode in keys:
            n = iters[(algo, mode)]
            blk = stats[:, start:start + n + 5]
            start += n + 5
            per_call = blk[:, :n].max(axis=0) if n else np.zeros(1)
            wrong_sum = int(blk[:, n + 1].sum())
            self.wrong_total += wrong_sum
            med = float(np.median(per_call))
            algbw, busbw = C.bandwidths(coll, size, b.size, med)
            rec = {
                "backend": _hook(b, "backend_of", b.name)(algo), "transport": _hook(b, "transport_of", b.transport)(algo),
                "collective": coll,
                "algorithm": algo,
                "resolved": b.resolve(coll, algo, size, dtype), "mode": mode, "world_size": b.size,
                "dtype": dtype, "op": op, "root": root if coll in C.ROOTED else -1,
                "bytes": size, "count": count, "iters": n, "warmup": cfg["warmup"],
                "rounds": rounds + (cfg.get("close_rounds", 0) if (algo, mode) in close else 0),
                "time_us": {"median": med * 1e6, "min": float(per_call.min()) * 1e6,
                            "max": float(per_call.max()) * 1e6,
                            "loop_avg": float(blk[:, n].max()) / max(n, 1) * 1e6},
                "algbw_GBps": algbw, "busbw_GBps": busbw,
                # every rank's usage summed, per call
                "cpu_us": float(blk[:, n + 2].sum()) / max(n, 1) * 1e6,
                "switches": {"voluntary": float(blk[:, n + 3].sum()) / max(n, 1),
                             "involuntary": float(blk[:, n + 4].sum()) / max(n, 1)},
                "wrong": wrong_sum if ref is not None else None,
                "at": at,  # rank 0's wall clock (epoch seconds) when this size's rounds began and ended
            }
            shares = {k: v for k, v in pages.get(mode, {}).items() if v is not None}
            if shares:  # rank 0's send / recv buffers' share on 2 MiB pages (commlib/bench/huge_pages.py)
                rec["huge_pages"] = {k: round(v, 4) for k, v in shares.items()}
            if (algo, mode) in close:  # more rounds: a close decision (close_calls.py)
                rec["close_rounds"] = cfg["close_rounds"]
            if hasattr(b, "ran_path"):  # the device bench: the path the calls ran on
                rec["path"] = b.ran_path(algo)
            if "+" in algo:  # --compress: the record's series is "<algorithm>+<codec>"
                rec["compress"] = algo.split("+", 1)[1]
            out[algo][mode] = rec
            if b.rank == 0:
                self.records.append(rec)
        return out
