"""Triton flash attention for K/V heads shared by a group of query heads (MQA, GQA), with a boolean mask.

One program owns ``BLOCK_M`` rows of one K/V head's group, a row being a (query, head) pair ordered query-major
(row ``s * G + g`` is query ``s`` of head ``kv_head * G + g``, ``G = H / Hkv``), and walks the keys ``BLOCK_N``
at a time with an online softmax in fp32: each K/V tile is read once for all the heads that share it, as in the
packed-SDPA path, and the output rows land in ``[B, Sq, H, D]`` memory, so the caller's
``transpose(1, 2).reshape(B * Sq, H * D)`` is free.

The mask is the boolean ``may_attend[B, Sq, Sk]`` itself (any strides, so the suffix pass's expanded
``[B, 1, Sk] -> [B, 50, Sk]`` view costs nothing), read per tile: no additive mask is ever built. Numerics follow
:func:`..reference.attention` with :func:`..reference.prepare_attention_mask`: a key a row may not attend gets
``MASKED_SCORE`` added to its score, so a row with no allowed key averages V uniformly over all ``Sk`` keys,
exactly like the reference; tile padding beyond ``Sk`` is ``-inf`` and never counts.

When the grid would leave most of the GPU idle (the suffix pass: 51 queries x 8 heads are 7 programs of 64 rows
at batch 1), the keys are split over several programs (flash-decoding) that write unnormalized partial results
``(acc, max, sum)`` in fp32, and a second small kernel combines them. The split count is a function of shapes
and the SM count only (host integers), so the call stays CUDA-graph capture safe.

Registered as the custom op ``embodied_accel::mqa_attention`` with a fake implementation, so ``torch.compile``
traces it without a graph break. Also runs on the CPU under ``TRITON_INTERPRET=1`` (tests).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..reference import MASKED_SCORE
from .dispatch import eager_direct

_MASKED_SCORE = tl.constexpr(MASKED_SCORE)

#: SM count and opt-in shared memory per block (bytes) assumed where there is no CUDA device (the interpreter,
#: the compile-only check): an H100 SXM, so CPU tests take the same decisions as the GPU the kernel is tuned for.
#: ``tools/check_triton_compile.py`` sets these to each architecture it compiles for.
INTERPRETER_SM_COUNT = 132
INTERPRETER_SHARED_BYTES = 232448

#: bf16/fp16 tiles at head_dim 256 with three pipeline stages need 136 KiB of shared memory on sm_90 and
#: 100 KiB on sm_80/89 (what Triton allocates, read from compiled cubins); below this limit, two stages.
THREE_STAGE_MIN_SHARED_BYTES = 110 * 1024


@dataclass(frozen=True)
class AttentionLaunch:
    """Launch parameters of the attention kernel.

    ``block_m``: (query, head) rows per program; ``block_n``: keys per iteration; ``key_splits``: programs the
    keys are split over (0: chosen from the grid size and the SM count, see :func:`key_split_plan`).
    """

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    key_splits: int = 0


def default_launch(head_dim: int, dtype: torch.dtype, shared_bytes: int = INTERPRETER_SHARED_BYTES) -> AttentionLaunch:
    """Block sizes for a head dim and I/O dtype, without autotuning (nothing runs at import or first call).

    The largest tiles that fit shared memory without register spills on sm_80 / sm_90, read from compiled kernels
    (the derivation is in docs/gpu.md); fp32 I/O gets smaller tiles.
    """
    if dtype == torch.float32:
        return AttentionLaunch(block_m=32, block_n=16 if head_dim > 64 else 32, num_warps=4, num_stages=2)
    # GPUs with 99 KiB per block (sm_86/sm_89: RTX 3090/4090, L40) cannot hold the third stage
    stages = 3 if shared_bytes >= THREE_STAGE_MIN_SHARED_BYTES else 2
    return AttentionLaunch(block_m=64, block_n=32, num_warps=8 if head_dim > 64 else 4, num_stages=stages)


@functools.cache
def _cuda_device_limits(device: torch.device) -> tuple[int, int]:
    properties = torch.cuda.get_device_properties(device)
    shared_bytes = getattr(properties, "shared_memory_per_block_optin", INTERPRETER_SHARED_BYTES)
    return properties.multi_processor_count, shared_bytes


def _device_limits(device: torch.device) -> tuple[int, int]:
    """``(SM count, opt-in shared memory per block)`` of ``device``; the H100 figures without a CUDA device."""
    if device.type != "cuda":
        return INTERPRETER_SM_COUNT, INTERPRETER_SHARED_BYTES
    return _cuda_device_limits(device)


def key_split_plan(programs: int, key_blocks: int, sm_count: int, requested: int = 0) -> tuple[int, int]:
    """``(splits, key blocks per split)`` for a grid of ``programs`` row blocks over ``key_blocks`` key blocks.

    ``requested`` > 0 forces that many splits (at most one per key block). Automatically (0), when the row blocks
    leave SMs idle: the split count minimizing ``ceil(programs * splits / sm_count) * blocks per split`` (one program
    per SM at a time), the fewest among equals, each split walking at least two key blocks (a split costs a write
    and re-read of its fp32 partials). Every split gets a key block, so each partial softmax has a finite maximum.
    """
    if requested > 0:
        splits = min(requested, key_blocks)
    elif programs < sm_count and key_blocks >= 4:

        def cost(n: int) -> tuple[int, int]:  # (waves x key blocks per program, splits) of n requested splits
            per = triton.cdiv(key_blocks, n)
            actual = triton.cdiv(key_blocks, per)
            return triton.cdiv(programs * actual, sm_count) * per, actual

        splits = cost(min(range(1, key_blocks // 2 + 1), key=cost))[1]
    else:
        splits = 1
    per_split = triton.cdiv(key_blocks, splits)
    return triton.cdiv(key_blocks, per_split), per_split


@triton.jit
def _mqa_attention_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr, acc_ptr, max_ptr, sum_ptr,
    sq_b, sq_h, sq_s, sq_d, sk_b, sk_h, sk_n, sk_d, sv_b, sv_h, sv_n, sv_d, sm_b, sm_s, sm_n, so_b, so_s, so_h,
    kv_heads, group, n_rows, n_keys, blocks_per_split, scale,
    HAS_MASK: tl.constexpr, SPLIT: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)  # block of (query, head) rows
    pid_bh = tl.program_id(1)  # b * kv_heads + kv_head
    pid_split = tl.program_id(2)  # key split (0 when unsplit)
    b = pid_bh // kv_heads
    kv_head = pid_bh % kv_heads
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_valid = rows < n_rows
    query = rows // group
    head = kv_head * group + rows % group
    dims = tl.arange(0, BLOCK_D)
    dim_valid = dims < HEAD_DIM

    q_tile = q_ptr + b * sq_b + head[:, None] * sq_h + query[:, None] * sq_s + dims[None, :] * sq_d
    q = tl.load(q_tile, mask=row_valid[:, None] & dim_valid[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
    k_base = k_ptr + b * sk_b + kv_head * sk_h
    v_base = v_ptr + b * sv_b + kv_head * sv_h
    mask_rows = mask_ptr + b * sm_b + query * sm_s  # [BLOCK_M]: the G rows of a query share its mask row

    row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    key_start = pid_split * blocks_per_split * BLOCK_N
    key_stop = tl.minimum(n_keys, key_start + blocks_per_split * BLOCK_N)
    for start in range(key_start, key_stop, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_valid = keys < n_keys
        k_t = tl.load(  # K^T tile [BLOCK_D, BLOCK_N]
            k_base + keys[None, :] * sk_n + dims[:, None] * sk_d,
            mask=key_valid[None, :] & dim_valid[:, None], other=0.0,
        )  # fmt: skip
        scores = tl.dot(q, k_t, input_precision=PRECISION) * scale  # [BLOCK_M, BLOCK_N] fp32
        if HAS_MASK:
            allowed = tl.load(
                mask_rows[:, None] + keys[None, :] * sm_n, mask=row_valid[:, None] & key_valid[None, :], other=0
            )
            scores = tl.where(allowed != 0, scores, scores + _MASKED_SCORE)  # the reference's additive mask
        scores = tl.where(key_valid[None, :], scores, float("-inf"))  # padding past Sk never counts
        new_max = tl.maximum(row_max, tl.max(scores, 1))  # finite: every tile holds at least one key < Sk
        correction = tl.exp(row_max - new_max)
        probs = tl.exp(scores - new_max[:, None])
        row_sum = row_sum * correction + tl.sum(probs, 1)
        v = tl.load(
            v_base + keys[:, None] * sv_n + dims[None, :] * sv_d,
            mask=key_valid[:, None] & dim_valid[None, :], other=0.0,
        )  # fmt: skip
        acc = tl.dot(probs.to(v.dtype), v, acc * correction[:, None], input_precision=PRECISION)
        row_max = new_max

    out_mask = row_valid[:, None] & dim_valid[None, :]
    if SPLIT:  # unnormalized partials [splits, B * Hkv, rows, D] and their max / sum [splits, B * Hkv, rows]
        partial = (pid_split * tl.num_programs(1) + pid_bh) * n_rows + rows
        tl.store(acc_ptr + partial[:, None] * HEAD_DIM + dims[None, :], acc, mask=out_mask)
        tl.store(max_ptr + partial, row_max, mask=row_valid)
        tl.store(sum_ptr + partial, row_sum, mask=row_valid)
    else:
        out = acc / row_sum[:, None]
        out_tile = out_ptr + b * so_b + query[:, None] * so_s + head[:, None] * so_h + dims[None, :]
        tl.store(out_tile, out.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _combine_key_splits_kernel(
    acc_ptr, max_ptr, sum_ptr, out_ptr, so_b, so_s, so_h, kv_heads, group, n_rows, n_splits,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
):
    """``out = sum_j exp(max_j - M) acc_j / sum_j exp(max_j - M) sum_j`` with ``M = max_j max_j``.

    The partials stay unnormalized: a row with no allowed key in a split has ``max_j = MASKED_SCORE`` there, and
    weighting by ``sum_j`` (its key count) keeps the uniform average over all keys that the reference gives.
    """
    pid_r = tl.program_id(0)
    pid_bh = tl.program_id(1)
    n_bh = tl.num_programs(1)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    row_valid = rows < n_rows
    dims = tl.arange(0, BLOCK_D)
    out_mask = row_valid[:, None] & (dims[None, :] < HEAD_DIM)

    overall_max = tl.full([BLOCK_R], float("-inf"), tl.float32)
    for split in range(n_splits):
        split_max = tl.load(max_ptr + (split * n_bh + pid_bh) * n_rows + rows, mask=row_valid, other=0.0)
        overall_max = tl.maximum(overall_max, split_max)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    total = tl.zeros([BLOCK_R], tl.float32)
    for split in range(n_splits):
        partial = (split * n_bh + pid_bh) * n_rows + rows
        weight = tl.exp(tl.load(max_ptr + partial, mask=row_valid, other=0.0) - overall_max)
        total += weight * tl.load(sum_ptr + partial, mask=row_valid, other=1.0)
        partial_acc = tl.load(acc_ptr + partial[:, None] * HEAD_DIM + dims[None, :], mask=out_mask, other=0.0)
        acc += weight[:, None] * partial_acc

    b = pid_bh // kv_heads
    query = rows // group
    head = (pid_bh % kv_heads) * group + rows % group
    out_tile = out_ptr + b * so_b + query[:, None] * so_s + head[:, None] * so_h + dims[None, :]
    tl.store(out_tile, (acc / total[:, None]).to(out_ptr.dtype.element_ty), mask=out_mask)


@dataclass(frozen=True)
class LaunchPlan:
    """What one call launches: the resolved tiles, the row blocks and how the keys are split."""

    launch: AttentionLaunch
    row_blocks: int
    splits: int
    keys_per_split: int  # in key blocks

    @property
    def kernel_launches(self) -> int:
        """1, or 2 with key splits (the combine kernel)."""
        return 1 + (self.splits > 1)


def _launch_plan(q: torch.Tensor, k: torch.Tensor, requested: AttentionLaunch) -> LaunchPlan:
    """Fill the 0 fields of ``requested`` from :func:`default_launch` and plan the grid (host integers only)."""
    batch, heads, seq, dim = q.shape
    kv_heads, n_keys = k.shape[1], k.shape[2]
    sm_count, shared_bytes = _device_limits(q.device)
    default = default_launch(dim, q.dtype, shared_bytes)
    launch = AttentionLaunch(
        block_m=requested.block_m or default.block_m, block_n=requested.block_n or default.block_n,
        num_warps=requested.num_warps or default.num_warps, num_stages=requested.num_stages or default.num_stages,
        key_splits=requested.key_splits or default.key_splits,
    )  # fmt: skip
    row_blocks = triton.cdiv(seq * heads // kv_heads, launch.block_m)
    splits, per_split = key_split_plan(
        row_blocks * batch * kv_heads, triton.cdiv(n_keys, launch.block_n), sm_count, launch.key_splits
    )
    return LaunchPlan(launch, row_blocks, splits, per_split)


def kernel_launches(q: torch.Tensor, k: torch.Tensor, *args, **kwargs) -> int:
    """Kernels one call of :func:`mqa_attention_rows` with these arguments launches (for launch counters)."""
    names = ("v", "may_attend", "scale", "block_m", "block_n", "num_warps", "num_stages", "key_splits")
    given = {**dict(zip(names, args, strict=False)), **kwargs}
    requested = AttentionLaunch(*(int(given.get(name, 0)) for name in names[3:]))
    return _launch_plan(q, k, requested).kernel_launches


def _check_inputs(q, k, v, may_attend) -> None:
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape:
        raise ValueError(f"mqa_attention: q [B, H, Sq, D], k/v [B, Hkv, Sk, D]; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")  # fmt: skip
    batch, heads, _, dim = q.shape
    if k.shape[0] != batch or k.shape[3] != dim or heads % k.shape[1]:
        raise ValueError(f"mqa_attention: k/v {tuple(k.shape)} do not match q {tuple(q.shape)} (H % Hkv must be 0)")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"mqa_attention: q, k, v must share one of float32/bfloat16/float16; got "
                         f"{q.dtype}, {k.dtype}, {v.dtype}")  # fmt: skip
    if may_attend is not None and (may_attend.dtype != torch.bool or may_attend.dim() != 3):
        raise ValueError(f"mqa_attention: may_attend must be a bool [B, Sq, Sk]; got {may_attend.dtype} "
                         f"{tuple(may_attend.shape)}")  # fmt: skip


@torch.library.custom_op("embodied_accel::mqa_attention", mutates_args=())
def mqa_attention_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    may_attend: torch.Tensor | None,
    scale: float,
    block_m: int = 0,
    block_n: int = 0,
    num_warps: int = 0,
    num_stages: int = 0,
    key_splits: int = 0,
) -> torch.Tensor:
    """Attention of ``q: [B, H, Sq, D]`` (any strides) over ``k, v: [B, Hkv, Sk, D]`` (any strides), ``H % Hkv
    == 0``, with an optional boolean ``may_attend`` broadcastable to ``[B, Sq, Sk]``. Returns ``[B, Sq, H, D]``
    (contiguous). Launch parameters of 0 take :func:`default_launch`'s; ``key_splits`` see :func:`key_split_plan`."""
    _check_inputs(q, k, v, may_attend)
    batch, heads, seq, dim = q.shape
    kv_heads, n_keys = k.shape[1], k.shape[2]
    group, n_rows = heads // kv_heads, seq * heads // kv_heads
    plan = _launch_plan(q, k, AttentionLaunch(block_m, block_n, num_warps, num_stages, key_splits))
    launch, splits, per_split = plan.launch, plan.splits, plan.keys_per_split
    block_d = max(16, triton.next_power_of_2(dim))

    out = torch.empty(batch, seq, heads, dim, dtype=q.dtype, device=q.device)
    has_mask = may_attend is not None
    if has_mask:
        may_attend = may_attend.expand(batch, seq, n_keys)  # a view: broadcast rows read with stride 0
        mask_strides = may_attend.stride()
    else:
        may_attend, mask_strides = q, (0, 0, 0)  # never read (HAS_MASK=False)
    if splits > 1:
        acc = torch.empty(splits, batch * kv_heads, n_rows, dim, dtype=torch.float32, device=q.device)
        row_max = torch.empty(splits, batch * kv_heads, n_rows, dtype=torch.float32, device=q.device)
        row_sum = torch.empty_like(row_max)
    else:
        acc = row_max = row_sum = out  # never written (SPLIT=False)
    _mqa_attention_kernel[(plan.row_blocks, batch * kv_heads, splits)](
        q, k, v, may_attend, out, acc, row_max, row_sum,
        *q.stride(), *k.stride(), *v.stride(), *mask_strides, out.stride(0), out.stride(1), out.stride(2),
        kv_heads, group, n_rows, n_keys, per_split, scale,
        HAS_MASK=has_mask, SPLIT=splits > 1, HEAD_DIM=dim, BLOCK_D=block_d,
        BLOCK_M=launch.block_m, BLOCK_N=launch.block_n, PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=launch.num_warps, num_stages=launch.num_stages,
    )  # fmt: skip
    if splits > 1:
        block_r = max(1, 4096 // block_d)  # 16 rows at head_dim 256
        _combine_key_splits_kernel[(triton.cdiv(n_rows, block_r), batch * kv_heads)](
            acc, row_max, row_sum, out, out.stride(0), out.stride(1), out.stride(2), kv_heads, group, n_rows, splits,
            HEAD_DIM=dim, BLOCK_D=block_d, BLOCK_R=block_r, num_warps=4,
        )  # fmt: skip
    return out


@mqa_attention_rows.register_fake
def _(q, k, v, may_attend, scale, block_m=0, block_n=0, num_warps=0, num_stages=0, key_splits=0):
    batch, heads, seq, dim = q.shape
    return q.new_empty(batch, seq, heads, dim)


_mqa_attention_rows = eager_direct(mqa_attention_rows)


def mqa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    may_attend: torch.Tensor | None,
    scale: float,
    launch: AttentionLaunch | None = None,
) -> torch.Tensor:
    """``softmax(q k^T * scale + mask) v`` as ``[B, H, Sq, D]``, a view of ``[B, Sq, H, D]`` memory.

    ``q: [B, H, Sq, D]``, ``k, v: [B, Hkv, Sk, D]`` (any strides; in the model, q is a view of ``[B, S, H, D]``
    memory and k/v are views into the static KV cache), ``may_attend``: bool ``[B, Sq, Sk]`` or ``None``.
    ``launch`` overrides :func:`default_launch`.
    """
    if launch is None:
        out = _mqa_attention_rows(q, k, v, may_attend, scale)
    else:
        out = _mqa_attention_rows(
            q, k, v, may_attend, scale, launch.block_m, launch.block_n, launch.num_warps, launch.num_stages,
            launch.key_splits,
        )  # fmt: skip
    return out.transpose(1, 2)
