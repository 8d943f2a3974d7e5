"""The names README and docs/ document as commlib.<module> still import after the package was
grouped into layers (bootstrap/, core/, device/): each is the moved module itself, not a copy."""
import importlib

import pytest

import commlib

MOVED = {
    "commlib.store": "commlib.bootstrap.store",
    "commlib.secret": "commlib.bootstrap.secret",
    "commlib.communicator": "commlib.core.communicator",
    "commlib.schedules": "commlib.core.schedules",
    "commlib.tuning": "commlib.core.tuning",
    "commlib.work": "commlib.core.work",
    "commlib.emulated": "commlib.device.emulated",
    "commlib.nccl": "commlib.device.nccl",
    "commlib.codecs": "commlib.core.codecs",
}


@pytest.mark.parametrize("public,moved", sorted(MOVED.items()))
def test_documented_module_is_the_moved_one(public, moved):
    assert importlib.import_module(public) is importlib.import_module(moved)
    assert getattr(commlib, public.rpartition(".")[2]) is importlib.import_module(moved)


def test_documented_names_import():
    from commlib.emulated import current_stream
    from commlib.errors import CommError, RendezvousError
    from commlib.store import StoreServer, TCPStore
    from commlib.testing import RankPool

    assert callable(current_stream) and callable(commlib.secret.handshake_key)
    assert callable(commlib.nccl.candidates) and TCPStore and StoreServer and RankPool
    assert commlib.bootstrap.Topology.__module__ == "commlib.bootstrap.hosts"
    assert issubclass(RendezvousError, CommError)
    assert commlib.settings.__name__ == "commlib.settings" and callable(commlib.init)
    assert set(commlib.PUBLIC_MODULES) == {m.rpartition(".")[2] for m in MOVED}
