#!/usr/bin/env python3
"""Refreshes tests/module_seconds.txt, the seconds per test module that order CI's workers
(tests/module_order.py), from the last run's build/module_seconds.txt (every run of the suite writes
it): a measured module takes its new time, a module that is gone is dropped, one that exists but was
not measured keeps its time. Run it after a whole-suite run (CI's `scripts/test.sh`), and commit the
file; tests/python/test_ci_order.py fails while the file misses a module or names one that is gone.

    .venv/bin/python scripts/refresh_module_seconds.py [--from build/module_seconds.txt] [--note TEXT]
"""
import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import module_order  # noqa: E402


def test_modules(root=ROOT):
    """Every test module pytest collects under tests/ (test_*.py), relative to the repository."""
    return sorted(str(p.relative_to(root)) for p in (root / "tests").rglob("test_*.py"))


def merged(recorded, measured, existing):
    """The refreshed {module: seconds}: measured times replace recorded ones; only existing modules."""
    out = {m: s for m, s in recorded.items() if m in existing}
    out.update({m: s for m, s in measured.items() if m in existing})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="source", default=str(module_order.LAST_RUN_FILE))
    ap.add_argument("--note", default="", help="where the times come from (the run, the machine's load)")
    args = ap.parse_args()
    existing = set(test_modules())
    recorded = module_order.read_module_seconds()
    measured = module_order.read_module_seconds(args.source)
    seconds = merged(recorded, measured, existing)
    note = ("Seconds per test module (setup + call + teardown, summed), the longest started first by CI's\n"
            "workers (tests/module_order.py); refreshed by scripts/refresh_module_seconds.py.")
    if args.note:
        note += "\n" + args.note
    module_order.write_module_seconds(seconds, module_order.SECONDS_FILE, note)
    missing = sorted(existing - set(seconds))
    print(f"{len(measured)} measured, {len(seconds)} recorded, dropped {sorted(set(recorded) - existing)}")
    if missing:
        print(f"not measured and not recorded (run them, then refresh again): {missing}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
