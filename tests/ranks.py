"""Compatibility re-export: the rank pool lives in :mod:`commlib.testing` now.

Tests written as ``from ranks import get_pool`` keep working; new code imports commlib.testing.
"""
from commlib.testing import RankFailure, RankPool, close_pools, get_pool  # noqa: F401
