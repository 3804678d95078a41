# Reduction kernels of torch-mojo for the CPU, compiled ahead of time into
# libtorch_mojo_kernels.so and called by libmojoccl for every reduction in
# host memory.
#
# The C entry point `tm_reduce` combines `nsrcs` equally sized buffers
# element by element into `dst` (which may alias any source); `tm_convert`
# turns a half type into float32 and back. The arithmetic, the numerics
# contract and the datatype/operation table are reduction.mojo's, shared
# with the GPU kernel.

from std.sys import simd_width_of
from std.algorithm import vectorize

from reduction import (
    OK,
    BAD_ARGS,
    BAD_DTYPE,
    Ptr,
    accumulation_type,
    combine,
    dispatch,
    finish,
    narrow,
    widen,
)


def reduce_typed[
    dt: DType, op: Int
](dst: Ptr, srcs: Ptr, nsrcs: Int, count: Int, divisor: Int):
    comptime acc = accumulation_type[dt]()
    comptime width = simd_width_of[acc]()
    var out = dst.unsafe_bitcast[Scalar[dt]]()
    var inputs = srcs.unsafe_bitcast[Pointer[Scalar[dt], MutUntrackedOrigin]]()
    var first = inputs[unsafe_offset=0]

    def body[w: Int](i: Int) {imm}:
        var a = widen[acc](first.unsafe_load[width=w](i))
        for s in range(1, nsrcs):
            var b = widen[acc](inputs[unsafe_offset=s].unsafe_load[width=w](i))
            a = combine[op](a, b)
        out.unsafe_store(i, narrow[dt](finish[op](a, divisor)))

    vectorize[width, unroll_factor=2](count, body)


@export("tm_reduce")
def tm_reduce(
    dst: Ptr,
    srcs: Ptr,
    nsrcs: Int,
    count: Int,
    dtype: Int32,
    op: Int32,
    divisor: Int,
) abi("C") -> Int32:
    if nsrcs < 1 or count < 0 or divisor < 1:
        return BAD_ARGS
    if count == 0:
        return OK

    @__parameter
    def run[dt: DType, op: Int]():
        reduce_typed[dt, op](dst, srcs, nsrcs, count, divisor)

    return dispatch[run](dtype, op)


# Conversions between a half type and float32, with the rounding of the
# reductions above: libmojoccl keeps half-type data in float32 while it
# crosses nodes, so that the result is rounded once, as on one node.


def convert_typed[
    to: DType, frm: DType
](dst: Ptr, src: Ptr, count: Int):
    comptime width = simd_width_of[DType.float32]()
    var out = dst.unsafe_bitcast[Scalar[to]]()
    var inp = src.unsafe_bitcast[Scalar[frm]]()

    def body[w: Int](i: Int) {imm}:
        comptime if to == DType.float32:
            out.unsafe_store(
                i, rebind[SIMD[to, w]](widen[DType.float32](inp.unsafe_load[width=w](i)))
            )
        else:
            var wide = rebind[SIMD[DType.float32, w]](inp.unsafe_load[width=w](i))
            out.unsafe_store(i, narrow[to](wide))

    vectorize[width](count, body)


@export("tm_convert")
def tm_convert(
    dst: Ptr, dst_dtype: Int32, src: Ptr, src_dtype: Int32, count: Int
) abi("C") -> Int32:
    """Float16 (6) or bfloat16 (9) to float32 (7), or float32 to either."""
    if count < 0:
        return BAD_ARGS
    if count == 0:
        return OK
    if src_dtype == 6 and dst_dtype == 7:
        convert_typed[DType.float32, DType.float16](dst, src, count)
    elif src_dtype == 9 and dst_dtype == 7:
        convert_typed[DType.float32, DType.bfloat16](dst, src, count)
    elif src_dtype == 7 and dst_dtype == 6:
        convert_typed[DType.float16, DType.float32](dst, src, count)
    elif src_dtype == 7 and dst_dtype == 9:
        convert_typed[DType.bfloat16, DType.float32](dst, src, count)
    else:
        return BAD_DTYPE
    return OK
