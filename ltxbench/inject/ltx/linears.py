"""The LTX-Video block's GEMMs under injection: its nn.Linear layers through ops.linear (cuBLASLt, the algorithm
chosen by timing) and the feed-forward's GELU-tanh as the up-projection's epilogue. Without the epilogue torch's own
GELU stays (GELU_MEASURED says why)."""

from __future__ import annotations

from ltxbench.inject import original_class
from ltxbench.inject.layers import gemm_can_stand_for
from ltxbench.inject.ltx.attention import tuned_linear

GELU_MEASURED = "torch's F.gelu measured faster than ltxbench.gelu_tanh (H100, 2x8064x8192: 179.7 vs 203.8 us)"


def ff_gelu_forward(ops, epilogue: bool, tuned_gemm: bool):
    """diffusers GELU(approximate="tanh").forward as ONE GEMM with a GELU epilogue (`ops.linear` when tuned_gemm,
    else torch's cuBLASLt binding `ops.linear_gelu_tanh`), diffusers' own forward where the projection must run
    itself (gemm_can_stand_for); without the epilogue, proj + `ops.gelu_tanh`."""

    def forward(self, hidden_states):
        if not epilogue:
            return ops.gelu_tanh(self.proj(hidden_states))
        if not gemm_can_stand_for(self.proj, hidden_states):
            return original_class(self).forward(self, hidden_states)
        if tuned_gemm:
            return ops.linear(hidden_states, self.proj.weight, self.proj.bias, "gelu_tanh")
        return ops.linear_gelu_tanh(hidden_states, self.proj.weight, self.proj.bias)

    return forward


def tuned_linear_forward(ops):
    """nn.Linear.forward through ops.linear (cuBLASLt with a measured algorithm choice)."""
    linear = tuned_linear(ops)

    def forward(self, input):
        return linear(input, self.weight, self.bias)

    return forward


TUNED_GEMM_RULE = "linear: cuBLASLt GEMM, algorithm chosen by timing (ops.linear)"


def tuned_linears(block, fused: bool, epilogue: bool) -> list:
    """The block's nn.Linear layers that run as themselves (not through a fused weight or the GELU epilogue)."""
    layers = [block.attn1.to_out[0], block.attn2.to_q, block.attn2.to_out[0], block.ff.net[2]]
    if not fused:
        layers += [block.attn1.to_q, block.attn1.to_k, block.attn1.to_v]
    if not epilogue and hasattr(block.ff.net[0], "proj"):
        layers.append(block.ff.net[0].proj)
    return layers
