# Reduction kernels of torch-mojo, compiled ahead of time into
# libtorch_mojo_kernels.so and called by libmojoccl for every reduction.
#
# The C entry point `tm_reduce` combines `nsrcs` equally sized buffers
# element by element into `dst`; `tm_convert` turns a half type into
# float32 and back. Datatype and operation codes are NCCL's
# (ncclDataType_t, ncclRedOp_t), so libmojoccl passes them through unchanged.
#
# Numerics (the contract the tests check against torch):
# - float16/bfloat16 accumulate in float32 and are rounded once, at the end.
# - MIN/MAX propagate NaN, as torch.minimum/torch.maximum do.
# - AVG is SUM followed by one division by `divisor` (true division for
#   floating types, rounding toward zero for integers, as NCCL does).
# - Sources are combined in the order given, so every rank that passes the
#   same buffers in the same order gets bit-identical results.
# - `dst` may alias any source (in-place reduction).

from std.sys import simd_width_of
from std.algorithm import vectorize
from std.math import isnan
from std.memory import bitcast

# ncclRedOp_t
comptime OP_SUM = 0
comptime OP_PROD = 1
comptime OP_MAX = 2
comptime OP_MIN = 3
comptime OP_AVG = 4

# Return codes.
comptime OK = 0
comptime BAD_DTYPE = 1
comptime BAD_OP = 2
comptime BAD_ARGS = 3

comptime Ptr = OpaquePointer[MutUntrackedOrigin]


def accumulation_type[dt: DType]() -> DType:
    comptime if dt == DType.float16 or dt == DType.bfloat16:
        return DType.float32
    else:
        return dt


# bfloat16 <-> float32 conversions are done on the bit patterns. Written as
# plain casts, LLVM folds them into bfloat16 arithmetic that it then lowers
# through a compiler-runtime helper, which would tie this library to the Mojo
# installation it was built with.


@always_inline
def widen[
    acc: DType, dt: DType, w: Int
](x: SIMD[dt, w]) -> SIMD[acc, w]:
    comptime if dt == DType.bfloat16:
        var bits = bitcast[DType.uint16, w](x).cast[DType.uint32]() << 16
        return rebind[SIMD[acc, w]](bitcast[DType.float32, w](bits))
    else:
        return x.cast[acc]()


@always_inline
def narrow[
    dt: DType, acc: DType, w: Int
](a: SIMD[acc, w]) -> SIMD[dt, w]:
    comptime if dt == DType.bfloat16:
        # Round to nearest even; NaN stays a (quiet) NaN.
        var bits = bitcast[DType.uint32, w](rebind[SIMD[DType.float32, w]](a))
        var rounding = SIMD[DType.uint32, w](0x7FFF) + ((bits >> 16) & 1)
        var rounded = ((bits + rounding) >> 16).cast[DType.uint16]()
        var quiet_nan = SIMD[DType.uint16, w](0x7FC0)
        return bitcast[dt, w](isnan(a).select(quiet_nan, rounded))
    else:
        return a.cast[dt]()


@always_inline
def combine[
    op: Int, dt: DType, w: Int
](a: SIMD[dt, w], b: SIMD[dt, w]) -> SIMD[dt, w]:
    comptime if op == OP_SUM or op == OP_AVG:
        return a + b
    elif op == OP_PROD:
        return a * b
    elif op == OP_MAX:
        comptime if dt.is_floating_point():
            return isnan(a).select(a, isnan(b).select(b, max(a, b)))
        else:
            return max(a, b)
    else:
        comptime if dt.is_floating_point():
            return isnan(a).select(a, isnan(b).select(b, min(a, b)))
        else:
            return min(a, b)


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
        comptime if op == OP_AVG:
            a = a / SIMD[acc, w](Scalar[acc](divisor))
        out.unsafe_store(i, narrow[dt](a))

    vectorize[width, unroll_factor=2](count, body)


def reduce_dtype[
    dt: DType
](
    dst: Ptr, srcs: Ptr, nsrcs: Int, count: Int, op: Int32, divisor: Int
) -> Int32:
    if op == OP_SUM:
        reduce_typed[dt, OP_SUM](dst, srcs, nsrcs, count, divisor)
    elif op == OP_PROD:
        reduce_typed[dt, OP_PROD](dst, srcs, nsrcs, count, divisor)
    elif op == OP_MAX:
        reduce_typed[dt, OP_MAX](dst, srcs, nsrcs, count, divisor)
    elif op == OP_MIN:
        reduce_typed[dt, OP_MIN](dst, srcs, nsrcs, count, divisor)
    elif op == OP_AVG:
        reduce_typed[dt, OP_AVG](dst, srcs, nsrcs, count, divisor)
    else:
        return BAD_OP
    return OK


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
    # ncclDataType_t codes.
    if dtype == 0:
        return reduce_dtype[DType.int8](dst, srcs, nsrcs, count, op, divisor)
    elif dtype == 1:
        return reduce_dtype[DType.uint8](dst, srcs, nsrcs, count, op, divisor)
    elif dtype == 2:
        return reduce_dtype[DType.int32](dst, srcs, nsrcs, count, op, divisor)
    elif dtype == 3:
        return reduce_dtype[DType.uint32](dst, srcs, nsrcs, count, op, divisor)
    elif dtype == 4:
        return reduce_dtype[DType.int64](dst, srcs, nsrcs, count, op, divisor)
    elif dtype == 5:
        return reduce_dtype[DType.uint64](dst, srcs, nsrcs, count, op, divisor)
    elif dtype == 6:
        return reduce_dtype[DType.float16](dst, srcs, nsrcs, count, op, divisor)
    elif dtype == 7:
        return reduce_dtype[DType.float32](dst, srcs, nsrcs, count, op, divisor)
    elif dtype == 8:
        return reduce_dtype[DType.float64](dst, srcs, nsrcs, count, op, divisor)
    elif dtype == 9:
        return reduce_dtype[DType.bfloat16](
            dst, srcs, nsrcs, count, op, divisor
        )
    return BAD_DTYPE


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
