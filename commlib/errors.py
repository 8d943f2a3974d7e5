"""Exceptions raised by commlib.

``CommError`` is the base of every communication failure. ``MismatchError`` means ranks called
different collectives (or the same one with a different count, dtype, op, root or algorithm);
``PeerError`` means a peer died, closed its communicator or stopped answering within the timeout.
After either, the communicator is aborted: every later call raises ``CommError`` at once.

The classes are created by the C++ core (so C++ can raise them) and re-exported here.
"""
from commlib._C import CommError, MismatchError, PeerError

__all__ = ["CommError", "MismatchError", "PeerError"]
