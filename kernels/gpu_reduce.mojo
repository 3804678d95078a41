# The GPU reduction kernel of torch-mojo: `tm_gpu_reduce` combines up to
# MAX_SOURCES equally sized device buffers element by element into `dst`,
# with the arithmetic of reduction.mojo (the CPU kernels' own), so a GPU
# reduction rounds exactly as a CPU one.
#
# gpu_emit.mojo compiles it ahead of time for one GPU architecture (PTX for
# NVIDIA, a code object for AMD); libmojoccl loads that image with the
# driver the process already uses and launches it on the caller's stream.
#
# Parameters as libmojoccl passes them (cpp/ccl/device_kernels.cc):
#   dst      device pointer, may alias a source
#   sources  MAX_SOURCES device addresses, the first `nsrcs` used
#   nsrcs    1..MAX_SOURCES
#   count    elements per buffer
#   dtype    ncclDataType_t, op ncclRedOp_t; divisor for AVG (>= 1)
# The host checks every argument before launching: the kernel trusts them.
# Each thread handles the elements first, first + stride, ... (a grid-stride
# loop, in 16-byte vectors when the buffers allow), so any grid size covers
# any count.

from std.sys import size_of

from max.gpu import block_dim, global_idx, grid_dim

from reduction import Ptr, accumulation_type, combine, dispatch, finish, narrow, widen

comptime MAX_SOURCES = 16
comptime Addresses = SIMD[DType.uint64, MAX_SOURCES]
comptime VECTOR_BYTES = 16


@always_inline
def source[dt: DType](sources: Addresses, s: Int) -> Pointer[Scalar[dt], MutUntrackedOrigin]:
    return Pointer[Scalar[dt], MutUntrackedOrigin](unsafe_from_address=Int(sources[s]))


@always_inline
def reduce_units[
    dt: DType, op: Int, w: Int
](dst: Ptr, sources: Addresses, nsrcs: Int, start: Int, first: Int, stride: Int, units: Int, divisor: Int):
    """The work of one GPU thread: units first, first + stride, ... of `w`
    elements each, from element `start` on. The tests also run it on the
    CPU, with `first` and `stride` standing for a thread's place in the grid."""
    comptime acc = accumulation_type[dt]()
    comptime alignment = w * size_of[Scalar[dt]]()
    var out = dst.unsafe_bitcast[Scalar[dt]]()
    var unit = first
    while unit < units:
        var i = start + unit * w
        var a = widen[acc, dt, w](source[dt](sources, 0).unsafe_load[width=w, alignment=alignment](i))
        # Unrolled, so that each address is read from the kernel's arguments
        # as a constant: indexing them with a variable would copy them all to
        # the thread's stack.
        comptime for s in range(1, MAX_SOURCES):
            if s < nsrcs:
                var b = widen[acc, dt, w](source[dt](sources, s).unsafe_load[width=w, alignment=alignment](i))
                a = combine[op, acc, w](a, b)
        out.unsafe_store[alignment=alignment](i, narrow[dt, acc, w](finish[op, acc, w](a, divisor)))
        unit += stride


@always_inline
def vector_aligned(dst: Ptr, sources: Addresses, nsrcs: Int) -> Bool:
    var aligned = Int(dst) % VECTOR_BYTES == 0
    comptime for s in range(MAX_SOURCES):
        if s < nsrcs:
            aligned = aligned and Int(sources[s]) % VECTOR_BYTES == 0
    return aligned


@always_inline
def reduce_slice(
    dst: Ptr,
    sources: Addresses,
    nsrcs: Int,
    first: Int,
    stride: Int,
    count: Int,
    dtype: Int32,
    op: Int32,
    divisor: Int,
) -> Int32:
    """16-byte loads and stores where every buffer is 16-byte aligned (the
    memory system's widest access), then the remaining elements one by one."""

    @__parameter
    def run[dt: DType, op: Int]():
        comptime w = VECTOR_BYTES // size_of[Scalar[dt]]()
        var vectors = count // w if vector_aligned(dst, sources, nsrcs) else 0
        reduce_units[dt, op, w](dst, sources, nsrcs, 0, first, stride, vectors, divisor)
        reduce_units[dt, op, 1](dst, sources, nsrcs, vectors * w, first, stride, count - vectors * w, divisor)

    return dispatch[run](dtype, op)


def tm_gpu_reduce(
    dst: Ptr,
    sources: Addresses,
    nsrcs: Int32,
    count: Int64,
    dtype: Int32,
    op: Int32,
    divisor: Int64,
):
    # GPU kernel arguments are fixed-width integers (not Int).
    _ = reduce_slice(
        dst,
        sources,
        Int(nsrcs),
        Int(global_idx.x),
        Int(grid_dim.x * block_dim.x),
        Int(count),
        dtype,
        op,
        Int(divisor),
    )
