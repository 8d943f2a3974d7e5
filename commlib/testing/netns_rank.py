"""A rank of a :class:`commlib.testing.netns.NetnsRankPool`, started inside its namespace with
``ip netns exec ... python -m commlib.testing.netns_rank``.

It reaches the pool over the Unix socket named by its one argument, says which rank it is,
joins the job with a plain ``commlib.init()`` (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from
the environment, as under torchrun), then serves the pool's calls like any pool rank.
"""
import os
import socket
import sys
import traceback
from multiprocessing.connection import Connection

from commlib.testing.ranks import _prepare_rank_process, serve_calls


def main():
    _prepare_rank_process({})
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    conn = Connection(s.detach())
    conn.send(int(os.environ["RANK"]))
    try:
        import commlib
        comm = commlib.init(prefix="pool")
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    serve_calls(comm, conn)


if __name__ == "__main__":
    main()
