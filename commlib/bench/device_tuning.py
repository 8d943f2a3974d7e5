"""The device half of the tuning file: ``"kernel_path"`` rows and ``"device_path"`` crossovers from
a device bench's records (``commlib tune --device``, ``commlib bench --device D --paths kernel,copy
--tune``).

A device bench names its algorithms ``<algorithm>@<path>`` (commlib/bench/device_paths.py) and every
record says the path its calls ran on. Records that ran on the kernel path give the
``"kernel_path"`` rows, selected exactly as the host rows are (medians of medians over modes and
runs, then choose_path). Where a world size was measured on both paths, the ``"device_path"``
entry says up to how many bytes per rank ``COMMLIB_DEVICE_PATH=auto`` takes the kernel path
(crossover). Device records never make host rows: they do not measure the host executor.
"""
from __future__ import annotations

import math


KERNEL_PATH_DEFAULT_MAX_BYTES = (1 << 63) - 1  # csrc/policy/device_auto.h kKernelPathMaxBytes: no crossover


def device_path_of(record):
    """The path a device record measured ("kernel" / "copy"), None for a host record or one of
    ``auto`` (its path changes with the size) or one whose calls ran elsewhere than named."""
    algo, _, named = record["algorithm"].partition("@")
    ran = record.get("path")
    if not named and ran is None:
        return None
    path = named or ran
    if algo == "auto" or path not in ("kernel", "copy") or (ran is not None and ran != path):
        return None
    return path


def split(records):
    """(host records, {"kernel": [...], "copy": [...]}) with the device records' algorithms
    stripped of their ``@path``."""
    host, device = [], {"kernel": [], "copy": []}
    for r in records:
        if r.get("backend") != "commlib":
            host.append(r)
            continue
        if "@" not in r["algorithm"] and r.get("path") is None:
            host.append(r)
            continue
        path = device_path_of(r)
        if path:
            device[path].append(dict(r, algorithm=r["algorithm"].partition("@")[0]))
    return host, device


def kernel_path_section(kernel_records, previous=None):
    """{collective: {P: entry}}: measured entries for the world sizes in ``kernel_records``, the
    previous table's kernel_path entries for the others (tuning_picks.measured_entries)."""
    from commlib.bench.tuning_picks import measured_entries
    return measured_entries(kernel_records, (previous or {}).get("kernel_path", {}))


def crossover(core_sizes, kernel_best, copy_best, default=KERNEL_PATH_DEFAULT_MAX_BYTES):
    """Bytes per rank up to which the kernel path should be taken, from each path's best time at the
    sizes measured on both (ascending): the split (kernel below, copy above) with the least summed
    relative excess over the faster path, ties to the larger kernel range. Kernel at every size:
    max(largest size, default) (nothing measured says stop earlier); copy at every size: below the
    smallest size, and never above the default."""
    n = len(core_sizes)

    def loss(k):
        return sum((kernel_best[i] if i < k else copy_best[i]) / min(kernel_best[i], copy_best[i]) - 1.0
                   for i in range(n))

    k = min(range(n + 1), key=lambda j: (loss(j), -j))
    if k == n:
        return max(int(core_sizes[-1]), default)
    if k == 0:
        return min(int(core_sizes[0]) - 1, default)
    return int(math.sqrt(core_sizes[k - 1] * core_sizes[k]))


def device_path_section(device, previous=None):
    """{P: {"kernel_max_bytes": N, "source": "measured"}} for each world size measured on both
    paths (the smallest collective's crossover: the kernel path is taken only where no collective
    measured was slower on it), the previous table's entries for the others."""
    from commlib.bench.tuning_picks import measured_seconds
    out = dict((previous or {}).get("device_path") or {})
    kern, copy = measured_seconds(device["kernel"]), measured_seconds(device["copy"])
    per_size = {}
    for key in sorted(set(kern) & set(copy)):
        k_at = {cb: min(t.values()) for _, cb, t in kern[key] if t}
        c_at = {cb: min(t.values()) for _, cb, t in copy[key] if t}
        both = sorted(set(k_at) & set(c_at))
        if both:
            x = crossover(both, [k_at[c] for c in both], [c_at[c] for c in both])
            per_size[key[1]] = min(x, per_size.get(key[1], x))
    for P, x in per_size.items():
        out[str(P)] = {"source": "measured", "kernel_max_bytes": x}
    return out


def add_device_sections(table, records, previous=None):
    """Put the kernel_path / device_path sections in ``table`` from ``records``' device records;
    without any, carry over ``previous``'s."""
    _, device = split(records)
    kp = kernel_path_section(device["kernel"], previous)
    dp = device_path_section(device, previous)
    if kp:
        table["kernel_path"] = kp
    if dp:
        table["device_path"] = dp
    return table

