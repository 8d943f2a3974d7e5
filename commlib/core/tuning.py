"""auto's tuning table at run time: read it, install it in the core, and load the default one.

The file (``commlib/core/tuning.json``, or ``$COMMLIB_TUNING``) says which algorithm ``auto`` runs per
(collective, world size, bytes). ``import commlib`` installs it with :func:`load_default`. Building
a table from measurements is the bench's job (:mod:`commlib.bench.tuning`, ``commlib tune``)::

    {"schema": "commlib-tuning/1",
     "bytes": "per-rank count x element size, as _C.choose_algorithm sees it",
     "machine": {...}, "generated": "...",
     "collectives": {"all_reduce": {"4": {"source": "measured", "rows": [[4096, "recursive_doubling"],
                                                                        [-1, "ring"]]}}}}

A ``"kernel_path"`` section of the same shape (``{"all_reduce": {"4": {"rows": [...]}}}``) holds
rows measured on a device's kernel path (one kernel launch per collective, ranks of one host): the
kernel path's auto takes them over its built-in one-shot/two-shot rule (csrc/stream/kernel_auto.h,
docs/gpu.md "auto on the device"); host calls and the copy path never read them. A
``"device_path"`` section (``{"4": {"kernel_max_bytes": 1048576}}``) holds the measured crossover
per world size: COMMLIB_DEVICE_PATH=auto takes the kernel path up to that many bytes per rank, the
copy path above (no entry: the kernel path at every size; csrc/policy/device_path_tuning.h).

A ``"single_copy"`` section (``{"all_to_all": {"4": {"min_bytes": 4194304}}}``) holds, per collective
and world size, the call size (auto's bytes) from which single-copy reads of a peer's buffer
(process_vm_readv) measured faster than the channels' two copies, -1 for never: with COMMLIB_CMA=auto
(the default) such calls send their messages of the entry's ``"min_message"`` bytes or more
single-copy (64 KiB when it names none); calls without an entry use the channels
(csrc/policy/single_copy.h).

A ``"flags"`` section (``{"all_reduce": {"4": {"max_bytes": 2896}}}``) holds, per collective and
world size, the largest call (auto's bytes) that auto sends through the shared-memory flags (one
write per rank read by every rank, instead of the algorithm's schedule), -1 for none: measured by
``commlib tune`` where a named algorithm beat the flags (commlib/bench/flag_tuning.py). Without an
entry every call whose input fits a flag slot (8 KiB) goes through the flags
(csrc/policy/flag_cutoff.h).

A ``"stream"`` section (``{"all_gather": {"4": {"min_bytes": -1}}}``) holds, per collective and world
size, the call size (auto's bytes) from which the call's copies measured faster with streaming
(non-temporal) stores, -1 for never: measured by ``commlib tune`` from ``commlib bench --stream-ab``
runs (commlib/bench/stream_tuning.py). Without an entry, and whenever COMMLIB_STREAM_BYTES is set,
a call streams when its outputs, all ranks together, hold COMMLIB_STREAM_BYTES (32 MiB) or more
(csrc/policy/stream_stores.h).

A ``"machines"`` list holds tables measured on other machine classes: each element is
``{"machine": {"cpu": "<model name of /proc/cpuinfo>", "cores": N}, "collectives": {...},
"single_copy": {...}, "flags": {...}, "stream": {...}, "provenance": {...}}``. On a machine whose CPU model and core count equal a
section's (:func:`this_machine`), that section's entries replace the top level's, per collective and
world size (entries it does not name stay): the crossovers and the algorithms' order change with the
CPU (bench/RESULTS_collectives.md, session 29: the AMD EPYC table on an Intel Xeon missed T5 at 9-17 of
60 points). :func:`for_machine` does the merge, :func:`load_default` installs its result;
``commlib tune ... --machine-section`` writes a section.

An entry may say ``"hosts": H`` (default 1): the rows were measured on that many hosts. Without a
cost model every row applies to its world size; with one (COMMLIB_TOPOLOGY, ranks on several
hosts) only rows of the communicator's host count do, the model deciding elsewhere.

For a call on P ranks the rows of P are tried in order; the first whose max_bytes >= bytes wins
(-1: no limit). World sizes with no rows fall back to the core's built-in heuristic, and
``COMMLIB_ALGO_<COLLECTIVE>`` overrides everything. ``COMMLIB_TUNING=<file>`` loads another file;
``COMMLIB_TUNING=0`` loads none.
"""
from __future__ import annotations

import json
import os
import time

import commlib._C as _C
from commlib import settings
from commlib.core import call_spec

SCHEMA = "commlib-tuning/1"


class TuningFileError(ValueError):
    """A tuning file exists but cannot be used (unreadable, not JSON, wrong schema, bad rows)."""


def default_path() -> str:
    """The tuning file shipped with the package (commlib/core/tuning.json)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "tuning.json")


def this_machine() -> dict:
    """This machine's class as the shipped table's ``"machines"`` sections name it: the CPU model
    (/proc/cpuinfo's first "model name", else the platform's processor name) and the core count."""
    import platform
    cpu = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": cpu or platform.processor() or platform.machine(), "cores": os.cpu_count()}


_SECTION_KEYS = ("collectives", "single_copy", "flags", "stream")  # what a machine section may replace


def _check_sections(table: dict):
    secs = table.get("machines", [])
    if not isinstance(secs, list):
        raise TuningFileError("machines: must be a list of machine sections")
    for i, sec in enumerate(secs):
        m = sec.get("machine") if isinstance(sec, dict) else None
        if not isinstance(m, dict) or not isinstance(m.get("cpu"), str) or not isinstance(m.get("cores"), int):
            raise TuningFileError(f"machines[{i}]: needs \"machine\": {{\"cpu\": str, \"cores\": int}}, got {m!r}")
    return secs


def for_machine(table: dict, machine=None) -> dict:
    """``table`` as it applies on ``machine`` (default: :func:`this_machine`): the first ``"machines"``
    section whose cpu and cores equal the machine's replaces the top level's entries per (collective,
    world size), in its ``"collectives"``, ``"single_copy"``, ``"flags"`` and ``"stream"`` sections; the result has no
    ``"machines"`` key and says which section it took (``"machine_section"``: its index, or None)."""
    secs = _check_sections(table)
    machine = machine or this_machine()
    out = {k: v for k, v in table.items() if k != "machines"}
    out["machine_section"] = None
    for i, sec in enumerate(secs):
        m = sec["machine"]
        if m["cpu"] == machine.get("cpu") and m["cores"] == machine.get("cores"):
            for key in _SECTION_KEYS:
                merged = {c: dict(per) for c, per in (table.get(key) or {}).items()}
                for coll, per in (sec.get(key) or {}).items():
                    merged.setdefault(coll, {}).update(per)
                out[key] = merged
            out["machine_section"] = i
            break
    return out


def shipped(machine=None) -> dict:
    """The shipped table (commlib/core/tuning.json) as it applies on ``machine`` (default: this one)."""
    return for_machine(read_strict(default_path()), machine)


def read(path):
    """The tuning dict in ``path``, or None when missing or unreadable."""
    try:
        return read_strict(path)
    except (OSError, TuningFileError):
        return None


def read_strict(path) -> dict:
    """The tuning dict in ``path``; OSError when it cannot be opened, TuningFileError when invalid."""
    with open(path) as f:
        try:
            data = json.load(f)
        except ValueError as e:
            raise TuningFileError(f"{path}: not JSON ({e})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise TuningFileError(f"{path}: not a {SCHEMA} file")
    return data


def write(path, table: dict, machine=None):
    """Write ``table`` to ``path`` atomically, stamped with the schema, machine and date."""
    table = dict(table)
    table["schema"] = SCHEMA
    if machine is not None:
        table["machine"] = {k: machine.get(k) for k in ("hostname", "cpu", "cores", "commlib_commit")}
    table["generated"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def rows_for(table: dict, collective: str, section: str = "collectives"):
    """[(world_size, max_bytes, algorithm)] of ``section`` ("collectives", or "kernel_path": the
    rows measured on a device's kernel path) in the order _C.set_tuning wants."""
    out = []
    for P, entry in (table.get(section, {}).get(collective) or {}).items():
        for max_bytes, alg in entry["rows"]:
            out.append((int(P), int(max_bytes), str(alg)))
    return sorted(out, key=lambda r: (r[0], r[1] < 0, r[1]))


def hosts_of(table: dict, collective: str, P: int) -> int:
    """How many hosts the rows of world size P were measured (or simulated) on: the entry's
    ``"hosts"``, else 1 (a table measured on this machine)."""
    entry = (table.get("collectives", {}).get(collective) or {}).get(str(P)) or {}
    return int(entry.get("hosts", 1))


class _Engine:
    """The engine's tuning table: ``set_tuning`` by the collective's name, converted once here."""

    @staticmethod
    def set_tuning(collective: str, rows) -> None:
        _C.set_tuning(call_spec.collective(collective), rows)

    @staticmethod
    def set_device_path_crossovers(kernel_max_bytes) -> None:
        _C.set_device_path_crossovers(kernel_max_bytes)

    @staticmethod
    def set_single_copy_crossovers(collective: str, min_bytes, min_message=None) -> None:
        _C.set_single_copy_crossovers(call_spec.collective(collective), min_bytes, min_message or {})

    @staticmethod
    def set_flag_cutoffs(cutoffs) -> None:
        _C.set_flag_cutoffs({call_spec.collective(c): per for c, per in cutoffs.items()})

    @staticmethod
    def set_streaming_starts(starts) -> None:
        _C.set_streaming_starts({call_spec.collective(c): per for c, per in starts.items()})


def install(table: dict, core=None):
    """Install every collective's rows with _C.set_tuning; return the collectives installed. Each
    row carries its entry's host count: the cost model (COMMLIB_TOPOLOGY) defers only to rows
    measured on as many hosts as the communicator spans; a kernel-path row carries True as a fifth
    field (one host: the kernel path needs every peer's memory). ``core``: anything with
    ``set_tuning(collective name, rows)`` (tests pass a recorder); the engine by default."""
    core = core or _Engine
    done = []
    for coll in sorted(set(table.get("collectives", {})) | set(table.get("kernel_path", {}))):
        rows = [(P, mb, alg, hosts_of(table, coll, P)) for P, mb, alg in rows_for(table, coll)]
        rows += [(P, mb, alg, 1, True) for P, mb, alg in rows_for(table, coll, "kernel_path")]
        core.set_tuning(coll, rows)
        done.append(coll)
    if hasattr(core, "set_device_path_crossovers"):  # the engine, or a recorder that wants them
        core.set_device_path_crossovers(crossovers(table))
    if hasattr(core, "set_single_copy_crossovers"):
        messages = single_copy_min_messages(table)
        for coll, per in single_copy_crossovers(table).items():
            core.set_single_copy_crossovers(coll, per, messages.get(coll, {}))
    if hasattr(core, "set_flag_cutoffs"):  # the whole table: one without the section clears them
        core.set_flag_cutoffs(flag_cutoffs(table))
    if hasattr(core, "set_streaming_starts"):  # likewise
        core.set_streaming_starts(streaming_starts(table))
    return done


def _per_world_size(table: dict, section: str, field: str) -> dict:
    """{collective: {world size: the integer ``field`` (-1 for never)}} of a section shaped
    ``{collective: {"P": {field: n}}}``; ValueError naming a bad entry."""
    out = {}
    for coll, per in (table.get(section) or {}).items():
        call_spec.collective(coll)  # an unknown name raises, naming it
        for P, entry in per.items():
            n = entry.get(field) if isinstance(entry, dict) else None
            if not isinstance(n, int) or isinstance(n, bool) or n < -1:
                raise ValueError(f"{section}: {coll} world size {P}: {field} must be an integer >= -1, got {n!r}")
            if not str(P).isdigit() or int(P) < 1:
                raise ValueError(f"{section}: {coll}: world size must be an integer >= 1, got {P!r}")
            out.setdefault(coll, {})[int(P)] = n
    return out


def streaming_starts(table: dict) -> dict:
    """{collective: {world size: the smallest call whose copies stream (-1 never)}} of the table's
    ``"stream"`` section."""
    return _per_world_size(table, "stream", "min_bytes")


def flag_cutoffs(table: dict) -> dict:
    """{collective: {world size: the largest call auto sends through the flags (-1 none)}} of the
    table's ``"flags"`` section."""
    return _per_world_size(table, "flags", "max_bytes")


def single_copy_crossovers(table: dict) -> dict:
    """{collective: {world size: min call bytes (-1 never)}} of the table's ``"single_copy"`` section."""
    out = {}
    for coll, per in (table.get("single_copy") or {}).items():
        call_spec.collective(coll)  # an unknown name raises, naming it
        for P, entry in per.items():
            mb = entry.get("min_bytes") if isinstance(entry, dict) else None
            if not isinstance(mb, int) or mb < -1:
                raise ValueError(f"single_copy: {coll} world size {P}: min_bytes must be an integer >= -1, got {mb!r}")
            out.setdefault(coll, {})[int(P)] = mb
    return out


def single_copy_min_messages(table: dict) -> dict:
    """{collective: {world size: smallest message sent single-copy}} of the ``"single_copy"`` entries
    that name one (``"min_message"``, bytes >= 2); the others send from 64 KiB (COMMLIB_CMA=1's)."""
    out = {}
    for coll, per in (table.get("single_copy") or {}).items():
        for P, entry in per.items():
            if not isinstance(entry, dict) or "min_message" not in entry:
                continue
            mm = entry["min_message"]
            if not isinstance(mm, int) or isinstance(mm, bool) or mm < 2:
                raise ValueError(f"single_copy: {coll} world size {P}: min_message must be an integer >= 2, got {mm!r}")
            out.setdefault(coll, {})[int(P)] = mm
    return out


def crossovers(table: dict) -> dict:
    """{world size: bytes} of the table's ``"device_path"`` section: with COMMLIB_DEVICE_PATH=auto a
    device call takes the kernel path up to that many bytes per rank (engines created afterwards);
    world sizes without an entry take the kernel path at every size (the built-in default)."""
    out = {}
    for P, entry in (table.get("device_path") or {}).items():
        mb = entry.get("kernel_max_bytes") if isinstance(entry, dict) else None
        if not isinstance(mb, int) or mb < 0:
            raise ValueError(f"device_path: world size {P}: kernel_max_bytes must be an integer >= 0, got {mb!r}")
        out[int(P)] = mb
    return out


def in_force():
    """(the table :func:`load_default` installs on this machine, :func:`for_machine` applied, and its
    file), or None when it installs none (COMMLIB_TUNING off, or no shipped file). Raises as
    load_default does."""
    path = settings.get("COMMLIB_TUNING")
    if path.lower() in ("0", "off", "none", "false"):
        return None
    if not path:
        path = default_path()
        if not os.path.exists(path):
            return None
    table = read_strict(path)
    try:
        return for_machine(table), path
    except (ValueError, KeyError, TypeError) as e:
        raise TuningFileError(f"{path}: {e}") from None


def load_default() -> bool:
    """Install $COMMLIB_TUNING, or the shipped file, as it applies on this machine
    (:func:`for_machine`). True if a table was installed.

    COMMLIB_TUNING=0 (or off/none/false) installs nothing. A missing default file is not an error
    (auto then uses the built-in heuristic); a named file that is missing, or any file that is
    invalid, raises OSError / TuningFileError / ValueError naming it (``import commlib`` turns that
    into a warning, so a broken file never breaks the import but is never ignored silently).
    """
    found = in_force()
    if found is None:
        return False
    table, path = found
    try:
        install(table)
    except (ValueError, KeyError, TypeError) as e:
        raise TuningFileError(f"{path}: {e}") from None
    return True


def choose(table: dict, collective: str, nbytes: int, P: int):
    """What the table says for a call (None when it has no row for P): the Python twin of the core."""
    for size, max_bytes, alg in rows_for(table, collective):
        if size == P and (max_bytes < 0 or nbytes <= max_bytes):
            return alg
    return None
