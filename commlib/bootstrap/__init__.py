"""Rendezvous pieces below the communicator: the key-value store (store, and its server in
store_server), file descriptors passed between the ranks of one host (fdpass), the shared secret
that signs what goes through the store (secret), and who is on which host (hosts).
``commlib.init`` builds communicators from them."""
from commlib.bootstrap.hosts import Topology  # noqa: F401  (documented as commlib.bootstrap.Topology)
