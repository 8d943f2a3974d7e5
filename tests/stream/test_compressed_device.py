"""compress= on device buffers (stream/copy_path_codec.cc, docs/compression.md "On device
buffers"): on the emulated device, every proven algorithm of all_reduce, reduce_scatter and
all_gather (count 13 or 37, sum or avg) x codecs x dtypes, stochastic rounding included, ends equal
to the host engine's compressed result bit for bit on every rank (3 ranks: uneven splits; 4: powers
of two); so does every one of them coded in pieces that span several slots (streaming), and
compress_inter_only across emulated hosts (2 + 1, 2 + 2 and 1 + 1 + 1 ranks: raw within a host,
encoded between hosts); steady compressed calls allocate nothing and never make the host wait, and
a call's staging is a step's pieces, not its size; ranks coding in other pieces get a mismatch; bad
input is refused naming the argument."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compressed_device_cases as cdc  # noqa: E402
from emulated_pools import DELAY_ENV  # noqa: E402

from commlib.testing.faults import assert_survivors_named_the_dead_rank, run_killing_one_rank  # noqa: E402

CODECS = [("int8", "float32", "nearest"), ("int4", "float16", "stochastic"), ("fp8_e4m3", "bfloat16", "nearest"),
          ("bf16", "float32", "stochastic"), ("fp8_e5m2", "float32", "nearest")]


def _cases(size):
    cases, k = [], 0
    for coll in ("all_reduce", "reduce_scatter", "all_gather"):
        for algo in cdc.proven(coll, size, 13):  # count 13 or 37 (several blocks, uneven splits), rotating
            codec, dtype, rounding = CODECS[k % len(CODECS)]
            count = (13, 37)[(k + size) % 2]
            if algo in cdc.proven(coll, size, count):
                cases.append((coll, algo, codec, dtype, rounding, count, "avg" if k % 3 == 0 else "sum"))
            k += 1
    return cases


# Pieces of 256 bytes of input (64 float32 elements, 128 of 16-bit floats) and slots of 64 bytes:
# a message of these counts is coded in several pieces, and each piece moves in several chunks.
PIECES = {"COMMLIB_COMPRESS_PIECE_BYTES": "256", "COMMLIB_DEVICE_SLOT_BYTES": "64"}


def _piece_cases(size):
    """_cases at counts 150 and 300 (2-5 pieces per message; all_gather's blocks in several)."""
    return [(c[0], c[1], c[2], c[3], c[4], 150 if c[5] == 13 else 300, c[6]) for c in _cases(size)
            if c[1] in cdc.proven(c[0], size, 150 if c[5] == 13 else 300)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("size", [3, 4])
def test_device_compressed_equals_host_compressed(pool, size):
    cases = _cases(size)
    results = pool(size, env=DELAY_ENV).run(cdc.run_cases, cases, timeout=200)
    for i, case in enumerate(cases):
        for rank, r in enumerate(results):
            assert r[i][2] == r[i][1], f"{case}: rank {rank}'s device result differs from the host engine's"
        if case[0] != "reduce_scatter":  # every rank holds the whole result
            assert len({r[i][2] for r in results}) == 1, f"{case}: ranks differ on the device"


@pytest.mark.timeout(240)
def test_device_compressed_in_pieces_equals_host_compressed(pool):
    """Streaming: every proven algorithm at 3 ranks coded in pieces that span several chunks (the
    host engine streams the same pieces) ends as the host's, identical on every rank: forked onto
    the copy path's send and receive streams (the default), and on the caller's stream alone
    (COMMLIB_DEVICE_STREAMS=1)."""
    cases = _piece_cases(3)
    p = pool(3, env=DELAY_ENV)
    _check_equal(cases, p.run(cdc.run_cases_with, PIECES, cases, timeout=200))
    _check_equal(cases, p.run(cdc.run_cases_with, {**PIECES, "COMMLIB_DEVICE_STREAMS": "1"}, cases, timeout=200))


def _check_equal(cases, results, identical=True):
    for i, case in enumerate(cases):
        for rank, r in enumerate(results):
            assert r[i][2] == r[i][1], f"{case}: rank {rank}'s device result differs from the host engine's"
        if identical and case[0] != "reduce_scatter":
            assert len({r[i][2] for r in results}) == 1, f"{case}: ranks differ on the device"


# Emulated hosts (one emulated device per rank: the emulated NCCL refuses two ranks on one); the
# environments of tests/stream/test_device_multihost.py and test_nccl.py, so their pools serve.
DEVICES = {"COMMLIB_EMULATED_DELAY_US": "20", "COMMLIB_EMULATED_DEVICE": tuple(map(str, range(8)))}
HOSTS_2_1 = {**DEVICES, "COMMLIB_HOST_ID": ("a", "a", "b")}
HOSTS_2_2 = {**DEVICES, "COMMLIB_HOST_ID": ("a", "a", "b", "b")}
HOSTS_1_1_1 = {**DEVICES, "COMMLIB_HOST_ID": ("a", "b", "c")}


def _host_cases(size, host_of):
    """compress_inter_only: every algorithm the verifier proves on this host map (hierarchical, the
    all_gathers), at counts 13 and 37, codecs rotating; and fully coded ring and direct all_reduce,
    ring reduce_scatter and all_gather (those peers' encoded bytes in NCCL groups)."""
    cases, k = [], 0
    for coll in ("all_reduce", "reduce_scatter", "all_gather"):
        for count in (13, 37):
            for algo in cdc.proven(coll, size, count, host_of=host_of, inter_only=True):
                codec, dtype, rounding = CODECS[k % len(CODECS)]
                cases.append((coll, algo, codec, dtype, rounding, count, "avg" if k % 3 == 0 else "sum", True))
                k += 1
    return cases + [("all_reduce", "ring", "int8", "float32", "nearest", 37, "sum"),
                    ("all_reduce", "direct", "int4", "float16", "stochastic", 13, "avg"),
                    ("reduce_scatter", "ring", "fp8_e4m3", "bfloat16", "nearest", 13, "sum"),
                    ("all_gather", "ring", "bf16", "float32", "stochastic", 37, "sum")]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("env,link", [(HOSTS_2_1, {}), (HOSTS_2_2, {}), (HOSTS_2_2, {"COMMLIB_DEVICE_LINK": "nccl"}),
                                      (HOSTS_1_1_1, {})], ids=["2+1", "2+2", "2+2-nccl-link", "1+1+1"])
def test_device_compressed_across_hosts_equals_host_compressed(pool, env, link):
    """Ranks of another host over the nccl link (the encoded bytes in NCCL groups), ranks of one
    host through their inboxes (or, COMMLIB_DEVICE_LINK=nccl, in NCCL groups too), raw under
    compress_inter_only: the host engine's result, identical on every rank; whole messages and in
    pieces spanning several chunks."""
    hosts = env["COMMLIB_HOST_ID"]
    size = len(hosts)
    cases = _host_cases(size, [ord(h) - ord("a") for h in hosts])
    assert sum(len(c) == 8 for c in cases) >= 4, cases  # hierarchical x 3 and the all_gathers at least
    if link:
        cases = [c for c in cases if c[1] in ("hierarchical", "ring")]
    p = pool(size, env=env)
    _check_equal(cases, p.run(cdc.run_cases_with, link, cases, timeout=200))
    piece_cases = [c[:5] + (300,) + c[6:] for c in cases if c[1] in ("hierarchical", "ring")]
    _check_equal(piece_cases, p.run(cdc.run_cases_with, {**PIECES, **link}, piece_cases, timeout=200))


def _awkward_cases(size, host_of=None):
    """Counts 0, 1 and 2 (under the world size) x every algorithm the verifier proves there
    (``host_of``: under compress_inter_only on that host map), codecs rotating."""
    cases, k = [], 0
    for coll in ("all_reduce", "reduce_scatter", "all_gather"):
        for count in (0, 1, 2):
            for algo in cdc.proven(coll, size, count, host_of=host_of, inter_only=host_of is not None):
                codec, dtype, rounding = CODECS[k % len(CODECS)]
                cases.append((coll, algo, codec, dtype, rounding, count, "sum") + ((True,) if host_of else ()))
                k += 1
    return cases


@pytest.mark.timeout(240)
def test_device_compressed_awkward_counts_equal_host_compressed(pool):
    """Counts 0, 1 and 2 on 3 ranks, whole and in pieces, and under compress_inter_only on hosts
    2 + 1: the host engine's result, identical on every rank."""
    cases = _awkward_cases(3)
    p = pool(3, env=DELAY_ENV)
    _check_equal(cases, p.run(cdc.run_cases, cases, timeout=200))
    _check_equal(cases, p.run(cdc.run_cases_with, PIECES, cases, timeout=200))
    cases = _awkward_cases(3, [0, 0, 1])
    _check_equal(cases, pool(3, env=HOSTS_2_1).run(cdc.run_cases_with, PIECES, cases, timeout=200))


# Pieces of 4 KiB (1024 float32 elements), slots of 1 KiB.
STEADY = {"COMMLIB_COMPRESS_PIECE_BYTES": "4096", "COMMLIB_DEVICE_SLOT_BYTES": "1024"}
# Driver calls that allocate or free device memory, or make the host wait for the device.
ALLOCATE_OR_WAIT = ("cudaMalloc", "cudaMallocAsync", "cudaFree", "cudaFreeAsync", "cudaStreamSynchronize",
                    "cudaEventSynchronize", "cudaMemcpy")


@pytest.mark.timeout(200)
def test_steady_compressed_calls_allocate_nothing_and_never_wait(pool):
    """The staging of compressed calls is the copy path's, kept across calls: 12 rounds of three
    compressed calls (after one round of the same shapes) make no allocation, no free and no host
    wait, on three ranks sharing one emulated device. The first call's staging is its largest
    step's pieces: ring all_reduce's step is one send and one recv_reduce of 20000 elements, in
    pieces of 1024: one piece's codes for each (1152 bytes), the receive's decoded piece (4096) and
    a projection's codes (1152), 7552 bytes in whole pages (8 KiB) plus the emulation's count page;
    staging whole messages would take 20000 x (4 + 2 x 1.125) + 22500 bytes, over 140 KB."""
    for grown, calls, same in pool(3, env=DELAY_ENV).run(cdc.steady_calls, STEADY, timeout=150):
        assert same
        assert grown <= 12 << 10, grown
        assert not {k: v for k, v in calls.items() if k in ALLOCATE_OR_WAIT}, calls
        assert calls.get("a gated codec kernel launch", 0) >= 12 * 3, calls  # the count counts
        assert calls.get("cudaStreamWaitEvent", 0) >= 12 * 3 * 2, calls  # forked onto the path's streams


@pytest.mark.timeout(120)
def test_device_compress_refuses_bad_input(pool):
    results = pool(3, env=DELAY_ENV).run(cdc.refusals, timeout=90)
    for said, _ in results:
        assert not said, said
    assert len({y for _, y in results}) == 1


@pytest.mark.timeout(120)
def test_ranks_coding_in_other_pieces_get_a_mismatch(pool):
    """The piece size lays a compressed message out, so it travels in the device call's descriptor
    (as on the host): ranks whose COMMLIB_COMPRESS_PIECE_BYTES differ get a MismatchError naming
    compress=, and the call writes nothing."""
    for unchanged, said, _ in pool(3, env=DELAY_ENV).run(cdc.piece_mismatch, timeout=90):
        assert unchanged
        assert said and "MismatchError" in said and "compress=" in said, said


@pytest.mark.timeout(120)
def test_a_rank_killed_inside_a_compressed_call_is_named():
    """Rank 1 (host a, beside rank 0; rank 2 on host b) dies inside a compressed hierarchical
    all_reduce under compress_inter_only in pieces: ranks 0 and 2 get PeerError naming it and the
    call within 20 s, never a hang (a fresh pool: a pool is not reusable once a rank died)."""
    results = run_killing_one_rank(3, 1, cdc.kill_during_compressed, env=HOSTS_2_1, timeout=60)
    assert_survivors_named_the_dead_rank(results, 1, within_s=20)
