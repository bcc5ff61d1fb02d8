"""The patched forwards of LTX-Video's transformer block and model (applied by ltx.apply_kernels; the block math is
in docs/models.md and ltx/__init__.py's docstring). The model forward chains the blocks: block i's
`h + ff * gate_mlp` and block i+1's modulated norm1 are one add_rms_norm_modulate, and what precedes the block loop
arrives as step.StepInputs.
"""

from __future__ import annotations

import torch

from ltxbench.inject import observed, original_class, streamer_of
from ltxbench.inject.ltx.attention import takes_residual
from ltxbench.inject.ltx.cfg import first_half
from ltxbench.inject.ltx.step import block_modulation, modulation_of, step_inputs


def _self_attention(ops, block, hidden_states, norm, gate_msa, image_rotary_emb):
    """attn1 on the modulated norm1 and its gated residual: h + attn1(norm) * gate_msa."""
    attn = block.attn1(hidden_states=norm, encoder_hidden_states=None, image_rotary_emb=image_rotary_emb)
    return ops.gated_residual(hidden_states, attn, gate_msa)


def _paired_self_attention(ops, block, hidden_states, ada, image_rotary_emb):
    """norm1 + modulation, attn1 and its gated residual on the first half of a batch whose halves are identical
    (classifier-free guidance, cfg.py), repeated for the second."""
    batch = hidden_states.size(0)
    half, ada = hidden_states[: batch // 2], first_half(ada, batch)
    norm = ops.rms_norm_modulate(half, None, ada[1], ada[0], block.norm1.eps)
    return _self_attention(ops, block, half, norm, ada[2], first_half(image_rotary_emb, batch)).repeat(2, 1, 1)


def _cross_attention_and_ff(ops, block, hidden_states, ada, encoder_hidden_states, encoder_attention_mask,
                            cross_kv=None):
    """attn2 + residual + modulated norm2, then ff. Returns (hidden_states, ff output); the caller adds
    `ff * gate_mlp` (alone or fused with the next norm1). cross_kv: attn2's (key, value) from the cache
    (cross_kv.py), or None."""
    _, _, _, shift_mlp, scale_mlp, _ = ada
    kv = {} if cross_kv is None else {"cross_kv": cross_kv}
    in_gemm = takes_residual(block.attn2)  # h + attn2(h) from the out-projection's GEMM (beta = 1): no add pass
    if in_gemm:
        kv["residual"] = hidden_states
    attn = block.attn2(hidden_states, encoder_hidden_states=encoder_hidden_states, image_rotary_emb=None,
                       attention_mask=encoder_attention_mask, **kv)
    if in_gemm:
        hidden_states = attn
        norm = ops.rms_norm_modulate(hidden_states, None, scale_mlp, shift_mlp, block.norm2.eps)
    else:
        norm, hidden_states = ops.add_rms_norm_modulate(hidden_states, attn, None, scale_mlp, shift_mlp,
                                                        block.norm2.eps)
    return hidden_states, block.ff(norm)


def _norms_hooked(block) -> bool:
    """A hook on norm1 or norm2 of `block`, which the fused code folds into its kernels instead of calling."""
    return observed(block.norm1) or observed(block.norm2)


def fused_block_forward(ops):
    """LTXVideoTransformerBlock.forward with the norms, modulations and residuals fused through `ops`."""

    def forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None, encoder_attention_mask=None):
        ada = block_modulation(self, temb, hidden_states.size(0))
        # mixed precision (the kernels take one dtype), or a hook on norm1/norm2 since the injection (they must run
        # themselves): the original
        if ada[0].dtype != hidden_states.dtype or _norms_hooked(self):  # the block itself is called: its hooks run
            return original_class(self).forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb,
                                                encoder_attention_mask)
        norm = ops.rms_norm_modulate(hidden_states, None, ada[1], ada[0], self.norm1.eps)
        hidden_states = _self_attention(ops, self, hidden_states, norm, ada[2], image_rotary_emb)
        hidden_states, ff = _cross_attention_and_ff(ops, self, hidden_states, ada, encoder_hidden_states,
                                                    encoder_attention_mask)
        return ops.gated_residual(hidden_states, ff, ada[5])

    return forward


def fused_model_forward(ops):
    """LTXVideoTransformer3DModel.forward with the block loop chained: block i's `h + ff * gate_mlp` and block
    i+1's `norm1(h) * (1 + scale_msa) + shift_msa` become one add_rms_norm_modulate, and the final
    norm_out + modulation one layer_norm_modulate. rope, proj_in and proj_out are still called as modules (hooks).
    step: what comes before the block loop (step.StepInputs), built by the model's __call__; else built here."""

    def forward(self, hidden_states, encoder_hidden_states, timestep, encoder_attention_mask, num_frames=None,
                height=None, width=None, rope_interpolation_scale=None, video_coords=None, attention_kwargs=None,
                return_dict=True, step=None):
        # checkpointing with gradients, blocks offloaded after the injection (their weights reach the device only
        # inside each block's own forward, which the chain does not call), or a hook put since on a block or a norm the
        # chain folds (a probe, First Block Cache: it must see them run; attn1, attn2 and ff are called): the original
        blocks = self.transformer_blocks
        if (torch.is_grad_enabled() and self.gradient_checkpointing) or (
                blocks and blocks[0].scale_shift_table.is_meta) or any(
                    observed(b) or _norms_hooked(b) for b in blocks):
            return original_class(self).forward(self, hidden_states, encoder_hidden_states, timestep,
                                                encoder_attention_mask, num_frames, height, width,
                                                rope_interpolation_scale, video_coords, attention_kwargs, return_dict)
        if step is None:
            step = step_inputs(self, hidden_states, encoder_hidden_states, timestep, encoder_attention_mask,
                               num_frames, height, width, rope_interpolation_scale, video_coords)
        streamer = streamer_of(blocks)  # --memory-budget: the chain uses a block's layers without calling it
        hidden_states = step.hidden_states
        ada = modulation_of(step, blocks, 0)
        norm = None if step.paired else ops.rms_norm_modulate(hidden_states, None, ada[1], ada[0],
                                                              blocks[0].norm1.eps)
        for index, block in enumerate(blocks):
            if streamer is not None:
                streamer.enter(index)
            gate_mlp = ada[5]
            if index == 0 and step.paired:  # classifier-free guidance's identical halves: attn1 on one (cfg.py)
                hidden_states = _paired_self_attention(ops, block, hidden_states, ada, step.rope)
            else:
                hidden_states = _self_attention(ops, block, hidden_states, norm, ada[2], step.rope)
            hidden_states, ff = _cross_attention_and_ff(ops, block, hidden_states, ada, step.prompt, step.mask,
                                                        step.block_kv[index])
            if streamer is not None:  # the block's weights are read by now (its modulation tables stay resident)
                streamer.leave(index)
            if index + 1 < len(blocks):
                ada = modulation_of(step, blocks, index + 1)
                norm, hidden_states = ops.add_rms_norm_modulate(hidden_states, ff, gate_mlp, ada[1], ada[0],
                                                                blocks[index + 1].norm1.eps)
            else:
                hidden_states = ops.gated_residual(hidden_states, ff, gate_mlp)

        hidden_states = ops.layer_norm_modulate(hidden_states, step.final[:, :, 1], step.final[:, :, 0],
                                                self.norm_out.eps)
        output = self.proj_out(hidden_states)
        return (output,) if not return_dict else Transformer2DModelOutput(sample=output)

    from diffusers.models.modeling_outputs import Transformer2DModelOutput

    try:  # keep LoRA scaling through attention_kwargs, as the original forward is decorated
        from diffusers.utils import apply_lora_scale
    except ImportError:  # diffusers releases before the decorator scale LoRA elsewhere
        return forward
    return apply_lora_scale("attention_kwargs")(forward)
