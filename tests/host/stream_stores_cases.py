"""Rank-side cases of test_stream_stores.py: which calls write their copies with streaming stores
(Communicator.streamed_calls), from the tuning's "stream" entries or COMMLIB_STREAM_BYTES, and
that every such call's result is exact."""
import numpy as np


def _calls(P):
    """(collective, algorithm, per-rank count, entries, streams when the entries decide) of the cases.
    Entries (the tuning file's "stream" section): all_gather from 64 KiB of per-rank input, all_to_all
    never, broadcast (the shared stream) from any size; all_reduce has none (the 32 MiB rule: its
    small call does not stream). all_gather is named: auto would send the smaller call through the
    flags, which copy nothing a call could stream."""
    return [
        ("all_gather", "direct", 16384, True),   # 64 KiB: the entry's size
        ("all_gather", "direct", 16383, False),  # one element under it
        ("all_to_all", "auto", 4096, False),   # never
        ("broadcast", "shared", 32768, True),  # 128 KiB through the root's stream, from 0
        ("all_reduce", "auto", 4096, False),   # no entry, 16 KiB x P: under the rule's 32 MiB
    ]


def _run(comm, collective, algorithm, count):
    """One call; True when its result is exact."""
    P, r = comm.size, comm.rank
    x = (np.arange(count * (P if collective == "all_to_all" else 1)) % 251 + 7 * r).astype(np.float32)
    if collective == "all_gather":
        out = np.zeros(count * P, np.float32)
        comm.all_gather(out, x, algorithm=algorithm)
        return np.array_equal(out, np.concatenate([np.arange(count) % 251 + 7 * q for q in range(P)]).astype(np.float32))
    if collective == "all_to_all":
        out = np.zeros(count * P, np.float32)
        comm.all_to_all(out, x, algorithm=algorithm)
        want = np.concatenate([(np.arange(count * P) % 251 + 7 * q)[r * count:(r + 1) * count] for q in range(P)])
        return np.array_equal(out, want.astype(np.float32))
    if collective == "broadcast":
        comm.broadcast(x, root=0, algorithm=algorithm)
        return np.array_equal(x, (np.arange(count) % 251).astype(np.float32))
    comm.all_reduce(x, algorithm=algorithm)
    return np.array_equal(x, sum(np.arange(count) % 251 + 7 * q for q in range(P)).astype(np.float32))


def tuned_streaming(comm, rule_only=False):
    """With "stream" entries installed, each case's call streams exactly when its entry says (or, with
    ``rule_only``: COMMLIB_STREAM_BYTES is set, so its footprint rule alone decides and every case's
    call streams), and its result is exact. Returns the failures."""
    import commlib._C as _C
    from commlib.core.call_spec import COLLECTIVE
    from commlib.core import tuning
    P, r = comm.size, comm.rank
    failures = []
    _C.set_streaming_starts({COLLECTIVE["all_gather"]: {P: 65536}, COLLECTIVE["all_to_all"]: {P: -1},
                             COLLECTIVE["broadcast"]: {P: 0}})
    try:
        for collective, algorithm, count, streams in _calls(P):
            if rule_only:
                streams = True  # COMMLIB_STREAM_BYTES=1000: every case's outputs hold more
            if collective == "broadcast" and P > 1 and r == 0:
                streams = False  # the root writes its stream with plain stores: its readers take it from the cache
            before = comm._core.streamed_calls()
            ok = _run(comm, collective, algorithm, count)
            took = comm._core.streamed_calls() - before
            if not ok:
                failures.append(f"{collective} count={count} P={P} rank={r}: wrong result")
            if took != int(streams):
                failures.append(f"{collective} count={count} P={P} rank={r}: streamed {took} call(s), expected {int(streams)}")
    finally:
        tuning.load_default()
    return failures
