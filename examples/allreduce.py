"""All-reduce with every algorithm, run by any launcher:

    torchrun --nproc-per-node 4 examples/allreduce.py
    mpirun -np 4 python examples/allreduce.py      (MASTER_ADDR/MASTER_PORT default to 127.0.0.1:29500)
"""
import numpy as np

import commlib


def main():
    comm = commlib.init()
    expected = sum(range(comm.size))
    for algorithm in commlib.algorithms("all_reduce"):
        x = np.full(1000, comm.rank, np.float32)
        comm.all_reduce(x, op="sum", algorithm=algorithm)
        assert (x == expected).all(), (algorithm, x[:4])
    w = comm.all_reduce(x, async_op=True)        # asynchronous; calls complete in order
    w.wait()
    if comm.rank == 0:
        print(f"{comm.size} ranks: every all_reduce algorithm gave {expected} "
              f"({', '.join(commlib.algorithms('all_reduce'))})")
    comm.close()


if __name__ == "__main__":
    main()
