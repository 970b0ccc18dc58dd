"""Signature-faithful fakes of the GPU attention kernels, for CPU tests of the adapters.

Each fake has the parameter names, order, kinds and defaults of the function it stands for
(transcribed from the source the adapter cites), checks what the real one checks about dtypes,
shapes and layouts (and raises where the real one would), and computes what the documented
semantics say, in float64, from scratch: varlen sequences, bottom-right causal, GQA, and LSE in the
documented layout. torch's ops are checked by binding the call to the real op schema of the CPU
build (``torch.ops.aten.<op>.default._schema``). Nothing here accepts a call the real kernel rejects
on these points, so an adapter bug in argument construction fails a test.
"""

from __future__ import annotations

import enum
import math
from typing import List, Optional, Tuple

import torch

HALF = (torch.float16, torch.bfloat16)


class FakeKernelError(RuntimeError):
    pass


def need(cond, msg):
    if not cond:
        raise FakeKernelError(msg)


# --- the semantics, from the documents (FlashAttention-2 varlen, bottom-right causal) ------------

def _visible(sq, sk, causal):
    j = torch.arange(sq)[:, None]
    m = torch.arange(sk)[None, :]
    return (m <= j + (sk - sq)) if causal else torch.ones(sq, sk, dtype=torch.bool)


def semantics_forward(q, k, v, cu_q, cu_k, scale, causal):
    """out [tq, h, d] float64, lse [tq, h] float64."""
    h, g = q.shape[1], q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.zeros(q.shape[:2], dtype=torch.float64)
    for i in range(len(cu_q) - 1):
        a, b, c, d = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        qi = q[a:b].double()
        ki, vi = (x[c:d].double().repeat_interleave(g, 1) for x in (k, v))
        s = torch.einsum("qhd,khd->hqk", qi, ki) * scale
        s = s.masked_fill(~_visible(b - a, d - c, causal), -math.inf)
        l = torch.logsumexp(s, -1)
        out[a:b] = torch.einsum("hqk,khd->qhd", torch.exp(s - l[..., None]), vi)
        lse[a:b] = l.T
    return out, lse


def semantics_backward(dout, q, k, v, out, lse, cu_q, cu_k, scale, causal):
    """FlashAttention's backward with the given out and lse: P = exp(S - lse)."""
    g = q.shape[1] // k.shape[1]
    dq = torch.zeros(q.shape, dtype=torch.float64)
    dk = torch.zeros(k.shape, dtype=torch.float64)
    dv = torch.zeros(v.shape, dtype=torch.float64)
    for i in range(len(cu_q) - 1):
        a, b, c, d = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        qi, do, oi = q[a:b].double(), dout[a:b].double(), out[a:b].double()
        ki, vi = (x[c:d].double().repeat_interleave(g, 1) for x in (k, v))
        s = torch.einsum("qhd,khd->hqk", qi, ki) * scale
        s = s.masked_fill(~_visible(b - a, d - c, causal), -math.inf)
        p = torch.exp(s - lse[a:b].double().T[..., None])
        dvi = torch.einsum("hqk,qhd->khd", p, do)
        ds = p * (torch.einsum("qhd,khd->hqk", do, vi) - (do * oi).sum(-1).T[..., None]) * scale
        dq[a:b] = torch.einsum("hqk,khd->qhd", ds, ki)
        dki = torch.einsum("hqk,qhd->khd", ds, qi)
        dk[c:d] = dki.reshape(d - c, k.shape[1], g, -1).sum(2)
        dv[c:d] = dvi.reshape(d - c, k.shape[1], g, -1).sum(2)
    return dq, dk, dv


def _check_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal):
    need(q.dim() == 3 and k.dim() == 3 and v.dim() == 3, "varlen q/k/v must be 3-D [total, heads, d]")
    need(q.dtype in HALF and k.dtype == q.dtype and v.dtype == q.dtype, f"fp16/bf16 only, got {q.dtype}")
    need(q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1, "last dim must be contiguous")
    need(q.shape[1] % k.shape[1] == 0 and k.shape == v.shape, "kv heads must divide q heads")
    need(q.shape[2] == k.shape[2] and q.shape[2] <= 256, "head dim")
    for cu, t, mx in ((cu_q, q.shape[0], max_q), (cu_k, k.shape[0], max_k)):
        need(isinstance(cu, torch.Tensor) and cu.dtype == torch.int32 and cu.dim() == 1, "cu_seqlens int32 1-D")
        need(cu.is_contiguous() and cu.device == q.device, "cu_seqlens contiguous on q's device")
        need(int(cu[0]) == 0 and int(cu[-1]) == t, f"cu_seqlens must run 0..{t}, got {cu.tolist()}")
        need(isinstance(mx, int) and not isinstance(mx, bool) and mx >= int((cu[1:] - cu[:-1]).max()),
             "max_seqlen must be an int >= the longest sequence")
    need(cu_q.numel() == cu_k.numel(), "as many key sequences as query sequences")


# --- torch: bind to the real schema -------------------------------------------------------------

def _conforms(value, typ: str) -> bool:
    if typ.startswith("Optional[") and typ.endswith("]"):  # str() of an optional schema type
        typ = typ[len("Optional["):-1] + "?"
    if typ.endswith("?"):
        return value is None or _conforms(value, typ[:-1])
    if typ == "Tensor":
        return isinstance(value, torch.Tensor)
    if typ in ("SymInt", "int"):
        return isinstance(value, int) and not isinstance(value, bool)
    if typ == "float":
        return isinstance(value, (float, int)) and not isinstance(value, bool)
    if typ == "bool":
        return isinstance(value, bool)
    raise FakeKernelError(f"no rule for schema type {typ}")


def bind_schema(schema, args, kwargs) -> dict:
    """Bind a call to a torch op schema as the dispatcher would; raise on any mismatch."""
    pos = [a for a in schema.arguments if not a.kwarg_only]
    need(len(args) <= len(pos), f"{schema.name}: {len(args)} positional arguments, schema takes {len(pos)}")
    bound = {}
    for a, val in zip(pos, args):
        bound[a.name] = val
    names = {a.name: a for a in schema.arguments}
    for n, val in kwargs.items():
        need(n in names and n not in bound, f"{schema.name}: unexpected or repeated argument {n!r}")
        bound[n] = val
    for a in schema.arguments:
        if a.name not in bound:
            need(a.has_default_value(), f"{schema.name}: missing argument {a.name!r}")
            continue
        need(_conforms(bound[a.name], str(a.type)), f"{schema.name}: {a.name}={type(bound[a.name]).__name__} "
                                                    f"does not conform to {a.type}")
    return bound


class FakeAten:
    """torch.ops.aten's two varlen flash ops, CUDA semantics (FlashAttention-2 varlen branch)."""

    def __init__(self):
        self.calls: List[str] = []

    def _flash_attention_forward(self, *args, **kwargs):
        b = bind_schema(torch.ops.aten._flash_attention_forward.default._schema, args, kwargs)
        self.calls.append("forward")
        q, k, v, cu_q, cu_k = (b[n] for n in ("query", "key", "value", "cum_seq_q", "cum_seq_k"))
        need(cu_q is not None and cu_k is not None, "this fake covers the varlen branch only")
        _check_varlen(q, k, v, cu_q, cu_k, b["max_q"], b["max_k"], b["is_causal"])
        need(b["dropout_p"] == 0.0 and b["return_debug_mask"] is False, "dropout/debug mask not expected")
        scale = b.get("scale") or q.shape[-1] ** -0.5
        out, lse = semantics_forward(q, k, v, cu_q, cu_k, scale, b["is_causal"])
        rng = torch.zeros(2, dtype=torch.int64)
        return out.to(q.dtype), lse.T.float().contiguous(), rng, torch.zeros((), dtype=torch.int64), torch.empty(0)

    def _flash_attention_backward(self, *args, **kwargs):
        b = bind_schema(torch.ops.aten._flash_attention_backward.default._schema, args, kwargs)
        self.calls.append("backward")
        q, k, v = b["query"], b["key"], b["value"]
        cu_q, cu_k = b["cum_seq_q"], b["cum_seq_k"]
        _check_varlen(q, k, v, cu_q, cu_k, b["max_q"], b["max_k"], b["is_causal"])
        lse, dout, out = b["logsumexp"], b["grad_out"], b["out"]
        need(lse.dtype == torch.float32 and tuple(lse.shape) == (q.shape[1], q.shape[0]),
             f"varlen logsumexp must be [heads, total_q] float32, got {tuple(lse.shape)} {lse.dtype}")
        need(dout.dtype == q.dtype and out.dtype == q.dtype and dout.shape == q.shape and out.shape == q.shape,
             "grad_out/out must match q")
        scale = b.get("scale") or q.shape[-1] ** -0.5
        g = semantics_backward(dout, q, k, v, out, lse.T, cu_q, cu_k, scale, b["is_causal"])
        return tuple(x.to(q.dtype) for x in g)


# --- flash-attn 2.8.4, flash_attn/flash_attn_interface.py (commit 0251105a) ------------------------

class FakeFlashAttn:
    __version__ = "2.8.4"

    def _flash_attn_varlen_forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_k: torch.Tensor,
        max_seqlen_q: int,
        max_seqlen_k: int,
        dropout_p: float,
        softmax_scale: float,
        causal: bool,
        window_size_left: int = -1,
        window_size_right: int = -1,
        softcap: float = 0.0,
        alibi_slopes: Optional[torch.Tensor] = None,
        return_softmax: bool = False,
        block_table: Optional[torch.Tensor] = None,
        leftpad_k: Optional[torch.Tensor] = None,
        seqused_k: Optional[torch.Tensor] = None,
        zero_tensors: bool = False,
        num_splits: int = 0,
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal)
        need(isinstance(softmax_scale, float) and isinstance(causal, bool), "softmax_scale float, causal bool")
        need((window_size_left, window_size_right) == (-1, -1) and softcap == 0.0 and dropout_p == 0.0,
             "no window, softcap or dropout expected")
        out, lse = semantics_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal)
        return (out.to(q.dtype), lse.T.float().contiguous(), torch.empty(0, dtype=q.dtype),
                torch.zeros(2, dtype=torch.int64))

    def _flash_attn_varlen_backward(
        self,
        dout: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        softmax_lse: torch.Tensor,
        dq: Optional[torch.Tensor],
        dk: Optional[torch.Tensor],
        dv: Optional[torch.Tensor],
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_k: torch.Tensor,
        max_seqlen_q: int,
        max_seqlen_k: int,
        dropout_p: float,
        softmax_scale: float,
        causal: bool,
        window_size_left: int,
        window_size_right: int,
        softcap: float,
        alibi_slopes: Optional[torch.Tensor],
        deterministic: bool,
        rng_state: Optional[torch.Tensor] = None,
        zero_tensors: bool = False,
    ) -> torch.Tensor:
        _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal)
        need(softmax_lse.dtype == torch.float32 and tuple(softmax_lse.shape) == (q.shape[1], q.shape[0]),
             "softmax_lse must be [heads, total_q] float32")
        need(dout.is_contiguous() and out.is_contiguous() and dout.dtype == q.dtype and out.dtype == q.dtype,
             "dout/out contiguous in q's dtype")
        for buf, ref in ((dq, q), (dk, k), (dv, v)):
            need(buf is not None and buf.shape == ref.shape and buf.dtype == ref.dtype, "dq/dk/dv buffers like q/k/v")
        g = semantics_backward(dout, q, k, v, out, softmax_lse.T, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal)
        for buf, x in zip((dq, dk, dv), g):
            buf.copy_(x)
        return torch.zeros(q.shape[1], q.shape[0], dtype=torch.float32)


# --- Transformer Engine 2.20.0.dev0, pytorch/cpp_extensions/fused_attn.py (commit d0067d0d) -------

class FusedAttnBackend(enum.IntEnum):
    No_Backend = -1
    F16_arbitrary_seqlen = 1
    FP8 = 2


_LAYOUTS = {"sb3hd", "sbh3d", "sbhd_sb2hd", "sbhd_sbh2d", "sbhd_sbhd_sbhd", "bs3hd", "bsh3d", "bshd_bs2hd",
            "bshd_bsh2d", "bshd_bshd_bshd", "t3hd", "th3d", "thd_t2hd", "thd_th2d", "thd_thd_thd"}
_MASKS = {"no_mask", "padding", "causal", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right"}


def _te_checks(q, k, v, cu_q, cu_kv, max_q, max_kv, fake_dtype, backend, cu_q_pad, cu_kv_pad, attn_scale,
               dropout, qkv_layout, attn_mask_type, window_size, attn_bias_type):
    need(qkv_layout in _LAYOUTS, f"qkv_layout {qkv_layout!r}")
    need(attn_mask_type in _MASKS and attn_bias_type == "no_bias", f"mask {attn_mask_type!r}")
    need(qkv_layout == "thd_thd_thd" and "padding" in attn_mask_type, "THD needs a padding mask type")
    if "causal" in attn_mask_type:  # TE's check_set_window_size
        need(window_size == (-1, 0), f"window_size {window_size} for {attn_mask_type}")
    else:
        need(window_size == (-1, -1), f"window_size {window_size} for {attn_mask_type}")
    need(isinstance(backend, FusedAttnBackend) and backend == FusedAttnBackend.F16_arbitrary_seqlen, "backend")
    need(fake_dtype == q.dtype, "fake_dtype is q's dtype")
    need(isinstance(attn_scale, float) and dropout == 0.0, "attn_scale float, no dropout")
    _check_varlen(q, k, v, cu_q, cu_kv, max_q, max_kv, "causal" in attn_mask_type)
    for pad, cu in ((cu_q_pad, cu_q), (cu_kv_pad, cu_kv)):
        need(pad is None or (pad.dtype == torch.int32 and pad.shape == cu.shape), "padded cu_seqlens like cu_seqlens")


class FakeTE:
    """fused_attn_fwd/bwd plus the two facts that fix the stats layout (cuDNN version, SM)."""

    FusedAttnBackend = FusedAttnBackend

    def __init__(self, packed: bool):
        self.packed = packed

    def get_cudnn_version(self):
        return (9, 10, 0) if self.packed else (9, 5, 1)

    def get_device_compute_capability(self):
        return (9, 0)

    def fused_attn_fwd(
        self,
        is_training: bool,
        max_seqlen_q: int,
        max_seqlen_kv: int,
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_kv: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        fake_dtype: torch.dtype,
        fused_attention_backend: FusedAttnBackend,
        attn_bias: torch.Tensor = None,
        cu_seqlens_q_padded: torch.Tensor = None,
        cu_seqlens_kv_padded: torch.Tensor = None,
        page_table_k: torch.Tensor = None,
        page_table_v: torch.Tensor = None,
        s_quantizer=None,
        o_quantizer=None,
        attn_scale: float = None,
        dropout: float = 0.0,
        fast_zero_fill: bool = True,
        qkv_layout: str = "sbh3d",
        o_format: str = "sbhd",
        qkv_scale_inv_format: str = None,
        attn_bias_type: str = "no_bias",
        attn_mask_type: str = "padding",
        softmax_type: str = "vanilla",
        window_size: Tuple[int, int] = (-1, -1),
        bottom_right_diagonal: bool = None,
        rng_gen: torch.Generator = None,
        softmax_offset: torch.Tensor = None,
        return_max_logit: bool = False,
        cuda_graph: bool = False,
    ):
        need(is_training is True, "training call")
        need(o_format == "thd", f"o_format {o_format!r} for a THD call")
        _te_checks(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, fake_dtype,
                   fused_attention_backend, cu_seqlens_q_padded, cu_seqlens_kv_padded, attn_scale, dropout,
                   qkv_layout, attn_mask_type, window_size, attn_bias_type)
        causal = "causal" in attn_mask_type
        need(not causal or "bottom_right" in attn_mask_type, "Zeppelin's causal pieces are bottom-right")
        out, lse = semantics_forward(q, k, v, cu_seqlens_q, cu_seqlens_kv, attn_scale, causal)
        return out.to(q.dtype), [self._stats(lse, cu_seqlens_q, max_seqlen_q), torch.zeros(2, dtype=torch.int64)]

    def _stats(self, lse, cu, max_q):
        if self.packed:
            return lse.float().unsqueeze(-1)  # [t, h, 1]
        st = torch.full((cu.numel() - 1, lse.shape[1], max_q, 1), 7.0)  # padded rows hold junk
        for i in range(cu.numel() - 1):
            a, b = int(cu[i]), int(cu[i + 1])
            st[i, :, :b - a, 0] = lse[a:b].T.float()
        return st

    def _lse(self, stats, cu, max_q, h):
        if self.packed:
            need(tuple(stats.shape) == (int(cu[-1]), h, 1) and stats.dtype == torch.float32, "stats [t, h, 1] fp32")
            return stats[..., 0]
        need(tuple(stats.shape) == (cu.numel() - 1, h, max_q, 1) and stats.dtype == torch.float32,
             "stats [b, h, max_q, 1] fp32")
        return torch.cat([stats[i, :, :int(cu[i + 1] - cu[i]), 0].T for i in range(cu.numel() - 1)])

    def fused_attn_bwd(
        self,
        max_seqlen_q: int,
        max_seqlen_kv: int,
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_kv: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        o: torch.Tensor,
        d_o: torch.Tensor,
        fake_dtype: torch.dtype,
        aux_ctx_tensors: List[torch.Tensor],
        fused_attention_backend: FusedAttnBackend,
        cu_seqlens_q_padded: torch.Tensor = None,
        cu_seqlens_kv_padded: torch.Tensor = None,
        s_quantizer=None,
        dp_quantizer=None,
        dqkv_quantizer=None,
        attn_scale: Optional[float] = None,
        dropout: float = 0.0,
        fast_zero_fill: bool = True,
        qkv_layout: str = "sbh3d",
        o_format: str = "sbhd",
        do_format: str = "sbhd",
        dqkv_layout: str = "sbh3d",
        qkv_scale_inv_format: str = None,
        do_scale_inv_format: str = None,
        attn_bias_type: str = "no_bias",
        attn_mask_type: str = "padding",
        softmax_type: str = "vanilla",
        window_size: Tuple[int, int] = (-1, -1),
        bottom_right_diagonal: bool = None,
        deterministic: bool = False,
        cuda_graph: bool = False,
    ):
        need((o_format, do_format, dqkv_layout) == ("thd", "thd", "thd_thd_thd"), "THD formats")
        _te_checks(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, fake_dtype,
                   fused_attention_backend, cu_seqlens_q_padded, cu_seqlens_kv_padded, attn_scale, dropout,
                   qkv_layout, attn_mask_type, window_size, attn_bias_type)
        need(isinstance(aux_ctx_tensors, list) and len(aux_ctx_tensors) == 2, "aux_ctx_tensors = [stats, rng_state]")
        need(o.dtype == q.dtype and d_o.dtype == q.dtype and o.shape == q.shape and d_o.shape == q.shape, "o, d_o")
        lse = self._lse(aux_ctx_tensors[0], cu_seqlens_q, max_seqlen_q, q.shape[1])
        g = semantics_backward(d_o, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_kv, attn_scale,
                               "causal" in attn_mask_type)
        return tuple(x.to(q.dtype) for x in g) + (None, None)
