"""`torch-mojo bench`: the benchmark (`python -m torch_mojo.bench`).

sweep.py    what each rank runs: every collective at every size, on each
            column (mojo, gloo, the library alone, MPI, ...), and --ddp,
            --kernels, --model
runners.py  how one column times one call (a runner per kind)
report.py   the tables, the .csv and the plots
model.py    --model: libmojoccl's cost model of the all-reduce between nodes
"""

from torch_mojo.bench.sweep import BUS_FACTOR, main, parse_size

__all__ = ["BUS_FACTOR", "main", "parse_size"]
