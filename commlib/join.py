"""``commlib.join``: a replacement process joins a running job (docs/fault_tolerance.md, "Growing
back"); the job's members admit it with ``Communicator.grow`` (commlib/core/grow.py)."""
from __future__ import annotations

from typing import Optional

from commlib.bootstrap.secret import secured
from commlib.bootstrap.store_lease import StoreLease
from commlib.core import grow
from commlib.core.call_checks import as_seconds
from commlib.core.communicator import Communicator
from commlib.init import _default_store, _Rendezvous, create, debug_level, default_timeout


def join(store=None, master_addr: Optional[str] = None, master_port: Optional[int] = None,
         timeout: Optional[float] = None, prefix: str = "commlib") -> Communicator:
    """Join the running job whose store this is, once its members call ``comm.grow()``; returns
    the grown communicator (this process's rank follows the members', in the order joiners asked).

    The store is found as ``commlib.init`` finds it (``store=``, ``master_addr``/``master_port``,
    ``COMMLIB_STORE``, torchrun's agent store, MASTER_ADDR:MASTER_PORT), except that a joiner
    never serves one. ``prefix`` is the job's: the one its ranks gave ``commlib.init``. Raises
    RendezvousError naming what it waited for when no grow admits it within ``timeout`` (seconds,
    default COMMLIB_TIMEOUT) or when the job refuses it (another commlib version or setting, named),
    and PeerError when a rank died during the grow (join again).
    """
    timeout = as_seconds(timeout)
    if timeout is None:
        timeout = default_timeout()
    if not isinstance(prefix, str) or not prefix:
        raise TypeError(f"prefix: expected the job's non-empty prefix (a str), got {prefix!r}")
    debug_level()  # a bad COMMLIB_DEBUG is refused before the store is reached
    owned = store is None
    if owned:
        store, _ = _default_store(-1, None, master_addr, master_port, timeout)  # rank -1: never serves
    try:
        comm = grow.join(secured(store), prefix, timeout, _Rendezvous, create)
    except BaseException:
        if owned:
            store.close()
        raise
    comm._job = prefix
    if owned:  # shared with every communicator built over it, as init()'s
        comm._hold_store(StoreLease(store, None, timeout))
    return comm
