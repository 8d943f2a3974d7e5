"""Streaming stores off and on: ``commlib bench --stream-ab``.

`commlib tune` finds from which call size a collective's copies are faster written with streaming
(non-temporal) stores, per collective and world size (stream_tuning.py). The local run then starts
commlib's job once per side in every pass, one with COMMLIB_STREAM_BYTES=0 (no call streams) and one
with COMMLIB_STREAM_BYTES=1 (every call streams its copies of 64 KiB or more), in the order of the
passes (the second pass reverses it); each job's algorithms are named by their side,
``<algorithm>@nt0`` and ``<algorithm>@nt1``, and `commlib tune` reads them as two runs would be read
(``split_records``).

Why separate jobs, not a sub-communicator per side in one job (as --single-copy-ab does): a streaming
store leaves its line in memory, not in the cache, so a call that streamed makes the next call on the
same buffers (whatever its own stores) start from memory. With the sides' rounds interleaved on shared
buffers, each side paid for the other: on the Intel Xeon VMs the out-of-place 8 MiB all_gather measured
alike on both sides in one job (2102 / 2009 us) while jobs of one side each measured it 1.35x apart
(bench/RESULTS_collectives.md, session 41). A job of one side is what a program of that setting runs.
"""
from __future__ import annotations

SIDES = ("0", "1")  # COMMLIB_STREAM_BYTES of each side's job: never, always


def variant(algorithm: str, side: str) -> str:
    return f"{algorithm}@nt{side}"


def parse(name: str):
    """"ring@nt1" -> ("ring", "1"); any other name -> (name, None)."""
    algo, _, tail = name.rpartition("@nt")
    if algo and tail in SIDES:
        return algo, tail
    return name, None


def job_name(job: str, side) -> str:
    """The local run's name of ``job`` run on ``side`` ("commlib+mpi@nt0"; ``job`` itself for no side)."""
    return job if side is None else variant(job, side)


def parse_job(job: str):
    """(job, side) of a local run's job name; side None for a job that is no side's."""
    return parse(job)


def job_env(side) -> dict:
    """The environment a side's job runs with ({} for none)."""
    return {} if side is None else {"COMMLIB_STREAM_BYTES": side}


def named_side(records, side, info=None):
    """A side's job's records with commlib's algorithms named by the side; others as they are. ``info``:
    the job's (rank_process.run_backend), whose ``stream_bytes`` must be the side's setting, else the
    setting did not reach the ranks (a launcher that does not pass the environment on) and the records
    would be named for a side they did not run: RuntimeError."""
    if side is None:
        return records
    if info is not None and info.get("stream_bytes") != side:
        raise RuntimeError(f"commlib bench --stream-ab: the job of side {side} ran with COMMLIB_STREAM_BYTES="
                           f"{info.get('stream_bytes')!r} (the setting did not reach its ranks)")
    return [dict(r, algorithm=variant(r["algorithm"], side)) if r.get("backend") == "commlib" else r
            for r in records]


def split_records(records):
    """Records of such runs as `commlib tune` reads separate runs: ``ring@nt1`` becomes ``ring`` with
    ``stream_stores`` "1" (and "0" likewise); other records are returned as they are."""
    out = []
    for r in records:
        algo, side = parse(r.get("algorithm", ""))
        out.append(r if side is None else dict(r, algorithm=algo, stream_stores=side))
    return out
