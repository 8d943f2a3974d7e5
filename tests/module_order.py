"""The order CI hands test modules to its xdist workers (tests/conftest.py applies it at collection),
from each module's seconds in a recorded run (tests/module_seconds.txt).

scripts/test.sh's two workers take whole modules (--dist loadfile) in the order given, and the run
ends when the busier worker ends, so the longest modules go first and the short ones fill in at the
end (longest first: the busier worker ends at most about one short module after the other). Each
run writes its modules' seconds to build/module_seconds.txt (record_module_seconds);
scripts/refresh_module_seconds.py merges them into tests/module_seconds.txt, and
tests/python/test_ci_order.py fails when that file names a module that is gone or misses one.

A module of its own, not conftest's: several conftest.py files exist (tests/torch, tests/explain), so
`import conftest` in a test may find another one."""
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SECONDS_FILE = TESTS / "module_seconds.txt"  # committed: "<seconds> <module>" lines, sorted by module
LAST_RUN_FILE = TESTS.parent / "build" / "module_seconds.txt"  # written by every run (a build output)


def read_module_seconds(path=SECONDS_FILE):
    """{module path relative to the repository: seconds} from a seconds file ('#' lines are notes)."""
    seconds = {}
    for line in Path(path).read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            value, module = line.split(None, 1)
            seconds[module.strip()] = float(value)
    return seconds


def write_module_seconds(seconds, path, note):
    lines = [f"# {line}" for line in note.splitlines()]
    lines += [f"{seconds[m]:.1f} {m}" for m in sorted(seconds)]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(lines) + "\n")


def longest_first(seconds):
    return tuple(sorted(seconds, key=lambda m: (-seconds[m], m)))


# The recorded modules, the longest first.
STARTED_FIRST = longest_first(read_module_seconds())


def longest_modules_first(items, seconds=None):
    """Sorts collected `items` in place, each module's tests kept together in their order: modules
    without a recorded time first (a new module may be long: started late it would be the run's
    tail), then the recorded ones, the longest first."""
    seconds = read_module_seconds() if seconds is None else seconds
    rank = {m: i for i, m in enumerate(longest_first(seconds))}
    unknown = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        if module not in rank:
            unknown.setdefault(module, len(unknown))
    items.sort(key=lambda item: (rank.get(item.nodeid.split("::", 1)[0], -1),
                                 unknown.get(item.nodeid.split("::", 1)[0], 0)))  # (stable within a module)


def keep_collection_order(config):
    """pytest-xdist's --dist loadfile hands out modules by their number of tests, the most first,
    unless told to keep the collection's order (--no-loadscope-reorder; reordering is its default in
    3.8): until session 27 that silently replaced the order above (tests/torch's one-test suite went
    out late)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


class ModuleClock:
    """Sums each module's test durations (setup, call and teardown) as reports arrive; the xdist
    controller gets every worker's reports, so it writes one file for the whole run."""

    def __init__(self):
        self.seconds = defaultdict(float)

    def add(self, report):
        self.seconds[report.nodeid.split("::", 1)[0]] += report.duration

    def write(self, path=LAST_RUN_FILE):
        if self.seconds:
            write_module_seconds(self.seconds, path, "seconds per test module in the last run (tests/module_order.py)")
