"""Inspect and verify collective schedules, no processes needed.

Every collective algorithm is a *schedule* (docs/DESIGN.md): per rank, a list of steps, each a set
of operations that run concurrently::

    send(peer, src)   recv(peer, dst)   recv_reduce(peer, dst[, src])   copy(dst, src)   reduce(dst, src)

``recv_reduce`` combines the incoming data with ``dst`` (or, given ``src``, with ``src``, writing
``dst``: a ring all_reduce reduces straight from its input into its output).

One-sided schedules (trait ``one_sided``: over buffers every peer has mapped) use instead::

    get(peer, dst, src)   get_reduce(peer, dst, src)   put(peer, dst, src)   signal(peer, tag)   wait(peer, tag)
    reduce_to_all(dst, src)   reduce_from_all(dst, src)

where a get's ``src`` and a put's ``dst`` are regions of the peer's buffers, ``reduce_to_all``
stores into ``dst`` of every rank the reduction of ``src`` of every rank in rank order (the fused
two-shot's block: read once, stored everywhere) and ``reduce_from_all`` the same into this rank's
``dst`` only (the fused reduce_scatter's block). A step runs its waits,
then its data ops, then its signals; a wait consumes one signal from ``peer`` with ``tag``. The
verifier proves the results and that every access of a peer's buffer is ordered by signals (see
docs/DESIGN.md, "The schedule IR"). No engine runs them yet: :func:`algorithms` lists them only with
``one_sided=True``.

A region is ``(buffer, offset, count)`` with buffer ``"input"``, ``"output"`` or ``"scratch"`` and
offsets/counts in elements. Buffer sizes per collective (``P`` ranks, ``count`` elements)::

    all_reduce      input[count]   -> output[count]
    all_gather      input[count]   -> output[P*count]   (block j = rank j's input)
    reduce_scatter  input[P*count] -> output[count]     (rank r gets block r reduced)
    all_to_all      input[P*count] -> output[P*count]   (out block j = rank j's in block r)
    broadcast       input[count] (root) -> output[count]
    reduce          input[count] -> output[count] (root only)
    gather          input[count] -> output[P*count] (root only)
    scatter         input[P*count] (root) -> output[count]
    barrier         no data

Example::

    >>> import commlib
    >>> commlib.algorithms("all_reduce")
    ['ring', 'recursive_doubling', 'rabenseifner', 'direct', 'two_shot', 'tree', 'reduce_broadcast']
    >>> s = commlib.schedule("all_reduce", "ring", rank=0, size=3, count=6)
    >>> print(commlib.format_schedule(s, "all_reduce", rank=0, size=3, count=6))
    all_reduce/ring rank 0 of 3 count 6 (scratch 0)
      step 0: send(to 1, input[0:2]) | recv_reduce(from 2, output[4:6] <- input[4:6])
      step 1: send(to 1, output[4:6]) | recv_reduce(from 2, output[2:4] <- input[2:4])
      step 2: send(to 1, output[2:4]) | recv(from 2, output[0:2])
      step 3: send(to 1, output[0:2]) | recv(from 2, output[4:6])
    >>> commlib.verify("all_reduce", "ring", size=5, count=13)   # raises VerificationError on a bug
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import commlib._C as _C
from commlib.core import call_spec

__all__ = ["schedule", "algorithms", "algorithm_info", "register_algorithm", "verify", "format_schedule",
           "choose_algorithm", "VerificationError"]

#: Raised by :func:`verify` when a schedule is wrong; derives from ``AssertionError``. The message
#: names the collective, algorithm, size, count, root, buffer layout and the first wrong
#: rank/element (or the deadlocked rank and step).
VerificationError = _C.VerificationError


def algorithms(collective: str, one_sided: bool = False) -> List[str]:
    """Registered algorithm names of ``collective`` that communicators run (``"auto"`` is accepted
    too but not listed); ``one_sided=True`` lists the one-sided ones as well, which :func:`verify`
    proves, the simulator costs and the device kernel path runs (on device buffers only, when named)."""
    names = _C.algorithms(call_spec.collective(collective))
    if one_sided:
        return list(names)
    skip = {a["name"] for a in _C.algorithm_info(call_spec.collective(collective)) if "one_sided" in a["traits"]}
    return [n for n in names if n not in skip]


def schedule(collective: str, algorithm: str = "auto", rank: int = 0, size: int = 1, count: int = 0,
             root: int = 0, dtype: str = "float32") -> Dict[str, Any]:
    """One rank's schedule as plain data.

    Returns ``{"steps": [[op, ...], ...], "scratch_count": int, "algorithm": str, "lanes": int}``
    (``lanes``: the steps are that many equal runs, each waiting only for its own: docs/DESIGN.md
    "Lanes"; 1 for all but laned algorithms) where each op
    is ``{"op": "send"|"recv"|"recv_reduce"|"copy"|"reduce"|"get"|"get_reduce"|"put"|"signal"|"wait"|
    "reduce_to_all"|"reduce_from_all",
    "peer": int|None, "dst": (buffer, offset, count)|None, "src": (buffer, offset, count)|None}``
    (signal and wait add ``"tag": int``) and
    ``algorithm`` is the resolved name (``"auto"`` resolves from ``count * dtype size``).
    Bad arguments raise ``ValueError`` naming the argument.
    """
    return _C.schedule(call_spec.collective(collective), algorithm, rank, size, count, root, call_spec.dtype(dtype))


def verify(collective: str, algorithm: str, size: int, count: int, root: int = 0,
           dtype: str = "float32") -> str:
    """Run every rank's schedule symbolically and check the result (both buffer layouts: separate
    buffers and in-place), plus deadlock freedom, op independence and buffer bounds.

    Returns the algorithm verified (``"auto"`` resolves for ``count`` elements of ``dtype``);
    raises :class:`VerificationError` on a wrong schedule. Supports 1..64 ranks.
    """
    return _C.verify(call_spec.collective(collective), algorithm, size, count, root, call_spec.dtype(dtype))


def algorithm_info(collective: str) -> List[Dict[str, Any]]:
    """The registered algorithms of ``collective`` with what their builders declare:
    ``[{"name", "traits": [...], "summary"}]`` in index order. Traits: ``small_messages``
    (latency-bound design), ``large_messages`` (bandwidth-optimal), ``power_of_two`` (fully
    efficient only at power-of-two world sizes), ``user_defined`` (registered from Python),
    ``one_sided`` (reads and writes peers' mapped buffers; the device kernel path runs it, docs/gpu.md)."""
    return list(_C.algorithm_info(call_spec.collective(collective)))


def register_algorithm(collective: str, name: str, builder: Callable[[int, int, int, int], Any],
                       summary: str = "") -> None:
    """Add an algorithm written in Python: ``builder(rank, size, count, root)`` returns one rank's
    schedule in :func:`schedule`'s format (a dict with ``steps`` and optionally ``scratch_count``,
    or just the list of steps).

    The algorithm is then listed by :func:`algorithms`, proven by :func:`verify`, runs on
    communicators (``algorithm=name``) and in ``commlib bench --algorithms``. Schedules are built
    once per call shape and cached. Every rank must register the same algorithms in the same order
    (calls name their algorithm by index). A schedule that references memory outside its buffers or
    a peer that does not exist is refused before it runs; :func:`verify` proves the rest.
    """
    if not callable(builder):
        raise TypeError(f"builder: expected a callable, got {type(builder).__name__}")
    _C.register_algorithm(call_spec.collective(collective), name, builder, summary)


def unregister_algorithm(collective: str, name: str) -> None:
    """Remove ``name``, the algorithm most recently added with :func:`register_algorithm` for
    ``collective`` (only that one: the indices calls carry must not move). For tests and
    notebooks that add algorithms temporarily; every rank must remove the same ones."""
    _C.unregister_algorithm(call_spec.collective(collective), name)


def choose_algorithm(collective: str, algorithm: str, bytes: int, size: int) -> str:
    """Resolve ``"auto"`` (env ``COMMLIB_ALGO_<COLLECTIVE>``, tuning table, heuristic)."""
    return _C.choose_algorithm(call_spec.collective(collective), algorithm, bytes, size)


def _region(r: Optional[tuple]) -> str:
    if r is None:
        return "-"
    buf, off, n = r
    return f"{buf}[{off}:{off + n}]"


def _op(o: Dict[str, Any]) -> str:
    k = o["op"]
    if k == "send":
        return f"send(to {o['peer']}, {_region(o['src'])})"
    if k in ("get", "get_reduce"):
        return f"{k}(from {o['peer']}, {_region(o['dst'])} <- {_region(o['src'])})"
    if k == "put":
        return f"put(to {o['peer']}, {_region(o['dst'])} <- {_region(o['src'])})"
    if k in ("signal", "wait"):
        return f"{k}({o['peer']}, tag {o['tag']})"
    if k == "reduce_to_all":
        return f"reduce_to_all(every rank's {_region(o['dst'])} <- every rank's {_region(o['src'])})"
    if k == "reduce_from_all":
        return f"reduce_from_all({_region(o['dst'])} <- every rank's {_region(o['src'])})"
    if k in ("recv", "recv_reduce"):
        src = f" <- {_region(o['src'])}" if o.get("src") else ""
        return f"{k}(from {o['peer']}, {_region(o['dst'])}{src})"
    return f"{k}({_region(o['dst'])} <- {_region(o['src'])})"


def format_schedule(sched: Dict[str, Any], collective: Optional[str] = None,
                    rank: Optional[int] = None, size: Optional[int] = None,
                    count: Optional[int] = None) -> str:
    """Pretty-print a schedule from :func:`schedule`, one line per step (ops separated by ``|``).

    The optional arguments only decorate the header line.
    """
    head = []
    if collective:
        head.append(f"{collective}/{sched.get('algorithm', '?')}")
    elif "algorithm" in sched:
        head.append(str(sched["algorithm"]))
    if rank is not None:
        head.append(f"rank {rank}" + (f" of {size}" if size is not None else ""))
    if count is not None:
        head.append(f"count {count}")
    lines = [(" ".join(head) + " " if head else "") + f"(scratch {sched.get('scratch_count', 0)})"]
    width = len(str(max(len(sched["steps"]) - 1, 0)))
    for i, step in enumerate(sched["steps"]):
        lines.append(f"  step {i:>{width}}: " + " | ".join(_op(o) for o in step))
    return "\n".join(lines)
