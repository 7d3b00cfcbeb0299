"""Does Triton split an MLA decode loop into warp-specialised partitions on sm_90? A compile probe
(no GPU needed): the stage-1 loop of the MLA cell reduced to its arithmetic (a 64-head q tile of
512 + 64 columns, the latent K tile shared as V, online softmax), compiled for sm_90 with
`tl.range(..., warp_specialize=...)` on and off, its K tile read by a pointer gather over slot ids
or by a tensor descriptor (TMA) one page per box. Prints, per variant, whether the compiled code
has partitions (`setmaxnreg`, the register split a producer / consumer kernel makes) and its
shared memory, wgmma and bulk-copy counts, or the compiler's failure.

    python benchmarks/warp_specialize_probe.py            # the table recorded in docs/peer-table.md
"""
from __future__ import annotations

import itertools
import os

os.environ.pop("TRITON_INTERPRET", None)  # compiling, not interpreting

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402


@triton.jit
def mla_loop(Q, K, Idx, Out, n_keys, stride_qh, stride_kt, stride_oh,
             H: tl.constexpr, BN: tl.constexpr, DM: tl.constexpr, DPE: tl.constexpr,
             WS: tl.constexpr, TMA: tl.constexpr):
    rows = tl.arange(0, H)
    cols = tl.arange(0, DM)
    cols_pe = tl.arange(0, DPE)
    q = tl.load(Q + rows[:, None] * stride_qh + cols[None, :])
    q_pe = tl.load(Q + rows[:, None] * stride_qh + DM + cols_pe[None, :])
    if TMA:  # Idx holds page ids, BN keys a page: one box per page
        k_desc = tl.make_tensor_descriptor(K, shape=[n_keys * 64, DM + DPE], strides=[stride_kt, 1],
                                           block_shape=[BN, DM])
        pe_desc = tl.make_tensor_descriptor(K, shape=[n_keys * 64, DM + DPE], strides=[stride_kt, 1],
                                            block_shape=[BN, DPE])
    m = tl.full([H], float("-inf"), tl.float32)
    denom = tl.zeros([H], tl.float32)
    acc = tl.zeros([H, DM], tl.float32)
    for start in tl.range(0, n_keys, BN, warp_specialize=WS):
        if TMA:
            page = tl.load(Idx + start // BN)
            k = k_desc.load([page * BN, 0])
            k_pe = pe_desc.load([page * BN, DM])
        else:  # Idx holds slot ids
            slot = tl.load(Idx + start + tl.arange(0, BN)).to(tl.int64)
            k = tl.load(K + slot[:, None] * stride_kt + cols[None, :])
            k_pe = tl.load(K + slot[:, None] * stride_kt + DM + cols_pe[None, :])
        qk = tl.dot(q, tl.trans(k)) + tl.dot(q_pe, tl.trans(k_pe))
        m_new = tl.maximum(m, tl.max(qk, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(qk - m_new[:, None])
        denom = denom * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(k.dtype), k)
        m = m_new
    tl.store(Out + rows[:, None] * stride_oh + cols[None, :], acc / denom[:, None])


SIGNATURE = {"Q": "*bf16", "K": "*bf16", "Idx": "*i32", "Out": "*fp32", "n_keys": "i32", "stride_qh": "i32",
             "stride_kt": "i32", "stride_oh": "i32", "H": "constexpr", "BN": "constexpr", "DM": "constexpr",
             "DPE": "constexpr", "WS": "constexpr", "TMA": "constexpr"}


def probe(ws: bool, tma: bool, warps: int, block_n: int = 16, stages: int = 2) -> str:
    consts = dict(H=64, BN=block_n, DM=512, DPE=64, WS=ws, TMA=tma)
    try:
        kernel = triton.compile(ASTSource(mla_loop, SIGNATURE, consts), target=GPUTarget("cuda", 90, 32),
                                options=dict(num_warps=warps, num_stages=stages))
    except Exception as exc:  # the compiler's own failure is the finding
        return f"fails: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
    ptx = kernel.asm["ptx"]
    return (f"setmaxnreg {ptx.count('setmaxnreg')}, shared {kernel.metadata.shared} B, "
            f"wgmma {ptx.count('wgmma.mma_async')}, cp.async.bulk {ptx.count('cp.async.bulk')}")


def main() -> None:
    print(f"triton {triton.__version__}, sm_90, 64 heads x (512 + 64), 16 keys a tile, 2 stages")
    print("| warp_specialize | K load | warps | compiled |\n|---|---|---|---|")
    for ws, tma, warps in itertools.product((False, True), (False, True), (4, 8)):
        print(f"| {ws} | {'TMA, a page a box' if tma else 'gather by slot'} | {warps} | {probe(ws, tma, warps)} |")


if __name__ == "__main__":
    main()
