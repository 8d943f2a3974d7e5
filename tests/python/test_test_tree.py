"""The test tree's own rules.

* Every module under tests/ has a unique file name. The test directories are not packages, so
  pytest (rootdir-relative, "import file mismatch") and the rank processes (which import a case
  module by its bare name) would take one same-named module for another.
* The tree mirrors the source tree (docs/DESIGN.md, "Tests"): a test directory is named after the
  source folder whose code it tests (`tests/stream` for csrc/stream, `tests/device` for csrc/device
  and commlib/device, `tests/transport/tcp` for csrc/transport/tcp, ...), or is one of the concern
  suites below, for tests that cross layers. A directory named after a folder that no longer
  exists (the old tests/engine) fails, and so does a csrc folder whose tests have no directory of
  their own and no entry in TESTED_ELSEWHERE saying where they are.
"""
import collections
import pathlib
import re

TESTS = pathlib.Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
SOURCES = (ROOT / "csrc", ROOT / "commlib")

# Test directories that mirror no one source folder, and why.
CONCERN_SUITES = {
    "python": "the rules of the tree itself (layering, sizes, settings, doc references, this file)",
    "hardening": "bad input and hostile peers across the bootstrap, the transports and the engines",
    "multihost": "every engine on emulated hosts (several transports at once)",
    "fault": "shrink and grow: the bootstrap, the engines and the torch backend together",
}

# csrc folders (relative to csrc) without a test directory of their own: where their tests are.
TESTED_ELSEWHERE = {
    "common": "everywhere (types, shapes, settings: tests/python/test_settings.py, tests/host)",
    "plan": "tests/host (test_plan_cache_key.py) and every engine's matrix",
    "policy": "tests/sim (auto on the cost model, the candidate search), tests/host, tests/bench (tuning)",
    "verify": "tests/schedule (test_verify_all.py: every registered schedule proved)",
    "bindings": "tests/python (the call spec, the fast path, the error table), tests/stream (the device call entry)",
    "torch_backend": "tests/torch",
    "device/emulated": "tests/device (the emulated device on its own) and every tests/stream case (the engine on it)",
    "transport/shm": "tests/transport (the table) and tests/host (every host collective on one host)",
    "transport/toy": "tests/transport/test_toy_transport.py (a third kind, registered from the test)",
}


def test_module_names_are_unique_across_test_directories():
    seen = collections.defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if path.name != "conftest.py" and "__pycache__" not in path.parts:
            seen[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not clashes, f"rename one of each: {clashes}"


def _test_dirs():
    return sorted(p.relative_to(TESTS).as_posix() for p in TESTS.rglob("*")
                  if p.is_dir() and "__pycache__" not in p.parts and any(p.glob("*.py")))


def test_every_test_directory_mirrors_a_source_folder_or_is_a_concern_suite():
    stray = [d for d in _test_dirs() if d.split("/")[0] not in CONCERN_SUITES
             and not any((src / d).is_dir() for src in SOURCES)]
    assert not stray, (f"tests/{stray[0]} names no csrc/ or commlib/ folder: move its tests to the directory of "
                       f"the folder they test, or add it to CONCERN_SUITES with why it crosses layers")


def test_every_source_folder_has_its_tests_placed():
    csrc = ROOT / "csrc"
    folders = sorted(p.relative_to(csrc).as_posix() for p in csrc.rglob("*")
                     if p.is_dir() and (any(p.glob("*.cc")) or any(p.glob("*.h"))))
    dirs = set(_test_dirs())
    unplaced = [f for f in folders if f not in dirs and f not in TESTED_ELSEWHERE]
    assert not unplaced, (f"csrc/{unplaced[0]} has no tests/{unplaced[0]} and no TESTED_ELSEWHERE entry saying "
                          f"where its tests are")
    stale = [f for f in TESTED_ELSEWHERE if not (csrc / f).is_dir() or f in dirs]
    assert not stale, f"TESTED_ELSEWHERE names {stale[0]}, which is gone or has its own test directory now"


def test_a_test_that_limits_emulated_residency_names_a_machine_of_its_own():
    """The emulated device's resident blocks and grid budget live in /dev/shm ledgers named by the
    device's identity, "emulated:[<COMMLIB_EMULATED_MACHINE>:]<index>" (csrc/device/shared_ledger.h),
    used only where COMMLIB_EMULATED_RESIDENT_BLOCKS is set (0: no limit, no ledger). A test file that
    sets it must also name a machine of its own (a fresh name per process, as test_grid_claims.py
    does), or two test runs on one host (two worktrees, CI beside a developer) would share the
    ledger as two jobs on one GPU, and each would find the other's blocks and claims there. Session
    24 checked it: two concurrent runs of the occupancy tests pass, and nothing else uses the ledger."""
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        text = path.read_text()
        if path.name == "test_test_tree.py" or "COMMLIB_EMULATED_RESIDENT_BLOCKS" not in text:
            continue
        sets_limit = re.search(r"COMMLIB_EMULATED_RESIDENT_BLOCKS\s*=|"
                               r"[\"']COMMLIB_EMULATED_RESIDENT_BLOCKS[\"']\s*:", text)
        own_machine = re.search(r"COMMLIB_EMULATED_MACHINE\s*=\s*f[\"'][^\"']*\{uuid", text)
        if sets_limit and not own_machine:
            offenders.append(str(path.relative_to(TESTS)))
    assert not offenders, f"set COMMLIB_EMULATED_RESIDENT_BLOCKS without a machine of their own: {offenders}"
