"""What the instruction-count benches (torch_call_instructions.py, core_call_instructions.py) read
from a callgrind dump: a function's inclusive instructions and the dump's total."""
from __future__ import annotations

import re
import subprocess


def inclusive(dump, symbol_prefix):
    """Inclusive instructions of every function whose name starts with `symbol_prefix(` in `dump`."""
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", dump],
                         capture_output=True, text=True, check=True).stdout
    total = 0
    for line in out.splitlines():
        # "N (p%)  file:function [object]"; the file part has no colon
        m = re.match(r"\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(?:[^\s:]*:)?(.*)$", line)
        if m and m.group(2).startswith(symbol_prefix + "("):
            total = max(total, int(m.group(1).replace(",", "")))
    return total


def dump_total(path):
    """The dump's total instructions (its `totals:` or `summary:` line; 0 without one)."""
    with open(path) as fh:
        m = re.search(r"^(?:totals|summary): (\d+)", fh.read(), re.M)
    return int(m.group(1)) if m else 0
