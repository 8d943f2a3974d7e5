"""``commlib store``: serve the rendezvous store as its own process, so that it outlives every rank.

    commlib store --host 10.0.0.1 --port 29500     # then COMMLIB_STORE=10.0.0.1:29500 on every rank

The same server as the one rank 0 serves in its process (commlib/bootstrap/store_server.py: the
same limits), storing only values signed with the job's key when ``COMMLIB_SECRET`` is set in this
process's environment (set the same secret as the ranks'). It prints where it listens on one line
(with ``--port 0``, the port it picked), serves until SIGTERM or SIGINT, then answers pending
blocking GETs "not set", closes every connection and exits 0. docs/fault_tolerance.md says when to
use it.
"""
from __future__ import annotations

import argparse
import signal
import sys

from commlib.bootstrap.secret import store_key
from commlib.bootstrap.store_server import StoreServer

DEFAULT_PORT = 29500
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def add_arguments(p: argparse.ArgumentParser):
    p.add_argument("--host", default="127.0.0.1",
                   help="the one address to bind (default 127.0.0.1; for a multi-host job, the address of the "
                        "interface the ranks reach)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"port to listen on (default {DEFAULT_PORT}; 0: a free one, printed)")


def run(args) -> int:
    """Serve until SIGTERM or SIGINT; 0 then, 1 if the address cannot be served, 2 for a bad argument."""
    if not 0 <= args.port < 65536:
        print(f"commlib store: --port: expected 0..65535, got {args.port}", file=sys.stderr)
        return 2
    host = "127.0.0.1" if args.host == "localhost" else args.host
    # The stop signals are recorded, never raised: blocking them in this thread is not enough, as
    # the threads importing commlib started (numpy's, torch's) do not block them, and a SIGINT the
    # kernel hands to one of those runs Python's default handler, a KeyboardInterrupt in the middle
    # of whatever this thread does (seen: while printing the start line). Blocked here before the
    # server's thread starts (it inherits the mask), so a signal sent to this process waits for
    # sigtimedwait below, or reaches the handler if another thread takes it.
    stops: list[int] = []
    previous = {s: signal.signal(s, lambda sig, _frame: stops.append(sig)) for s in STOP_SIGNALS}
    saved = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        try:
            key = store_key()
            server = StoreServer(host, args.port, key=key)
        except ValueError as e:  # a COMMLIB_SECRET too short to be one
            print(f"commlib store: {e}", file=sys.stderr)
            return 2
        except OSError as e:
            print(f"commlib store: cannot serve on {host}:{args.port} ({e.strerror or e}); pick a free --port",
                  file=sys.stderr)
            return 1
        try:
            where = f"[{host}]:{server.port}" if ":" in host else f"{host}:{server.port}"
            signing = "values signed with COMMLIB_SECRET only" if key else "no COMMLIB_SECRET: values unsigned"
            print(f"commlib store: serving on {where} ({signing}); on every rank: COMMLIB_STORE={where}", flush=True)
            while not stops:  # (the timeout lets a handler that another thread's signal queued run)
                got = signal.sigtimedwait(STOP_SIGNALS, 0.5)
                if got is not None:
                    stops.append(got.si_signo)
        finally:
            server.close()
        print(f"commlib store: stopped ({signal.Signals(stops[0]).name})", flush=True)
        return 0
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, saved)
        for s, handler in previous.items():
            signal.signal(s, handler)
