"""The TCP link's handshake frames as the tests that speak them by hand pack them
(csrc/transport/tcp/tcp_socket.h: Hello, Challenge, Verdict). One place to follow a protocol
change: a version or a field here that the library no longer speaks fails those tests' accepted
cases (an impostor refused for the wrong reason)."""
import struct

MAGIC = 0x31706374626c6d63
PROTOCOL_VERSION = 3   # tcp_socket.h kProtocolVersion (2: lane, lanes in the Hello; 3: ChunkHeader::lane)
CHUNK_HEADER_BYTES = 48  # sizeof(ChunkHeader)

HELLO = struct.Struct("<QII16sIIIiQ32sII")  # magic, version, header bytes, cid, ..., nonce, lane, lanes
CHALLENGE = struct.Struct("<QiI32s32s")
VERDICT = struct.Struct("<QII")


def hello(cid, pid, chunk, nonce, lane, lanes):
    """A Hello from rank 1 to rank 0 of a 2-rank world (the fields the tests vary are arguments)."""
    return HELLO.pack(MAGIC, PROTOCOL_VERSION, CHUNK_HEADER_BYTES, cid, 1, 0, 2, pid, chunk, nonce, lane, lanes)
