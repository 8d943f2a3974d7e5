"""The closing barrier of a device route's engines (commlib/core/device_route.py): each rank says it
closed its imports of the peers' exported memory; memory is freed only once every rank did."""
from __future__ import annotations

import time

from commlib.bootstrap.wait import wait_until
from commlib.core.shrink import gone_peers

# How often the barrier asks the control plane whether a rank it waits for is dead.
_PEER_CHECK_S = 0.1


class _NotAllClosed(Exception):
    """Ends the barrier's wait: the timeout passed, or a rank is gone before saying it closed."""


def closed_barrier(ctx, prefix, wait: bool = True) -> bool:
    """Says this rank closed its imports of ``prefix``'s engines; with ``wait``, whether every rank
    did (False on timeout, a failed store, or a rank that died or failed before saying so: nobody
    waits out the timeout for a SIGKILLed peer; without ``wait``, False at once)."""
    try:
        ctx.store.set(f"{prefix}/closed/{ctx.rank}", b"1")
        if not wait:
            return False
        keys = [f"{prefix}/closed/{r}" for r in range(ctx.size)]
        next_peer_check = time.monotonic() + _PEER_CHECK_S

        def check_peers():
            nonlocal next_peer_check
            now = time.monotonic()
            if now >= next_peer_check:
                next_peer_check = now + _PEER_CHECK_S
                if _gone_before_closing(ctx, keys):
                    raise _NotAllClosed()

        wait_until(lambda: ctx.store.check(keys), time.monotonic() + min(ctx.timeout, 30.0),
                   on_timeout=_NotAllClosed, poll=check_peers)
        return True
    except Exception:  # noqa: BLE001 - _NotAllClosed, or a store gone: leave the exported memory allocated
        return False


def _gone_before_closing(ctx, keys) -> bool:
    """Whether some rank that has not said it closed is gone (its process dead, its connection
    lost, or its communicator closed without close(): commlib.core.shrink.gone_peers); it never
    will say so. Exported memory is then left allocated, as after a timeout."""
    return any(not ctx.store.check([keys[r]]) for r in gone_peers(ctx.core))

