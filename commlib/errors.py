"""Exceptions raised by commlib.

``CommError`` is the base of every communication failure. ``MismatchError`` means ranks called
different collectives (or the same one with a different count, dtype, op, root or algorithm);
``PeerError`` means a peer died, closed its communicator or stopped answering within the timeout.
After either, the communicator is aborted: every later call raises ``CommError`` at once.
``RendezvousError`` means the ranks could not find each other: the store did not answer (or
answered something that is not a commlib store), a rank disagreed on the world size, or a value read
from the store was malformed or not signed with ``COMMLIB_SECRET``. ``StoreLostError`` (a
RendezvousError) means the store's server went away: no rank can split, shrink or rendezvous
through it any more.

The first three classes are created by the C++ core (so C++ can raise them) and re-exported here.
"""
from commlib._C import CommError, MismatchError, PeerError


class RendezvousError(CommError):
    """The ranks could not rendezvous; the message names the store address or rank at fault."""


class StoreLostError(RendezvousError):
    """The connection to the store's server closed or was reset: the server is gone. When rank 0's
    process served it (``commlib.init()`` without a store), the message says the store died with
    rank 0 and how to run the job so the store outlives every rank (``commlib store``,
    ``COMMLIB_STORE``; docs/fault_tolerance.md)."""


__all__ = ["CommError", "MismatchError", "PeerError", "RendezvousError", "StoreLostError"]
