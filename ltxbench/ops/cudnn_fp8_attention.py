"""FP8 attention through cuDNN's frontend (pip `nvidia-cudnn-frontend`, on torch's own cuDNN), as the torch op
`ltxbench::cudnn_fp8_attention` (opaque under torch.compile, with a fake), and its emulation in fp32 (`emulated`,
the reference provider's and the tests' oracle).

On Hopper cuDNN's FP8 attention takes one scale per tensor and writes its output in FP8 (a bf16 output is
Blackwell's). So q and k come with one descale each (their scales are set from the norm weights, the same for every
batch element), v with one descale from its amax over the whole tensor, the probabilities (unnormalized in the
kernel, exp(s - row max) <= 1) are held in e4m3 at scale 448, and the output at half of v's scale: each output row
is a convex combination of v's rows, so |O| <= amax(v) and |O · scale_o| <= 224 (headroom for the probabilities'
rounding). The op dequantizes that output to bf16.

cuDNN's graphs are built once per shape and layout (and device), kept for the process, and run on the current
stream. Inputs (B, S, H, hd) e4m3 in any layout with a unit last stride; hd a multiple of 16, at most 256. A shape
cuDNN declines (on the H200: one query or one key token) runs the emulation instead, with a warning naming it.
"""

from __future__ import annotations

import math
import threading
import warnings

import torch

E4M3_MAX = 448.0
OUTPUT_HEADROOM = 2.0  # scale_o = v's scale / 2: |O · scale_o| <= 224
_GRAPHS: dict = {}     # (device, layouts) -> (graph, its tensors, workspace, handle), or None where cuDNN declined
_CONSTANTS: dict = {}  # device -> descale_s, scale_s and room for the two amaxes
_HANDLES: dict = {}
_LOCK = threading.Lock()


def supports(head_dim: int) -> str | None:
    """Why cuDNN's FP8 attention cannot take this head dim on Hopper (None: it can)."""
    if head_dim % 16 or head_dim > 256:
        return f"head dim {head_dim}: cuDNN's FP8 attention takes multiples of 16 up to 256"
    return None


def _handle(device: torch.device):
    import cudnn

    with _LOCK:
        if device.index not in _HANDLES:
            with torch.cuda.device(device):
                _HANDLES[device.index] = cudnn.create_handle()
        return _HANDLES[device.index]


def _bhsd(t: torch.Tensor) -> tuple[list[int], list[int]]:
    """cuDNN's (B, H, S, hd) dims and element strides of a (B, S, H, hd) tensor."""
    b, s, h, d = t.shape
    sb, ss, sh, sd = t.stride()
    return [b, h, s, d], [sb, sh, ss, sd]


def build_graph(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, handle=None):
    """cuDNN's graph for these layouts: (graph, its tensors by name). Built (planned) only where a handle is given:
    the graph alone is plain Python, which the tests check on the CPU."""
    import cudnn

    e4m3, f32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
    graph = cudnn.pygraph(io_data_type=e4m3, intermediate_data_type=f32, compute_data_type=f32, handle=handle)
    tensors = {}
    for name, t in (("q", q), ("k", k), ("v", v)):
        dim, stride = _bhsd(t)
        tensors[name] = graph.tensor(name=name, dim=dim, stride=stride, data_type=e4m3)
    for name in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o"):
        tensors[name] = graph.tensor(name=name, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=f32)
    o, _stats, amax_s, amax_o = graph.sdpa_fp8(
        tensors["q"], tensors["k"], tensors["v"], *(tensors[n] for n in ("descale_q", "descale_k", "descale_v",
                                                                          "descale_s", "scale_s", "scale_o")),
        generate_stats=False, attn_scale=1.0 / math.sqrt(q.shape[-1]), name="attention")
    dim, stride = _bhsd(out)
    o.set_output(True).set_dim(dim).set_stride(stride).set_data_type(e4m3)
    for amax in (amax_s, amax_o):  # the amaxes cuDNN writes: unused, declared as its own examples do
        amax.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(f32)
    tensors.update(o=o, amax_s=amax_s, amax_o=amax_o)
    if handle is not None:
        graph.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    return graph, tensors


def _graph(q, k, v, out):
    """The kept graph for these layouts, built on first use; None where cuDNN has no engine for them."""
    import cudnn

    key = (q.device.index, *(tuple(t.shape) + t.stride() for t in (q, k, v, out)))
    with _LOCK:
        if key in _GRAPHS:
            return _GRAPHS[key]
    handle = _handle(q.device)
    try:
        graph, tensors = build_graph(q, k, v, out, handle)
    except cudnn.cudnnGraphNotSupportedError as exc:
        warnings.warn(f"cudnn_fp8_attention: cuDNN has no FP8 engine for q {tuple(q.shape)}, k {tuple(k.shape)}; "
                      f"running its fp32 emulation ({str(exc).splitlines()[0][:120]})", stacklevel=3)
        kept = None
    else:
        workspace = torch.empty(graph.get_workspace_size(), dtype=torch.uint8, device=q.device)
        kept = (graph, tensors, workspace, handle)
    with _LOCK:
        _GRAPHS[key] = kept
    return kept


def _constants(device: torch.device) -> tuple[torch.Tensor, ...]:
    """descale_s, scale_s (1, 1, 1, 1) fp32 on `device`, and room for the two amaxes: made once per device, each its
    own allocation (a pointer cuDNN reads is aligned as an allocation's start is)."""
    with _LOCK:
        if device.index not in _CONSTANTS:
            _CONSTANTS[device.index] = tuple(torch.full((1, 1, 1, 1), value, device=device)
                                             for value in (1.0 / E4M3_MAX, E4M3_MAX, 0.0, 0.0))
        return _CONSTANTS[device.index]


def _scalar(x: torch.Tensor) -> torch.Tensor:
    """A descale tensor's first value as cuDNN's (1, 1, 1, 1) fp32 operand: the first element, where an allocation
    starts (a view, no copy, for fp32 descales)."""
    return x.reshape(-1)[:1].float().reshape(1, 1, 1, 1)


@torch.library.custom_op("ltxbench::cudnn_fp8_attention", mutates_args=(), device_types="cuda")
def cudnn_fp8_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_descale: torch.Tensor,
                        k_descale: torch.Tensor, v_descale: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ / √hd) v for e4m3 (B, S, H, hd) q/k/v with one descale each (their first value): bf16 out."""
    import cudnn

    out8 = torch.empty(q.shape, dtype=torch.float8_e4m3fn, device=q.device)
    if q.numel() == 0 or k.shape[1] == 0:
        return torch.zeros(q.shape, dtype=torch.bfloat16, device=q.device)
    kept = _graph(q, k, v, out8)
    if kept is None:
        return emulated(q, k, v, q_descale, k_descale, v_descale)
    graph, tensors, workspace, handle = kept
    cudnn.set_stream(handle, torch.cuda.current_stream(q.device).cuda_stream)
    dv = _scalar(v_descale)
    scale_o = 1.0 / (dv * OUTPUT_HEADROOM)
    descale_s, scale_s, amax_s, amax_o = _constants(q.device)
    graph.execute({tensors["q"]: q, tensors["k"]: k, tensors["v"]: v, tensors["descale_q"]: _scalar(q_descale),
                   tensors["descale_k"]: _scalar(k_descale), tensors["descale_v"]: dv,
                   tensors["descale_s"]: descale_s, tensors["scale_s"]: scale_s, tensors["scale_o"]: scale_o,
                   tensors["o"]: out8, tensors["amax_s"]: amax_s, tensors["amax_o"]: amax_o}, workspace, handle=handle)
    return out8.to(torch.bfloat16) * (dv.reshape(()) * OUTPUT_HEADROOM).to(torch.bfloat16)


@cudnn_fp8_attention.register_fake
def _(q, k, v, q_descale, k_descale, v_descale):
    torch._check(q.dim() == 4 and k.dim() == 4 and v.dim() == 4, lambda: "cudnn_fp8_attention: (B, S, H, hd) each")
    return torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)


def emulated(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_descale: torch.Tensor, k_descale: torch.Tensor,
             v_descale: torch.Tensor) -> torch.Tensor:
    """What the op computes, in fp32 on any device: the scores from the dequantized q and k; as a flash kernel holds
    them, the probabilities unnormalized, exp(s - row max) in (0, 1], rounded to e4m3 at scale 448; their product
    with v's e4m3 values over the fp32 row sum; the output rounded to e4m3 at half of v's scale, then dequantized."""
    fp8 = torch.float8_e4m3fn
    qf, kf = (t.float().transpose(1, 2) * _scalar(d).reshape(()) for t, d in ((q, q_descale), (k, k_descale)))
    scores = qf @ kf.transpose(-1, -2) / math.sqrt(q.shape[-1])
    p = (scores - scores.amax(-1, keepdim=True)).exp()
    p8 = (p * E4M3_MAX).to(fp8).float()
    dv = _scalar(v_descale).reshape(())
    o = (p8 @ v.float().transpose(1, 2)) / E4M3_MAX / p.sum(-1, keepdim=True)  # O at v's scale
    out8 = (o / OUTPUT_HEADROOM).to(fp8)
    return (out8.float() * (dv * OUTPUT_HEADROOM)).transpose(1, 2).to(torch.bfloat16)
