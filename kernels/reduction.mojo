# The element-wise reduction every torch-mojo kernel shares: the CPU
# library (reduce.mojo) and the GPU kernel (gpu_reduce.mojo) both combine
# values with the functions below and pick their datatype and operation with
# `dispatch`, so CPU and GPU results follow one definition.
#
# Datatype and operation codes are NCCL's (ncclDataType_t, ncclRedOp_t), so
# libmojoccl passes them through unchanged.
#
# Numerics (the contract the tests check against torch):
# - float16/bfloat16 accumulate in float32 and are rounded once, at the end.
# - MIN/MAX propagate NaN, as torch.minimum/torch.maximum do.
# - AVG is SUM followed by one division by `divisor` (true division for
#   floating types, rounding toward zero for integers, as NCCL does).
# - Sources are combined in the order given, so every rank that passes the
#   same buffers in the same order gets bit-identical results.

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


@always_inline
def finish[
    op: Int, acc: DType, w: Int
](a: SIMD[acc, w], divisor: Int) -> SIMD[acc, w]:
    """The last step of a reduction: AVG's one division."""
    comptime if op == OP_AVG:
        return a / SIMD[acc, w](Scalar[acc](divisor))
    else:
        return a


@always_inline
def dispatch[
    reduce: def[dt: DType, op: Int]() capturing -> None
](dtype: Int32, op: Int32) -> Int32:
    """Runs `reduce` instantiated for an ncclDataType_t and ncclRedOp_t code:
    the one table of the datatypes and operations the kernels take."""
    if dtype == 0:
        return dispatch_op[DType.int8, reduce](op)
    elif dtype == 1:
        return dispatch_op[DType.uint8, reduce](op)
    elif dtype == 2:
        return dispatch_op[DType.int32, reduce](op)
    elif dtype == 3:
        return dispatch_op[DType.uint32, reduce](op)
    elif dtype == 4:
        return dispatch_op[DType.int64, reduce](op)
    elif dtype == 5:
        return dispatch_op[DType.uint64, reduce](op)
    elif dtype == 6:
        return dispatch_op[DType.float16, reduce](op)
    elif dtype == 7:
        return dispatch_op[DType.float32, reduce](op)
    elif dtype == 8:
        return dispatch_op[DType.float64, reduce](op)
    elif dtype == 9:
        return dispatch_op[DType.bfloat16, reduce](op)
    return BAD_DTYPE


@always_inline
def dispatch_op[
    dt: DType, reduce: def[dt: DType, op: Int]() capturing -> None
](op: Int32) -> Int32:
    if op == OP_SUM:
        reduce[dt, OP_SUM]()
    elif op == OP_PROD:
        reduce[dt, OP_PROD]()
    elif op == OP_MAX:
        reduce[dt, OP_MAX]()
    elif op == OP_MIN:
        reduce[dt, OP_MIN]()
    elif op == OP_AVG:
        reduce[dt, OP_AVG]()
    else:
        return BAD_OP
    return OK
