"""``commlib bench``'s command line: its arguments and the run's configuration built from them
(the ``config`` block of the JSON, handed to every rank process as a file)."""
from __future__ import annotations

import argparse
import sys

from commlib.perf import common as C
from commlib import settings


def add_arguments(p: argparse.ArgumentParser):
    """The arguments of ``commlib bench`` (also its ``--help``)."""
    p.add_argument("collectives", nargs="*", metavar="COLL",
                   help=f"collectives to run (default: {' '.join(C.DEFAULT_COLLECTIVES)}; 'all' adds "
                        "reduce, gather, scatter)")
    p.add_argument("--np", type=int, default=4, dest="np_",
                   help="local ranks to start (ignored inside torchrun/srun/mpirun; default 4)")
    p.add_argument("--hosts", type=int, default=1,
                   help="local runs: split the ranks into this many emulated hosts (contiguous rank "
                        "groups, COMMLIB_HOST_ID): shared memory inside a host, TCP between hosts "
                        "(default 1). COMMLIB_SOCKET_IFNAME picks the interface (default here: lo); "
                        "Open MPI then uses --mca btl tcp,self so it crosses the same kind of link")
    p.add_argument("--netns", action="store_true",
                   help="with --hosts H: run each host's ranks in its own network namespace "
                        "(scripts/netns.sh, root only), joined by veth links: real TCP between hosts "
                        "for commlib, gloo and Open MPI alike")
    p.add_argument("--rate", metavar="RATE",
                   help="with --netns: limit every inter-host link to RATE each way (tc tbf; e.g. 1gbit)")
    p.add_argument("-b", "--minbytes", default="8", help="smallest size (default 8)")
    p.add_argument("-e", "--maxbytes", default="16M", help="largest size, always included (default 16M)")
    p.add_argument("-f", "--stepfactor", type=float, default=4.0, help="size factor (default 4)")
    p.add_argument("-i", "--stepbytes", default="0", help="arithmetic step instead of -f (default 0: use -f)")
    p.add_argument("--algorithms", default="all",
                   help="comma list of commlib algorithms, 'auto' included (default: all + auto)")
    p.add_argument("--peers", default=None,
                   help="comma list of gloo, mpi, nccl (with --device), or 'none' (default gloo,mpi; "
                        "with --device: nccl)")
    p.add_argument("--device", default="host", choices=("host", "emulated", "cuda"),
                   help="where the buffers live: host memory (default), commlib.emulated arrays or CUDA "
                        "tensors (the stream engine; commlib/bench/device.py)")
    p.add_argument("--paths", default=None,
                   help="with --device: comma list of the stream engine's paths to compare, each on its own "
                        "sub-communicator: auto, kernel, copy (default auto,kernel,copy; commlib/bench/device_paths.py)")
    p.add_argument("--compress", default="", metavar="CODECS",
                   help="also time all_reduce, reduce_scatter and all_gather with compress= for each codec of "
                        "this comma list (bf16, fp8_e4m3, fp8_e5m2, int8, int4; NAME:inter for inter_only), "
                        "beside the uncompressed calls (docs/compression.md)")
    p.add_argument("-d", "--datatype", default="float32", choices=C.DTYPES, help="element type (default float32)")
    p.add_argument("-o", "--op", default="sum", choices=C.OPS, help="reduction (default sum)")
    p.add_argument("-r", "--root", type=int, default=0, help="root of rooted collectives (default 0)")
    p.add_argument("-n", "--iters", type=int, default=20,
                   help="timed calls per algorithm and size, at least (default 20)")
    p.add_argument("--min-time", type=float, default=0.02,
                   help="time fast calls for about this many seconds per algorithm and size, up to "
                        "--max-iters calls (default 0.02; 0: exactly -n calls)")
    p.add_argument("--max-iters", type=int, default=1000, help="cap of the --min-time rule (default 1000)")
    p.add_argument("-w", "--warmup_iters", type=int, default=5, help="warm-up iterations (default 5)")
    p.add_argument("--passes", type=int, default=2,
                   help="local runs: run every backend's job this many times, alternating the order "
                        "(commlib, gloo, mpi, then mpi, gloo, commlib, ...), and keep each row's lowest "
                        "median (--pass-statistic): a burst of load during one backend's job then does not "
                        "decide a ratio (default 2; the table is printed in the last pass)")
    p.add_argument("--pass-statistic", choices=("min", "median"), default="min",
                   help="a row's time over --passes: the lowest of the passes' medians (default) or their "
                        "median (of two, their mean)")
    p.add_argument("--peer-jobs", choices=("same", "separate"), default="same",
                   help="MPI on one host: its calls in commlib's rank processes (one mpirun job), a series of "
                        "every round beside commlib's algorithms, so a slow spell of the machine hits both "
                        "alike (same, default; commlib/bench/same_job.py), or a job of its own (separate)")
    p.add_argument("--single-copy-ab", action="store_true",
                   help="time every commlib algorithm once per side in the same rounds, through a sub-communicator "
                        "with single-copy reads off (<algorithm>@cma0) and one each with them on from 16, 32 and 64 KiB "
                        "messages (@cma16K, @cma32K, @cma1): the runs `commlib tune` takes each collective's "
                        "single-copy crossover and smallest message from (commlib/bench/single_copy_ab.py)")
    p.add_argument("--stream-ab", action="store_true",
                   help="local runs: run commlib's job once with streaming stores never (<algorithm>@nt0) and once "
                        "always (@nt1) in every pass: the runs `commlib tune` takes each collective's \"stream\" "
                        "start from (commlib/bench/stream_ab.py)")
    p.add_argument("--rounds", type=int, default=4,
                   help="interleave the algorithms of a size in this many rounds of iters/rounds calls (default 4)")
    p.add_argument("--close-rounds", type=int, default=8,
                   help="after a size's rounds, this many more rounds (as many calls each) of the series whose "
                        "medians decide a close verdict: auto within 10%% of the best, or Open MPI against auto "
                        "or commlib's best row, turned by a 10%% move of one series (commlib/bench/close_calls.py; "
                        "default 8, 0: none)")
    p.add_argument("-c", "--check", type=int, default=1, help="check results (1, default) or not (0)")
    p.add_argument("--mode", choices=("both", "out", "in"), default="both",
                   help="commlib: out-of-place, in-place or both columns (default both; broadcast runs in place only)")
    p.add_argument("--json", metavar="FILE", help="write every sample here")
    p.add_argument("--report", metavar="DIR", help="then write the report (index.html, report.md) here")
    p.add_argument("--tune", action="store_true",
                   help="write the tuning file from these measurements (auto's choices)")
    p.add_argument("--tune-file", metavar="FILE",
                   help="tuning file to write (default: ./tuning.json; commlib/core/tuning.json only when named)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per job before it is killed (default 900)")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import MODULE in every commlib rank first, e.g. one that calls "
                        "commlib.register_algorithm (repeatable; found on PYTHONPATH or in the current directory)")


def config_from_args(a) -> dict:
    """The run's config from parsed arguments; unknown names and impossible combinations exit with a message."""
    colls = a.collectives or list(C.DEFAULT_COLLECTIVES)
    named = "all" not in colls and bool(a.collectives)
    if "all" in colls:
        colls = list(C.COLLECTIVES)
    for c in colls:
        if c not in C.COLLECTIVES:
            raise SystemExit(f"commlib bench: unknown collective {c!r} (choose from {', '.join(C.COLLECTIVES)})")
    if a.mode == "out" and "broadcast" in colls:
        # commlib's broadcast runs in place only (backends.py supports): named, it would time nothing
        # and say nothing; among "all" or the defaults it is left out, saying so.
        if named:
            raise SystemExit("commlib bench: --mode out: broadcast runs in place only (use --mode in or both)")
        colls = [c for c in colls if c != "broadcast"]
        print("# --mode out: broadcast left out (it runs in place only)", file=sys.stderr)
    sizes = C.size_list(C.parse_size(a.minbytes), C.parse_size(a.maxbytes), a.stepfactor,
                        C.parse_size(a.stepbytes))
    device = getattr(a, "device", "host")
    peer_list = a.peers if a.peers is not None else ("gloo,mpi" if device == "host" else "nccl")
    peers = [p for p in peer_list.split(",") if p and p != "none"]
    for p in peers:
        if p not in ("gloo", "mpi", "nccl"):
            raise SystemExit(f"commlib bench: unknown peer {p!r} (gloo, mpi, nccl or none)")
    from commlib.bench import device as device_bench
    device_bench.check_config(device, a.datatype, peers)
    if getattr(a, "stream_ab", False) and (getattr(a, "single_copy_ab", False) or device != "host"):
        # one A/B at a time: the sides of each would otherwise differ in two things
        raise SystemExit("commlib bench: --stream-ab times host buffers alone, without --single-copy-ab or --device")
    if a.op in ("band", "bor", "bxor") and a.datatype.startswith(("float", "bfloat")):
        raise SystemExit(f"commlib bench: -o {a.op} needs an integer -d (got {a.datatype})")
    return {
        "collectives": colls, "sizes": sizes, "dtype": a.datatype, "op": a.op, "root": a.root,
        "iters": a.iters, "min_time": a.min_time, "max_iters": a.max_iters, "warmup": a.warmup_iters,
        "check": bool(a.check), "rounds": a.rounds, "close_rounds": max(0, getattr(a, "close_rounds", 0)),
        "pass_statistic": getattr(a, "pass_statistic", "min"), "peer_jobs": getattr(a, "peer_jobs", "same"),
        "modes": ["out", "in"] if a.mode == "both" else [a.mode],
        "algorithms": [x for x in a.algorithms.split(",") if x], "peers": peers, "device": device,
        "paths": _paths(a, device),
        "imports": list(getattr(a, "imports", []) or []),
        # COMMLIB_CMA as run: `commlib tune` compares runs with single-copy reads on (1) and off
        # (anything else) to find each collective's crossover (commlib/bench/single_copy_tuning.py).
        # "both" with --single-copy-ab: each record's algorithm names its side (single_copy_ab.py).
        "single_copy": "both" if getattr(a, "single_copy_ab", False) else settings.get("COMMLIB_CMA"),
        # Under COMMLIB_CMA=auto, the tuning's "single_copy" section the ranks run with: each size then
        # ran on the side it says, which `commlib tune` needs to keep a record beside an A/B run's
        # (single_copy_tuning.side_ran).
        "single_copy_in_force": _single_copy_in_force(a),
        # --stream-ab: each record's algorithm names its side (stream_ab.py). Otherwise the tuning's
        # "stream" section the ranks run with (None: COMMLIB_STREAM_BYTES is set, or no tuning read),
        # so that `commlib tune` knows which side each size of the run took (stream_tuning.side_ran).
        "stream_ab": bool(getattr(a, "stream_ab", False)),
        "stream_in_force": _stream_in_force(a),
        "compress": _compress(a, device, peers),
    }


def _section_in_force(name):
    """Section ``name`` of the tuning the ranks load ({} for none); None when that tuning cannot be
    read (the ranks then warn)."""
    from commlib.core import tuning
    try:
        found = tuning.in_force()
    except (OSError, ValueError):
        return None
    return (found[0].get(name) or {}) if found else {}


def _single_copy_in_force(a):
    """The "single_copy" section of the tuning the ranks load ({} for none), when they run under
    COMMLIB_CMA=auto; None otherwise, or when that tuning cannot be read (the ranks then warn)."""
    if getattr(a, "single_copy_ab", False) or settings.get("COMMLIB_CMA") != "auto":
        return None
    return _section_in_force("single_copy")


def _stream_in_force(a):
    """The "stream" section of the tuning the ranks load ({} for none) when COMMLIB_STREAM_BYTES is
    unset; None under --stream-ab, when it is set, or when that tuning cannot be read."""
    if getattr(a, "stream_ab", False) or settings.is_set("COMMLIB_STREAM_BYTES"):
        return None
    return _section_in_force("stream")


def _compress(a, device, peers):
    """--compress: the codec list (each a name, or NAME:inter for inter_only)."""
    from commlib.core import codecs
    names = [x.strip() for x in (getattr(a, "compress", "") or "").split(",") if x.strip()]
    for n in names:
        base, _, flag = n.partition(":")
        if base not in codecs.NAMES or flag not in ("", "inter"):
            raise SystemExit(f"commlib bench: --compress: unknown codec {n!r} ({', '.join(codecs.NAMES)}, "
                             "optionally NAME:inter)")
    if names and (device != "host" or a.datatype not in codecs.CODED_DTYPES):
        raise SystemExit("commlib bench: --compress needs host buffers (--device host) and a float32, float16 or "
                         "bfloat16 -d")
    return names


def _paths(a, device):
    """--paths (the device bench only)."""
    text = getattr(a, "paths", None)
    if device == "host":
        if text:
            raise SystemExit("commlib bench: --paths needs --device emulated or cuda")
        return None
    from commlib.bench.device_paths import parse_paths
    return parse_paths(text or "auto,kernel,copy")
