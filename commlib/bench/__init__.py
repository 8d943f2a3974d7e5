"""The benchmark suite behind ``commlib bench`` and ``commlib report``.

launcher  starts the ranks (or runs inside torchrun/srun/mpirun), merges, fits, tunes, reports
sweep     the measurement loop shared by every backend, and the commlib backend
gloo_peer, mpi_peer, memcpy   the references measured in the same run
table     the nccl-tests table;  model  the alpha-beta-gamma fit
tuning    building auto's tuning table from runs (reading and installing it: commlib.tuning)
report    index.html + report.md with plots
common    sizes, busbw factors, test data and references, machine info
"""
