"""The benchmark suite behind ``commlib bench`` and ``commlib report``.

launcher  ``commlib bench``: arguments (command line, config), local_driver (starts every
          backend's ranks, merges passes), under_launcher (inside torchrun/srun/mpirun),
          rank_process (one rank of one backend), run_results (JSON, fit, tuning, summary)
sweep     the measurement loop shared by every backend, and the commlib backend
gloo_peer, mpi_peer, memcpy   the references measured in the same run
table     the nccl-tests table;  model  the alpha-beta-gamma fit
tuning    building auto's tuning table from runs (reading and installing it: commlib.core.tuning)
report    ``commlib report``: index.html + report.md, from bench_files (schema, loading),
          comparison (commlib vs peers per size), report_sections, report_plots, report_doc,
          report_format
common    sizes, busbw factors, test data and references, machine info
"""
