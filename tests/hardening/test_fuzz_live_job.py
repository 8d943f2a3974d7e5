"""Fuzz a live 2-rank job as a malicious peer and a malicious store would.

Each iteration makes a fresh communicator (split of the pool's), then either rank 1 writes random
chunk headers or random control-block fields into the live shared-memory region, or a store in the
middle replaces one rendezvous value with random bytes. Every rank must then either complete with
exactly the right result or raise CommError: never crash (the pool would report a dead rank), hang
(the pool's timeout) or return wrong data. Iterations are bounded and seeded.
"""
import json
import random
import struct

import numpy as np

import commlib
from hardening_util import CTL_CALL, CTL_CALL_VERSION, CTL_ERROR_KIND, CTL_MESSAGE, CTL_STATE, Region

_CHUNK = struct.Struct("<QBBBBiqQQI")
SEED = 20261123


def _attack_region(region, rng: random.Random, kind: str, seq: int, count: int):
    if kind == "random-header":
        region.publish_chunk(1, 0, rng.randbytes(48), rng.randbytes(64))
    elif kind == "near-valid-header":
        # The real call's descriptor with one of offset / bytes / flags wrong.
        fields = [seq, 0, 0, 0, 1, 0, count, 0, count * 4 // 2, 0]
        field = rng.choice([7, 8, 9])
        fields[field] = rng.choice([1, 3, 1 << 40, (1 << 64) - 1]) if field != 9 else rng.choice([1, 2, 0xFFFFFFFF])
        region.publish_chunk(1, 0, _CHUNK.pack(*fields), rng.randbytes(32))
    else:  # control block fields rank 0 reads about rank 1
        ctl = region.ctl(1)
        target = rng.choice([CTL_STATE, CTL_ERROR_KIND, CTL_CALL, CTL_MESSAGE, CTL_CALL_VERSION])
        region.write(ctl + target, rng.randbytes(rng.choice([4, 8, 24, 1024])))


def fuzz_shared_memory(comm, seed: int, iterations: int):
    rng = random.Random(seed)  # the same sequence on both ranks: they agree on each attack
    tally = {"completed": 0, "error": 0, "wrong": 0}
    for i in range(iterations):
        kind = rng.choice(["random-header", "near-valid-header", "control-block"])
        attack_seed = rng.getrandbits(32)
        sub = comm.split(0, timeout=5)
        count = 256
        try:
            if sub.rank == 1:
                _attack_region(Region(sub._prefix, 2), random.Random(attack_seed), kind, 1, count)
            comm.barrier()
            x = np.full(count, sub.rank + 1, np.float32)
            try:
                sub.all_reduce(x, algorithm="ring")
                tally["completed" if (x == 3).all() else "wrong"] += 1
            except commlib.CommError:
                tally["error"] += 1
        finally:
            comm.barrier()  # rank 1 must not unmap while rank 0 still reads its fields
            sub.close()
    return tally


def test_random_shared_memory_never_crashes_hangs_or_lies(pool):
    tallies = pool(2).run(fuzz_shared_memory, SEED, 30, timeout=120)
    assert all(t["wrong"] == 0 for t in tallies), tallies
    assert tallies[0]["error"] > 0, tallies  # the attacks did reach rank 0


class _Corrupting:
    """Replaces the value written under the key ending in ``suffix`` with ``junk``."""

    def __init__(self, inner, suffix, junk):
        self.inner, self.suffix, self.junk = inner, suffix, junk

    def set(self, key, value):
        self.inner.set(key, self.junk if key.endswith(self.suffix) else value)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _junk(rng: random.Random) -> bytes:
    palette = [0, 1, -1, 2, 1 << 70, True, None, "x", "../../etc/passwd", 1.5, [], {}]
    shape = rng.randrange(4)
    if shape == 0:
        return rng.randbytes(rng.randrange(0, 64))
    fields = {"pid", "size", "host", "socket", "bytes", "color", "key"}
    obj = {k: rng.choice(palette) for k in rng.sample(sorted(fields), rng.randrange(1, 6))}
    text = json.dumps(obj)
    return text[:rng.randrange(len(text) + 1)].encode() if shape == 1 else text.encode()


def fuzz_store(comm, plan):
    tally = {"completed": 0, "error": 0, "wrong": 0}
    store = comm._store
    for target_rank, suffix, junk in plan:
        if comm.rank == target_rank:
            comm._store = _Corrupting(store, suffix, junk)
        sub = None
        try:
            sub = comm.split(0, timeout=2)
        except commlib.CommError:
            tally["error"] += 1
        finally:
            comm._store = store
        comm.barrier()
        if sub is not None:
            try:
                x = np.full(64, sub.rank + 1, np.int64)
                sub.all_reduce(x)
                tally["completed" if (x == 3).all() else "wrong"] += 1
            except commlib.CommError:
                tally["error"] += 1
            finally:
                sub.close()
        comm.barrier()
    return tally


def test_random_store_values_never_crash_hang_or_lie(pool):
    rng = random.Random(SEED)
    suffixes = [(1, "/in/1"), (0, "/in/0"), (0, "c0/shm"), (1, "c0/mapped/1"), (0, "c0/ready")]
    plan = [(*rng.choice(suffixes), _junk(rng)) for _ in range(12)]
    tallies = pool(2).run(fuzz_store, plan, timeout=120)
    assert all(t["wrong"] == 0 for t in tallies), tallies
    assert all(t["error"] > 0 for t in tallies), tallies
