"""Helpers for testing and benchmarking code that runs on several ranks.

``RankPool(n)`` starts ``n`` long-lived rank processes, each holding a commlib communicator, and
runs module-level functions on all of them (``pool.run(fn, *args)``); ``get_pool`` caches pools
per world size and environment for a whole test session or benchmark script, ``close_pools``
shuts them down. The test suite (tests/conftest.py) and the bench scripts (bench/*.py) both start
their ranks here. See :mod:`commlib.testing.ranks`.
"""
from commlib.testing.extra_rank import ExtraRank, JoinablePool
from commlib.testing.ranks import RankFailure, RankPool, close_pools, get_pool

__all__ = ["ExtraRank", "JoinablePool", "RankFailure", "RankPool", "close_pools", "get_pool"]
