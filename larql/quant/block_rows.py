"""The frame of the row kernels that read GGUF blocks directly (kquant_rows.py): an LLVM IR intrinsic
per block layout whose per-block code a kernel module writes, with its accumulators as SSA values
(matvec_rows.py's reason: numba arrays of partial sums cost a store and a reload per block), two
blocks in flight, the rows AHEAD rows on prefetched, and the constants and moves the unpacking uses.

A kernel may take several rows at once (`rows`): each block's code is written for all of them
interleaved, so that the activation a block multiplies is loaded once for the rows, not once per row
(the loads of x were as many as the multiply-adds). Each row's arithmetic is the one-row kernel's, in
the same order: the same bits."""

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

    def __init__(self, builder, fma, fma8, base, x, xsum):  # type: ignore[no-untyped-def]
        self.b, self.fma, self.fma8, self.base, self.x, self.xsum = builder, fma, fma8, base, x, xsum

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


def row_kernel(block_bytes: int, block_weights: int, emit: Callable[..., None], rows: int = 1):  # type: ignore[no-untyped-def]
    """An intrinsic row(w, r, x, xsum, out): out[r + i] = row r + i of the blocks w `[rows, bytes]` times
    x for i < `rows`, each block's codegen by emit(blks, accs, maccs) for those rows at once: blks[i]
    row i's Block, accs[i] its two 16-lane accumulators (read and written through slots) and maccs[i]
    its 8-lane one for the offsets."""

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
            first = [builder.add(args[1], ir.Constant(I64, i)) for i in range(rows)]
            rowp = [ir_row(context, builder, a[0], args[0], ri, block_bytes)[0] for ri in first]
            nb = ir_row(context, builder, a[0], args[0], args[1], block_bytes)[1]
            ahead = [ir_row(context, builder, a[0], args[0], builder.add(ri, ir.Constant(I64, AHEAD)),
                            block_bytes)[0] for ri in first]
            # blocks alternate between two sets of accumulators, and within a block two more: four
            # multiply-add chains in flight per row
            acc = [[[cgutils.alloca_once_value(builder, ir.Constant(V16F32, None)) for _ in range(2)]
                    for _ in range(2)] for _ in range(rows)]
            macc = [[cgutils.alloca_once_value(builder, ir.Constant(V8F32, None)) for _ in range(2)]
                    for _ in range(rows)]

            def block(k, j):  # type: ignore[no-untyped-def]
                off = builder.mul(k, ir.Constant(I64, block_bytes))
                # the rows AHEAD rows on: a line per 64 bytes (small blocks: every other block, one line)
                for pa in ahead:
                    for line in (range(0, block_bytes, 64) if block_bytes >= 64 else range(0 if j == 0 else 64, 1)):
                        p = builder.gep(pa, [builder.add(off, ir.Constant(I64, line))], source_etype=I8)
                        builder.call(prefetch, [p, ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])
                x = builder.gep(xa, [builder.mul(k, ir.Constant(I64, block_weights))], source_etype=F32)
                xsum = builder.gep(ua, [builder.mul(k, ir.Constant(I64, block_weights // 32))],
                                   source_etype=F32)
                blks = [Block(builder, fma, fma8, builder.gep(p, [off], source_etype=I8), x, xsum) for p in rowp]
                emit(blks, [acc[i][j] for i in range(rows)], [macc[i][j] for i in range(rows)])

            in_pairs(builder, nb, block)
            for i in range(rows):
                v = builder.fadd(builder.fadd(builder.load(acc[i][0][0]), builder.load(acc[i][0][1])),
                                 builder.fadd(builder.load(acc[i][1][0]), builder.load(acc[i][1][1])))
                m = builder.fadd(builder.load(macc[i][0]), builder.load(macc[i][1]))
                total = builder.fsub(hsum(builder, v), hsum(builder, m))
                builder.store(total, builder.gep(oo, [first[i]], source_etype=F32))
            return context.get_dummy_value()

        return sig, codegen

    return row


def each_row(emit: Callable[..., None]) -> Callable[..., None]:
    """A one-row block codegen emit(blk, acc, macc) as row_kernel's emit for any number of rows: the
    rows' code one after the other (their loads of x the same values, which LLVM loads once)."""
    def rows_emit(blks, accs, maccs):  # type: ignore[no-untyped-def]
        for blk, acc, macc in zip(blks, accs, maccs):
            emit(blk, acc, macc)

    return rows_emit
