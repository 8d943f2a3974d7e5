"""What the benchmark suite (commlib.bench) and the simulator (commlib.sim) share, so that neither
imports the other: sizes, bus-bandwidth factors and machine facts (common), the nccl-tests table
(table), the alpha-beta-gamma model (model), device buffers for the benchmarks (device_buffers) and
the report's "At scale" section from simulator runs (sim_report)."""
