"""The shapes the ops are tested and benchmarked on: odd and vector-friendly test shapes, and bench shapes named after
the models that produce them, (B, S, D) (linear: (B, S, K, N)). Read through each KernelSpec (registry.py)."""

# Odd widths that defeat 16-byte vectors, tiny and wide rows, few and many rows: (B, S, D). 2400 (300 16-bit
# vectors over 160 threads) leaves some threads of a one-row-per-block row with fewer values than others.
ODD_SHAPES = ((1, 1, 7), (2, 3, 83), (3, 5, 769), (1, 2, 5125))
VECTOR_SHAPES = ((1, 1, 8), (2, 17, 64), (2, 33, 2048), (2, 3, 2400), (1, 4, 4096), (1, 2, 8200), (1, 2, 40960))
TEST_SHAPES = ODD_SHAPES + VECTOR_SHAPES
# Even widths for the pair-wise ops, covering D % 6 = 0, 2, 4 (LTX RoPE padding) and the pair path.
ROPE_TEST_SHAPES = ((1, 1, 8), (2, 3, 84), (2, 5, 86), (1, 7, 88), (3, 5, 770), (2, 33, 2048), (1, 4, 4096))
# Split RoPE (LTX-2): (B, S, D) split into inputs.split_rope_heads(D) heads. Odd token counts; head dims 128 (4096)
# and 64 (2048); an odd half (86: one head, r = 43) and a half that 16-bit vectors miss (72: r = 36) for the scalar
# path; 3 and 24 heads of 64 (16-bit rows of 16 threads; of 96, two a block); fp32 rows of two pairs a thread (8192).
SPLIT_ROPE_TEST_SHAPES = ((1, 7, 4096), (2, 83, 2048), (1, 769, 4096), (1, 5125, 2048), (2, 5, 86), (3, 3, 192),
                          (2, 3, 72), (2, 9, 1536), (1, 2, 8192))
# FP8 rows up to LTX-2's feed-forward width (16384; every one-input op keeps it in registers).
FP8_TEST_SHAPES = TEST_SHAPES + ((1, 3, 16384),)
# cross_attention: (B, S, D) queries, D split into heads of the variant's head dim (inputs_matmul.XATTN_VARIANTS).
XATTN_TEST_SHAPES = ((1, 1, 64), (2, 7, 64), (1, 83, 128), (2, 130, 256), (1, 769, 64), (3, 5, 192), (2, 300, 2048))

# decode_attention: (B, L, D) a decode step's D query values over L cached keys (DECODE_VARIANTS' head dims).
DECODE_TEST_SHAPES = ((1, 7, 512), (2, 83, 1024), (1, 769, 512), (1, 5125, 1024), (3, 1, 256), (2, 2048, 4096))
# Llama-3-8B (32 query heads over 8 key/value heads of 128) after a 512- or 2048-token prompt and 128 new tokens,
# and at 8192 cached tokens
DECODE_ATTENTION_SHAPES = {"llama3-8b-decode-kv640": (1, 640, 4096), "llama3-8b-decode-kv2176": (1, 2176, 4096),
                           "llama3-8b-decode-kv8192": (1, 8192, 4096)}
SEED_SHAPES = {"seed-1x1024x2048": (1, 1024, 2048), "seed-2x1024x2048": (2, 1024, 2048),
               "seed-4x1024x2048": (4, 1024, 2048), "seed-2x4096x3072": (2, 4096, 3072),
               "seed-4x4096x3072": (4, 4096, 3072)}
LTX_SHAPES = {"ltx2b-49f-cfg": (2, 2688, 2048), "ltx2b-161f-cfg": (2, 8064, 2048),
              "ltx13b-161f-cfg": (2, 8064, 4096)}
# One rank's self-attention under LTX-2B's cfg+ulysses split on 4 GPUs (batch 1, half the tokens).
LTX_ULYSSES_SHAPES = {"ltx2b-161f-cfg-ulysses2": (1, 4032, 2048)}
# The same under the cfg+ring split: a rank's own tokens, all heads.
LTX_RING_SHAPES = {"ltx2b-161f-cfg-ring2": (1, 4032, 2048)}
# LTX-2 19B's video self-attention, 121 frames, one of 2 ranks of a batch-1 pass (hybrid / ulysses).
LTX2_ULYSSES_SHAPES = {"ltx2-19b-121f-video-ulysses2": (1, 3072, 4096)}
LTX_FFN_SHAPES = {"ltx2b-49f-ffn": (2, 2688, 8192), "ltx2b-161f-ffn": (2, 8064, 8192)}
# LTX-2 19B with CFG: video self-attention (6144 tokens x 4096), audio self-attention (126 x 2048), and one side of
# the audio/video cross-attentions (2048 wide: the video q or k, the audio q or k).
LTX2_SELF_SHAPES = {"ltx2-video-self-2x6144x4096": (2, 6144, 4096), "ltx2-video-self-1x6144x4096": (1, 6144, 4096),
                    "ltx2-audio-self-2x126x2048": (2, 126, 2048)}
LTX2_CROSS_SHAPES = {"ltx2-av-cross-video-2x6144x2048": (2, 6144, 2048),
                     "ltx2-av-cross-audio-2x126x2048": (2, 126, 2048)}
# LTX-2 19B's residual streams with CFG (the modulated norms and gated residuals of each block)
LTX2_STREAM_SHAPES = {"ltx2-video-2x6144x4096": (2, 6144, 4096), "ltx2-audio-2x126x2048": (2, 126, 2048)}
# Wan's residual stream, 81 frames at 480 x 832 (21 x 30 x 52 tokens), one call of its guidance pair (batch 1)
WAN_SHAPES = {"wan2.1-1.3b-480p": (1, 32760, 1536), "wan2.1-14b-480p": (1, 32760, 5120)}
LLM_MLP_SHAPES = {"llama3-8b-mlp-4096tok": (1, 4096, 14336), "llama3-8b-mlp-decode": (1, 1, 14336)}
LLM_SHAPES = {"llama3-8b-decode": (1, 1, 4096), "llama3-8b-prefill": (1, 4096, 4096),
              "norm-32768x2048": (1, 32768, 2048), "norm-8192x4096": (1, 8192, 4096)}
# LTX-2 19B's video feed-forward hidden states with CFG (4 x 4096 wide)
LTX2_FFN_SHAPES = {"ltx2-video-ffn-2x6144x16384": (2, 6144, 16384)}
# linear's decode shapes (B, S, K, N): Llama-3-8B's projections for one token (our GEMV kernel takes up to 4 rows),
# the lm_head included, and rows for the GEMV path's tests (M = B·S of 1-4; N not a multiple of its 4 rows a block).
LLM_DECODE_LINEAR_SHAPES = {"llama3-8b-decode-qkv": (1, 1, 4096, 6144), "llama3-8b-decode-o": (1, 1, 4096, 4096),
                            "llama3-8b-decode-gate-up": (1, 1, 4096, 28672),
                            "llama3-8b-decode-down": (1, 1, 14336, 4096),
                            "llama3-8b-decode-lm-head": (1, 1, 4096, 128256)}
GEMV_TEST_SHAPES = ((1, 2, 4096), (3, 1, 1024), (1, 1, 14336), (2, 2, 264))
# rms_norm_qkv_rope_cache: (B, S, K) hidden states (inputs_cache.qkv_heads: heads of 128 at model widths, else 4 / 2
# of 64); odd K (the GEMV's ATen path), a few tokens, Llama-3-8B's step and a 2-sequence batch.
QKV_CACHE_TEST_SHAPES = ODD_SHAPES + ((2, 17, 64), (2, 3, 2400), (1, 1, 4096), (2, 1, 2048))
# rms_norm_linear / add_rms_norm_linear: a decode step's norm + projection (B, S, K, N), Llama-3-8B's q/k/v and gate/up.
LLM_NORM_LINEAR_SHAPES = {"llama3-8b-decode-qkv": (1, 1, 4096, 6144), "llama3-8b-decode-gate-up": (1, 1, 4096, 28672)}
# linear's bench shapes: (B, S, K, N), LTX-2B's projections.
LTX_LINEAR_SHAPES = {"ltx2b-49f-attn-out": (2, 2688, 2048, 2048), "ltx2b-49f-qkv": (2, 2688, 2048, 6144),
                     "ltx2b-49f-ff-up": (2, 2688, 2048, 8192), "ltx2b-49f-ff-down": (2, 2688, 8192, 2048),
                     "ltx2b-161f-ff-up": (2, 8064, 2048, 8192)}
