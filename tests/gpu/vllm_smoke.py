"""``pack_vllm.py --smoke`` (tests/gpu/README.md, Part B-lite): after the pack's install, with
its folder on PYTHONPATH, vLLM imports from the pack, and where a GPU is, one kernel of each cut
library runs against torch, the first sign that the CUDA code cut to compute capability 9.0
loads: rms_norm (``vllm._C_stable_libtorch``) and FlashAttention 3's varlen forward against
``scaled_dot_product_attention`` at each of :data:`ATTENTION` (a bf16 engine on Hopper takes FA3
for both). Exit 0 if all pass."""

from __future__ import annotations

from pathlib import Path

ATTENTION = ((14, 64), (8, 32))
"""(heads, head size) of the FA3 runs: Part A's geometry (Qwen2.5-0.5B: 14 heads of 64) and the
shipped tiny model's that Part B runs on (8 heads of 32: launch/assets/tiny-default; FA3 has no
kernel of its own for 32 and runs it through its 64 one)."""


def attention_error(heads: int, head_size: int) -> float:
    """Max |FA3 varlen - sdpa| over two causal sequences of 128 tokens (bf16)."""
    import torch
    from vllm.vllm_flash_attn import flash_attn_varlen_func

    shape = (2 * 128, heads, head_size)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in "qkv")
    cu = torch.tensor([0, 128, 256], device="cuda", dtype=torch.int32)
    got = flash_attn_varlen_func(q, k, v, 128, cu, 128, cu, causal=True, fa_version=3)
    want = torch.cat([torch.nn.functional.scaled_dot_product_attention(
        *(t[a:b].transpose(0, 1) for t in (q, k, v)), is_causal=True).transpose(0, 1)
        for a, b in ((0, 128), (128, 256))])  # fmt: skip
    return (got.float() - want.float()).abs().max().item()


def smoke() -> int:
    import torch
    import vllm

    print(f"vllm {vllm.__version__} from {Path(vllm.__file__).parent}; torch {torch.__version__}")
    if not torch.cuda.is_available():
        print("no CUDA: kernels not run")
        return 0
    from vllm import _custom_ops as ops

    torch.manual_seed(0)
    x = torch.randn(64, 896, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(896, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(x)
    ops.rms_norm(out, x, w, 1e-6)
    ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)) * w.float()
    norm_err = (out.float() - ref).abs().max().item()
    attn_err = {f"{h}x{d}": attention_error(h, d) for h, d in ATTENTION}
    ok = norm_err < 0.1 and all(e < 0.05 for e in attn_err.values())
    shown = ", ".join(f"{size} {e:.3g}" for size, e in attn_err.items())
    gpu = torch.cuda.get_device_name(0)
    print(f"{'PASS' if ok else 'FAIL'} kernels on {gpu}: rms_norm max |err| {norm_err:.3g}, "
          f"FA3 varlen vs sdpa max |err| (heads x head size) {shown}")  # fmt: skip
    return 0 if ok else 1
