"""Rank-side checks of compress='s streaming (host/compressed_lowering.cc, docs/compression.md):
a message coded in pieces carries exactly the values of the message coded whole, so every
output is bitwise the same whatever COMMLIB_COMPRESS_PIECE_BYTES is (0: whole messages)."""
from __future__ import annotations

import contextlib
import hashlib
import os

import numpy as np

import commlib
from commlib.codecs import Codec

PIECES = ("0", "32", "4096")  # whole; one block of float32 (8 elements); 128 blocks
CODECS = (Codec("int8", 8), Codec("int4", 8), Codec("int4", 7, "stochastic", seed=3), Codec("fp8_e4m3", 8),
          Codec("bf16"))
COUNT = 1531  # prime: pieces end mid-block and all_gather's blocks end mid-piece


@contextlib.contextmanager
def piece_setting(value: str):
    old = os.environ.get("COMMLIB_COMPRESS_PIECE_BYTES")
    os.environ["COMMLIB_COMPRESS_PIECE_BYTES"] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ["COMMLIB_COMPRESS_PIECE_BYTES"]
        else:
            os.environ["COMMLIB_COMPRESS_PIECE_BYTES"] = old


def streamed(comm, value: str):
    """A communicator over comm's ranks that codes in pieces of `value` bytes (read at creation)."""
    with piece_setting(value):
        return comm.split(0)


def _digest(a: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(a).tobytes()).hexdigest()


def digests_by_piece(comm):
    """{piece: [(case, digest)]} for every proven algorithm x codec x collective at COUNT."""
    p, r = comm.size, comm.rank
    rng = np.random.default_rng(7 + r)
    x = (rng.standard_normal(COUNT * p) * (1 + r)).astype(np.float32)
    out = {}
    for value in PIECES:
        sub = streamed(comm, value)
        rows = []
        try:
            for collective in ("all_reduce", "reduce_scatter", "all_gather"):
                for algo in commlib.algorithms(collective):
                    try:
                        commlib.codecs.verify(collective, algo, p, COUNT)
                    except commlib.VerificationError:
                        continue
                    for codec in CODECS:
                        if collective == "all_reduce":
                            res = np.zeros(COUNT, np.float32)
                            sub.all_reduce(x[:COUNT], out=res, algorithm=algo, compress=codec)
                        elif collective == "reduce_scatter":
                            res = np.zeros(COUNT, np.float32)
                            sub.reduce_scatter(res, x, algorithm=algo, compress=codec)
                        else:
                            res = np.zeros(COUNT * p, np.float32)
                            sub.all_gather(res, x[:COUNT], algorithm=algo, compress=codec)
                        shard = f" rank {r}" if collective == "reduce_scatter" else ""  # each its own
                        rows.append((f"{collective} {algo} {codec.name}/{codec.block_size}/{codec.rounding}{shard}",
                                     _digest(res)))
        finally:
            sub.close()
        out[value] = rows
    return out


def mismatched_pieces(comm):
    """Ranks whose piece settings differ meet in a MismatchError naming compress= (the piece size
    lays the message out, so it is part of the codec's word in the call descriptor)."""
    sub = streamed(comm, "64" if comm.rank == 0 else "128")
    try:
        x = np.ones(1000, np.float32)
        try:
            sub.all_reduce(x, compress="int8")
        except commlib.MismatchError as e:
            return "compress" in str(e)
        return False
    finally:
        sub.close()
