"""The device route's public seam: what the stream engine's set-up needs from the communicator it
serves, and nothing else.

``commlib.core.Communicator`` builds one ``RouteContext`` when it first meets a device buffer and hands
it to ``commlib.core.device_route.DeviceRoute``; the route and the NCCL set-up
(``commlib.device.nccl_comm``) read only these fields, never the communicator's private state.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RouteContext:
    """The communicator as the device route sees it (all fixed for the communicator's life).

    ``core``: the C++ communicator (``_C.Communicator``), which the stream engine runs beside and
    whose ``host_of`` says which peers share a host; ``store``: the rendezvous store (``set``,
    ``get``, ``check``); ``prefix``: the communicator's store namespace, under which each engine's
    set-up keys live; ``rank``, ``size``; ``timeout``: seconds any set-up wait may take
    (COMMLIB_TIMEOUT).
    """

    core: Any
    store: Any
    prefix: str
    rank: int
    size: int
    timeout: float
