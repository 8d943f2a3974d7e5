"""The store's wire format and limits, shared by the server (store_server.py) and the client
(store.py).

Frames are ``u32_be length || bytes``. A request is a one-byte command frame followed by its
fields: SET key value, GET key timeout(f64), ADD key delta(i64), CHECK key, HELLO. Replies are one
frame: SET b"" (or b"refused: why"), GET b"\\x01" + value or b"\\x00", ADD i64 (or b"refused:
why"), CHECK b"\\x01"/b"\\x00", HELLO ``HELLO_REPLY``.
"""
from __future__ import annotations

import struct
from typing import Optional

SET, GET, ADD, CHECK, HELLO = 1, 2, 3, 4, 5
HELLO_REPLY = b"commlib-store/1"
REFUSED = b"refused: "
MAX_FRAME = 4 << 20            # a key or value; rendezvous values are a few hundred bytes
MAX_CONNECTIONS = 512
MAX_DATA_BYTES = 256 << 20     # keys plus values held by the server
MAX_IN_FLIGHT_BYTES = 32 << 20  # bytes held for unanswered requests, all connections together
RECV_STEP = 256 << 10          # bytes taken from one connection at a time
# The longest one blocking GET waits on the server: a client that wants longer asks again (the
# client, commlib.store.TCPStore, does so by itself), so an outsider's GET cannot hold a slot
# longer than this.
MAX_GET_WAIT_S = 60.0
_FIELDS = {SET: (MAX_FRAME, MAX_FRAME), GET: (MAX_FRAME, 8), ADD: (MAX_FRAME, 8), CHECK: (MAX_FRAME,), HELLO: ()}


def max_request() -> int:
    """The largest request a client may send: a SET of a full key and value, with its prefixes."""
    return 4 + 1 + 2 * (4 + MAX_FRAME)


class Malformed(Exception):
    """A frame that breaks the protocol: the connection is closed."""


def frames(*parts: bytes) -> bytes:
    return b"".join(struct.pack("!I", len(p)) + p for p in parts)


def parse_request(buf) -> Optional[tuple]:
    """(command, fields, bytes used) for the whole request at the start of ``buf``, or None while
    more bytes are needed. Raises Malformed as soon as a length prefix or command is impossible."""
    pos, out = 0, []
    limits = (1,)
    while len(out) < len(limits):
        if len(buf) < pos + 4:
            return None
        (n,) = struct.unpack_from("!I", buf, pos)
        if n > limits[len(out)]:  # refused from the prefix: a frame may announce gigabytes
            raise Malformed(f"frame of {n} bytes exceeds the {limits[len(out)]}-byte limit")
        if len(buf) < pos + 4 + n:
            return None
        with memoryview(buf) as view:  # one copy of the field (a slice of a bytearray is another)
            out.append(bytes(view[pos + 4:pos + 4 + n]))
        pos += 4 + n
        if len(out) == 1:
            if len(out[0]) != 1:
                raise Malformed("empty command")
            if out[0][0] not in _FIELDS:
                raise Malformed(f"unknown command {out[0][0]}")
            limits = (1,) + _FIELDS[out[0][0]]
    return out[0][0], out[1:], pos
