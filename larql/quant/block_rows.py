"""The frame of the row kernels that read GGUF blocks directly (kquant_rows.py): an LLVM IR intrinsic
per block layout whose per-block code a kernel module writes, with its accumulators as SSA values
(matvec_rows.py's reason: numba arrays of partial sums cost a store and a reload per block), two
blocks in flight, the row AHEAD rows on prefetched, and the constants and moves the unpacking uses."""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from larql.quant.ir_parts import hsum, in_pairs, ir_row, splat

I8, I16, I32, I64, F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()
V16I8, V16I32, V16F32 = ir.VectorType(I8, 16), ir.VectorType(I32, 16), ir.VectorType(F32, 16)
V8I8, V8I32, V8F32 = ir.VectorType(I8, 8), ir.VectorType(I32, 8), ir.VectorType(F32, 8)
V2I32, V64I8 = ir.VectorType(I32, 2), ir.VectorType(I8, 64)
AHEAD = 4  # rows ahead to prefetch (matvec_rows.py's reason: small matrices end before the prefetcher ramps up)


class Block:
    """What a block's codegen needs: the builder, the block's first byte, the activation's pointer
    at the block's first weight, the sums of 32, and the multiply-add intrinsics."""

    def __init__(self, builder, fma, fma8, base, x, xsum, slots):  # type: ignore[no-untyped-def]
        self.b, self.fma, self.fma8, self.base, self.x, self.xsum = builder, fma, fma8, base, x, xsum
        self.slots = slots  # 16 floats on the stack (spill / scalar)

    def spill(self, v):  # type: ignore[no-untyped-def]
        """Store a vector of up to 16 floats for `scalar` to read lane by lane: a broadcast from memory
        is one instruction where extracting a lane and splatting it is two or three."""
        self.b.store(v, self.b.bitcast(self.slots, ir.PointerType(v.type)))

    def scalar(self, i: int):  # type: ignore[no-untyped-def]
        return self.b.load(self.b.gep(self.slots, [ir.Constant(I64, i)], source_etype=F32), typ=F32)

    def byte(self, off: int):  # type: ignore[no-untyped-def]
        return self.b.gep(self.base, [ir.Constant(I64, off)], source_etype=I8)

    def load(self, off: int, ty):  # type: ignore[no-untyped-def]
        return self.b.load(self.b.bitcast(self.byte(off), ir.PointerType(ty)), typ=ty, align=1)

    def half(self, off: int):  # type: ignore[no-untyped-def]
        """The f16 at byte off, widened to float32 (exact, as kernels.F16_TOF32's table)."""
        return self.b.fpext(self.load(off, ir.HalfType()), F32)

    def xs(self, i: int):  # type: ignore[no-untyped-def]
        """The 16 activations from the block's weight i."""
        p = self.b.gep(self.x, [ir.Constant(I64, i)], source_etype=F32)
        return self.b.load(self.b.bitcast(p, ir.PointerType(V16F32)), typ=V16F32, align=4)

    def floats(self, q, signed: bool):  # type: ignore[no-untyped-def]
        """16 small integers (i8 lanes) as float32 (sign- or zero-extended, then the signed conversion
        x86 has: an unsigned one costs AVX2 several instructions)."""
        wide = self.b.sext(q, V16I32) if signed else self.b.zext(q, V16I32)
        return self.b.sitofp(wide, V16F32)

    def dot32(self, q0, q1, i: int, signed: bool):  # type: ignore[no-untyped-def]
        """Lane-wise q . x of 32 weights (two 16-lane i8 vectors) from the block's weight i."""
        t = self.b.fmul(self.floats(q0, signed), self.xs(i))
        return self.b.call(self.fma, [self.floats(q1, signed), self.xs(i + 16), t])


def bytes16(value: int):  # type: ignore[no-untyped-def]
    return ir.Constant(V16I8, [value] * 16)


def bytes_(n: int, value: int):  # type: ignore[no-untyped-def]
    return ir.Constant(ir.VectorType(I8, n), [value] * n)


def concat(b, lo, hi):  # type: ignore[no-untyped-def]
    """Two byte vectors of n lanes as one of 2n."""
    n = lo.type.count
    return b.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(I32, 2 * n), list(range(2 * n))))


def move_bits(b, v, src: int, dst: int, mask: int, n: int = 16):  # type: ignore[no-untyped-def]
    """The bits of each of the n bytes of v from bit src on moved to bit dst on, kept where `mask`
    has them: one constant shift and an and."""
    moved = b.shl(v, bytes_(n, dst - src)) if dst >= src else b.lshr(v, bytes_(n, src - dst))
    return b.and_(moved, bytes_(n, mask))


def i32s(value: int):  # type: ignore[no-untyped-def]
    return ir.Constant(V16I32, [value] * 16)


def add_scaled(blk, slot, dot, scale):  # type: ignore[no-untyped-def]
    """slot += dot * scale (scale a float32 scalar, in every lane)."""
    b = blk.b
    b.store(b.call(blk.fma, [dot, splat(b, scale, V16F32), b.load(slot)]), slot)


def row_kernel(block_bytes: int, block_weights: int, emit: Callable[..., None]):  # type: ignore[no-untyped-def]
    """An intrinsic row(w, r, x, xsum, out): out[r] = row r of the blocks w `[rows, bytes]` times x,
    each block's codegen by emit(blk, acc, macc) where acc is the block's two 16-lane accumulators
    (read and written through `acc[i]` slots) and macc its 8-lane one for the offsets."""

    @intrinsic
    def row(typingctx, w, r, x, xsum, out):  # type: ignore[no-untyped-def]
        if x.layout != "C" or xsum.layout != "C" or out.layout != "C":
            return None
        sig = types.void(w, r, x, xsum, out)

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            a = signature.args
            xa, ua, oo = (context.make_array(a[i])(context, builder, args[i]).data for i in (2, 3, 4))
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(V16F32, [V16F32] * 3),
                                                 "llvm.fma.v16f32")
            fma8 = cgutils.get_or_insert_function(builder.module, ir.FunctionType(V8F32, [V8F32] * 3),
                                                  "llvm.fma.v8f32")
            prefetch = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [
                ir.PointerType(I8), I32, I32, I32]), "llvm.prefetch")
            rowp, nb = ir_row(context, builder, a[0], args[0], args[1], block_bytes)
            ahead = ir_row(context, builder, a[0], args[0], builder.add(args[1], ir.Constant(I64, AHEAD)),
                           block_bytes)[0]
            # blocks alternate between two sets of accumulators, and within a block two more: four
            # multiply-add chains in flight
            acc = [[cgutils.alloca_once_value(builder, ir.Constant(V16F32, None)) for _ in range(2)]
                   for _ in range(2)]
            macc = [cgutils.alloca_once_value(builder, ir.Constant(V8F32, None)) for _ in range(2)]
            slots = builder.bitcast(cgutils.alloca_once(builder, V16F32), ir.PointerType(F32))

            def block(k, j):  # type: ignore[no-untyped-def]
                off = builder.mul(k, ir.Constant(I64, block_bytes))
                # the row AHEAD rows on: a line per 64 bytes (small blocks: every other block, one line)
                for line in (range(0, block_bytes, 64) if block_bytes >= 64 else range(0 if j == 0 else 64, 1)):
                    p = builder.gep(ahead, [builder.add(off, ir.Constant(I64, line))], source_etype=I8)
                    builder.call(prefetch, [p, ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])
                base = builder.gep(rowp, [off], source_etype=I8)
                x = builder.gep(xa, [builder.mul(k, ir.Constant(I64, block_weights))], source_etype=F32)
                xsum = builder.gep(ua, [builder.mul(k, ir.Constant(I64, block_weights // 32))],
                                   source_etype=F32)
                blk = Block(builder, fma, fma8, base, x, xsum, slots)
                emit(blk, acc[j], macc[j])

            in_pairs(builder, nb, block)
            v = builder.fadd(builder.fadd(builder.load(acc[0][0]), builder.load(acc[0][1])),
                             builder.fadd(builder.load(acc[1][0]), builder.load(acc[1][1])))
            m = builder.fadd(builder.load(macc[0]), builder.load(macc[1]))
            total = builder.fsub(hsum(builder, v), hsum(builder, m))
            builder.store(total, builder.gep(oo, [args[1]], source_etype=F32))
            return context.get_dummy_value()

        return sig, codegen

    return row


