"""Row 4: garbage under `commlib/split*` keys.

Before: a rank died with `ValueError: invalid literal for int()` and the others timed out. Now every
split entry is parsed strictly; the rank that finds a bad one tells the others, and every rank
raises RendezvousError naming the entry.
"""
import pytest

import commlib


class _Rewriting:
    """A store in the middle that replaces what rank 1 writes under split keys with ``junk``."""

    def __init__(self, inner, junk):
        self.inner, self.junk = inner, junk

    def set(self, key, value):
        self.inner.set(key, self.junk if "/in/1" in key else value)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def split_with_junk(comm, junk):
    store = comm._store
    if comm.rank == 1:
        comm._store = _Rewriting(store, junk)
    try:
        comm.split(0, timeout=10)
    except commlib.RendezvousError as e:
        return str(e)
    finally:
        comm._store = store
    return None


@pytest.mark.parametrize("junk", [b"garbage", b"0:x", b'{"color": "0", "key": 1}', b'{"color": true, "key": 1}',
                                  b'{"color": -3, "key": 1}', b"\xff\xfe", b'{"color": 0}'])
def test_every_rank_raises_rendezvous_error(pool, junk):
    errors = pool(2).run(split_with_junk, junk, timeout=30)
    assert all(e is not None and "rank 1's entry" in e for e in errors), errors
