"""CI's order of modules (tests/module_order.py STARTED_FIRST): the longest modules are handed to the
xdist workers first, so none starts last; every one named must exist (a renamed module would
silently fall back to its collection place)."""
from pathlib import Path

import module_order

ROOT = Path(__file__).resolve().parents[2]


def test_every_module_started_first_exists():
    missing = [m for m in module_order.STARTED_FIRST if not (ROOT / m).is_file()]
    assert not missing, f"tests/module_order.py STARTED_FIRST names modules that are gone: {missing}"
    assert len(set(module_order.STARTED_FIRST)) == len(module_order.STARTED_FIRST)


class _Item:
    def __init__(self, nodeid):
        self.nodeid = nodeid


def test_the_named_modules_come_first_and_each_module_stays_whole_in_order():
    first, second = module_order.STARTED_FIRST[:2]
    ids = ["tests/a/test_x.py::t1", f"{second}::s1", "tests/a/test_x.py::t2", f"{first}::f1", f"{second}::s2",
           "tests/b/test_y.py::t"]
    items = [_Item(i) for i in ids]
    module_order.longest_modules_first(items)
    assert [i.nodeid for i in items] == [f"{first}::f1", f"{second}::s1", f"{second}::s2", "tests/a/test_x.py::t1",
                                         "tests/a/test_x.py::t2", "tests/b/test_y.py::t"]
