"""The simulator (docs/DESIGN.md "Engines": the third engine): the registry's schedules played on modelled
clusters by the C++ event engine (csrc/sim), up to thousands of ranks.

    from commlib import sim
    sim.predict("all_reduce", "ring", 1 << 30, 8, "dgx-h100")["busbw_GBps"]
    sim.load("topo.json"); sim.PRESETS["dgx-a100"]

Command line: ``commlib sim ...`` and ``commlib tune --sim TOPOLOGY``; the model, its parameters
and its validation are in docs/simulator.md.
"""
from commlib.sim.engine import algorithms_for, predict, sweep
from commlib.sim.fit import from_bench
from commlib.sim.topology import PRESETS, Topology, TopologyError, load

__all__ = ["predict", "sweep", "algorithms_for", "Topology", "TopologyError", "PRESETS", "load", "from_bench"]
