"""NCCL's bootstrap for the stream engine's device calls (csrc/stream/nccl_link.h): agreeing on the
link setting, and the NCCL communicator's lazy creation.

The link of every pair is chosen in C++ (csrc/stream/device_link.h, at the engine's connect) from
``COMMLIB_DEVICE_LINK`` and the host map: ``auto`` puts ranks of one host on peer memory (ipc) and
ranks on different hosts on NCCL; ``ipc`` or ``nccl`` force every pair. Here, only what needs the
store: every rank publishes the setting its engine read and compares before the choice
(``agree_link_setting``), and the NCCL communicator is created on first use: at the engine's
set-up if the engine says some pair uses the nccl link (``needs_nccl``), else at the first
``algorithm="nccl"`` call. Every rank publishes what it is about to do (the link setting, or the
first NCCL call) through the store and compares before anything blocks in NCCL: ranks that
disagree raise ``MismatchError`` naming both. Rank 0's unique id goes through
the store and must be exactly 128 bytes. On the emulated device the NCCL is the emulated one
(device/emulated/nccl_emulated.h, a test double of NCCL's API semantics); on CUDA, libnccl from
``commlib.device.nccl.candidates()``.
"""
from __future__ import annotations

import time

from commlib.bootstrap.wait import report, reported_failure, wait_for_key
from commlib.errors import CommError, MismatchError

ID_BYTES = 128


def _wait(ctx, key: str, what: str, error_key: str = "") -> bytes:
    """The store value under ``key`` within the communicator's timeout; CommError at once if a
    rank published a failure under ``error_key``."""
    return wait_for_key(
        ctx.store, key, time.monotonic() + ctx.timeout, error_key=error_key,
        on_error=lambda why: reported_failure(why, ctx.rank, lambda w: CommError(f"NCCL set-up failed on another rank: {w}")),
        on_timeout=lambda: CommError(f"NCCL set-up: rank {ctx.rank} waited {ctx.timeout:g} s (COMMLIB_TIMEOUT) "
                                     f"for {what}"))


def _agree(ctx, base: str, mine: str, what: str):
    """Every rank publishes ``mine``; MismatchError naming both sides where one differs."""
    ctx.store.set(f"{base}/{ctx.rank}", mine)
    for r in range(ctx.size):
        if r == ctx.rank:
            continue
        theirs = _wait(ctx, f"{base}/{r}", f"rank {r}'s {what}").decode(errors="replace")
        if theirs != mine:
            raise MismatchError(f"rank {ctx.rank} has {what} {mine} but rank {r} has {theirs}")


def duplicate_gpus(identities):
    """The first two ranks whose (host, CUDA device) is the same, or None. ``identities``: one
    "host/device" string per rank. NCCL refuses such a communicator ("Duplicate GPU detected")."""
    seen = {}
    for rank, ident in enumerate(identities):
        if ident.split("/", 1)[-1].startswith(("cuda:", "emulated:")) and ident in seen:
            return seen[ident], rank
        seen.setdefault(ident, rank)
    return None


def _refuse_duplicate_gpus(ctx, engine, base: str):
    """A clear error before ncclCommInitRank where two ranks share a GPU (NCCL's own is an
    internal error after a hang-prone init). The emulated NCCL refuses them too, as NCCL does."""
    mine = f"{ctx.core.host_of[ctx.rank]}/{engine.device_name}"
    ctx.store.set(f"{base}/gpu/{ctx.rank}", mine)
    ids = [mine if r == ctx.rank else _wait(ctx, f"{base}/gpu/{r}", f"rank {r}'s GPU").decode(errors="replace")
           for r in range(ctx.size)]
    dup = duplicate_gpus(ids)
    if dup is not None:
        a, b = dup
        raise CommError(f"NCCL refuses two ranks on one GPU: ranks {a} and {b} are both on {ids[a]} "
                        "(use COMMLIB_DEVICE_LINK=ipc for ranks sharing a GPU, or one GPU per rank; "
                        "emulated: COMMLIB_EMULATED_DEVICE or commlib.emulated.set_device per rank)")


def _create(ctx, engine, base: str):
    """ncclGetUniqueId on rank 0, the id through the store, ncclCommInitRank everywhere."""
    from commlib.device import nccl
    try:  # libnccl missing (the error lists what was tried), no unique id: the others hear at once
        engine.nccl_load(nccl.candidates())
        if ctx.rank == 0:
            uid = bytes(engine.nccl_unique_id())
            if len(uid) != ID_BYTES:
                raise CommError(f"ncclGetUniqueId returned {len(uid)} bytes, expected {ID_BYTES}")
            ctx.store.set(f"{base}/id", uid)
    except Exception as e:
        ctx.store.set(f"{base}/error", report(ctx.rank, e))
        raise
    uid = _wait(ctx, f"{base}/id", "rank 0's NCCL unique id", f"{base}/error")
    if len(uid) != ID_BYTES:  # the store is not trusted: NCCL reads exactly 128 bytes
        raise CommError(f"NCCL unique id from the store: expected {ID_BYTES} bytes, got {len(uid)}")
    if getattr(engine, "device_name", "").startswith(("cuda:", "emulated:")):
        _refuse_duplicate_gpus(ctx, engine, base)
    engine.nccl_init(uid)


def agree_link_setting(ctx, engine, prefix: str):
    """Before the engine's connect chooses the links: every rank's engine read the same
    ``COMMLIB_DEVICE_LINK`` (MismatchError naming both sides otherwise)."""
    if ctx.size > 1:
        _agree(ctx, f"{prefix}/link", f"COMMLIB_DEVICE_LINK={engine.link_setting}", "the device link setting")


def setup_links(ctx, engine, prefix: str):
    """After the engine's connect: create the NCCL communicator if some pair of the communicator
    uses the nccl link (every rank joins it, whatever its own pairs use)."""
    if ctx.size > 1 and engine.needs_nccl():
        _create(ctx, engine, f"{prefix}/nccl")


def ensure_communicator(ctx, engine, prefix: str, call: str):
    """Before an ``algorithm="nccl"`` call (``call`` describes it): create the communicator if
    this is the first use."""
    engine.raise_if_failed()  # an aborted communicator is the engine's error, not a new one to create
    if engine.nccl_ready():
        return
    _agree(ctx, f"{prefix}/nccl/first", call, "as its first NCCL call")
    _create(ctx, engine, f"{prefix}/nccl")
