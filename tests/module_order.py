"""The order CI hands test modules to its xdist workers (tests/conftest.py applies it at collection).

A module of its own, not conftest's: several conftest.py files exist (tests/torch, tests/explain), so
`import conftest` in a test may find another one."""


# The longest modules, started first (the CI's --durations, session 26): scripts/test.sh's two
# xdist workers take whole modules (--dist loadfile) in collection order, and the run ends when the
# busier worker ends, so a long module collected late (tests/torch sorts near the end) left the
# other worker idle for its length. The rest keep their order after these; no test's outcome may
# depend on what ran before it in its worker (which worker takes which module is timing already).
STARTED_FIRST = (
    "tests/torch/test_torch_suite.py",  # its one run of torch's suite: 25-28 s
    "tests/sim/test_candidate_search.py",
    "tests/sim/test_rail_lanes_model.py",
    "tests/sim/test_rail_halving_model.py",
    "tests/torch/test_clean_exit.py",
    "tests/host/test_collectives.py",
    "tests/host/test_single_copy_reload.py",
    "tests/fault/test_shrink_recovery.py",
    "tests/sim/test_closed_forms.py",
    "tests/bootstrap/test_set_up_over_commlib_store.py",
)


def longest_modules_first(items):
    """Sorts collected `items` in place: STARTED_FIRST's modules first, in its order, the rest after
    them in their collection order."""
    rank = {m: i for i, m in enumerate(STARTED_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # (stable)
