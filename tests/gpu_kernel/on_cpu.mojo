# The GPU kernel's own code (kernels/gpu_reduce.mojo: reduce_slice, with the
# datatype/operation dispatch and the arithmetic), compiled for the CPU so
# that the tests can run it without a GPU: `threads` plays the grid, each
# "thread" doing the elements first, first + threads, ... as on a GPU.
#
#   mojo build --emit shared-lib -I kernels tests/gpu_kernel/on_cpu.mojo

from gpu_reduce import MAX_SOURCES, reduce_slice
from reduction import OK, Ptr


@export("tm_gpu_reduce_on_cpu")
def tm_gpu_reduce_on_cpu(
    dst: Ptr,
    sources: Ptr,
    nsrcs: Int32,
    count: Int64,
    dtype: Int32,
    op: Int32,
    divisor: Int64,
    threads: Int64,
) abi("C") -> Int32:
    var addresses = sources.unsafe_bitcast[UInt64]().unsafe_load[width=MAX_SOURCES](0)
    for first in range(Int(threads)):
        var rc = reduce_slice(
            dst, addresses, Int(nsrcs), first, Int(threads), Int(count), dtype, op, Int(divisor)
        )
        if rc != OK:
            return rc
    return OK
