"""The simulator's costing of compress= (csrc/sim/codec_cost.h, docs/compression.md): a message
carries its encoded bytes (inter_only: only between hosts), and the codec's compute is on the
critical path (the sender encodes before the transfer, the receiver decodes after it)."""
import dataclasses

import pytest

from commlib import sim
from commlib.codecs import Codec
from commlib.sim.topology import PRESETS

# 2 ranks per host on a 1 Gbit/s link (the netns benchmark's shape)
ETH_1G = dataclasses.replace(PRESETS["eth-25g"], name="eth-1g", nic_Gbps=1.0, devices_per_host=2)
P, COUNT = 4, 4096  # ring all_reduce: 2 (P - 1) messages of COUNT / P elements per rank


def _run(codec, algorithm="ring", codec_ns=(-1.0, -1.0)):
    return sim.predict("all_reduce", algorithm, COUNT * 4, P, ETH_1G, compress=codec, codec_ns=codec_ns)


@pytest.mark.parametrize("name", ["bf16", "fp8_e4m3", "int8", "int4"])
def test_messages_carry_encoded_bytes(name):
    plain, coded = _run(None)["sim"], _run(name)["sim"]
    messages = P * 2 * (P - 1)
    assert plain["bytes_inter"] + plain["bytes_intra"] == messages * (COUNT // P) * 4
    assert coded["bytes_inter"] + coded["bytes_intra"] == messages * Codec(name).encoded_size(COUNT // P)


def test_inter_only_encodes_only_across_hosts():
    plain, inter = _run(None, "hierarchical")["sim"], _run(Codec("int8", inter_only=True), "hierarchical")["sim"]
    full = _run("int8", "hierarchical")["sim"]
    assert inter["bytes_intra"] == plain["bytes_intra"] > full["bytes_intra"]
    assert inter["bytes_inter"] == full["bytes_inter"] < plain["bytes_inter"]


def test_codec_compute_is_on_the_critical_path():
    """Ring's steps each encode, send and decode one chunk in turn, so an extra ns per element
    adds, per chunk element: in each of the P - 1 reduce-scatter steps the sender's encoding and
    projection (encode + decode), the receiver's decoding and its sum's projection (decode +
    encode + decode); in each of the P - 1 all_gather steps the sender's encode + decode and the
    receiver's decode. Encoding: 3 (P - 1) in all; decoding: 5 (P - 1). A sender encodes at its
    own entry into the step, whether or not its receiver is there yet (as the executor does), so a
    rank that enters before its receiver hides a little of it: within 2 %."""
    base = _run("int8", codec_ns=(0.0, 0.0))["time_us"]["median"]
    slow_enc = _run("int8", codec_ns=(1000.0, 0.0))["time_us"]["median"]
    slow_dec = _run("int8", codec_ns=(0.0, 1000.0))["time_us"]["median"]
    per_step_us = (COUNT // P) * 1000 * 1e-3
    assert 0.98 * 3 * (P - 1) * per_step_us <= slow_enc - base <= 3 * (P - 1) * per_step_us * (1 + 1e-9)
    assert 0.98 * 5 * (P - 1) * per_step_us <= slow_dec - base <= 5 * (P - 1) * per_step_us * (1 + 1e-9)
    # a 1 Gbit/s link pays for a default-rate codec: int4 beats raw float32
    assert sim.predict("all_reduce", "ring", 64 << 20, P, ETH_1G, compress="int4")["time_us"]["median"] < \
        sim.predict("all_reduce", "ring", 64 << 20, P, ETH_1G)["time_us"]["median"] / 3


# The CPU loops' measured rates (bench/RESULTS_compression.md: session 20's integer grids, session
# 16's fp8 and bf16; csrc/sim/codec_cost.cc): (encode, decode) ns per float32 element, nearest.
MEASURED_NS = {"int8": (0.49, 0.19), "int4": (0.41, 0.19), "fp8_e4m3": (2.02, 0.60), "fp8_e5m2": (1.97, 0.71),
               "bf16": (1.50, 0.22)}


def test_default_codec_rates_are_the_measured_ones():
    """codec_ns -1 costs each codec at its measured rates, and feedback_ns -1 error feedback's pass
    at 0.85 ns (session 20): the same prediction, to the bit, as those rates passed (and one that
    the rates move)."""
    for codec, ns in MEASURED_NS.items():
        assert _run(codec)["time_us"]["median"] == _run(codec, codec_ns=ns)["time_us"]["median"], codec
    assert _run("int8", codec_ns=(1.2, 0.3))["time_us"]["median"] > _run("int8")["time_us"]["median"]

    def feedback(ns):
        return sim.predict("all_reduce", "ring", COUNT * 4, P, ETH_1G, compress="int8",
                           feedback_ns=ns)["time_us"]["median"]
    assert feedback(-1) == feedback(0.85) < feedback(1.5)


def test_error_feedback_pass_comes_before_the_collective():
    """feedback_ns: each rank's pass over its input (kernels/cpu_error_feedback.cc) delays its
    collective by that many ns per input element: all_reduce's input is COUNT, reduce_scatter's
    every rank's block (P x its output)."""
    for coll, elems in (("all_reduce", COUNT), ("reduce_scatter", COUNT)):
        def t(ns):
            return sim.predict(coll, "ring", COUNT * 4, P, ETH_1G, compress="int8", feedback_ns=ns)["time_us"]["median"]
        assert t(1000.0) - t(0.0) == pytest.approx(elems * 1000 * 1e-3)
    assert _run("int8")["time_us"]["median"] < \
        sim.predict("all_reduce", "ring", COUNT * 4, P, ETH_1G, compress="int8", feedback_ns=-1)["time_us"]["median"]
    with pytest.raises(ValueError, match="feedback_ns"):
        sim.predict("all_reduce", "ring", COUNT * 4, P, ETH_1G, feedback_ns=1.0)


def test_refused_arguments_are_named():
    with pytest.raises(ValueError, match="compress"):
        sim.predict("broadcast", "ring", 4096, P, ETH_1G, compress="int8")
    with pytest.raises(ValueError, match="compress"):
        sim.predict("all_reduce", "ring", 4096, P, ETH_1G, dtype="float64", compress="int8")
    with pytest.raises(ValueError, match="compress"):
        sim.predict("all_reduce", "ring", 4096, P, ETH_1G, compress="int3")


def test_streaming_hides_the_codec_behind_the_wire():
    """Coded whole, each of ring's steps pays encode, wire and decode in turn; streamed in pieces
    (COMMLIB_COMPRESS_PIECE_BYTES) the codec runs while earlier pieces travel, so at a codec faster
    than the wire the call costs what the wire does plus one piece's fill; at a codec slower than
    the wire, what the CPU does."""
    def t(codec_ns, piece):
        return sim.predict("all_reduce", "ring", 64 << 20, P, ETH_1G, compress="int8", codec_ns=codec_ns,
                           piece_bytes=piece)["time_us"]["median"]
    fast, slow = (1.2, 0.3), (30.0, 10.0)
    wire_only = t((0.0, 0.0), 256 << 10)  # (the reductions stream too: below t((0, 0), 0))
    assert wire_only <= t((0.0, 0.0), 0)
    assert wire_only < t(fast, 256 << 10) < 1.03 * wire_only < t(fast, 0)
    # CPU-bound: per rank, 2 (P - 1) steps of 16 Mi / P elements, each encoding and projecting its
    # send and decoding its receive (plus the sum's projection in the reduce-scatter half)
    chunk = (64 << 20) // 4 // P
    cpu_us = chunk * 1e-3 * ((P - 1) * (30 + 10 + 10 + 40) + (P - 1) * (30 + 10 + 10))
    assert cpu_us < t(slow, 256 << 10) < t(slow, 0)
