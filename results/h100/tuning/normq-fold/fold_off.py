"""Dev A/B helper (twenty-second session): `ltxbench` with attn2's norm_q applied in a pass of its own (ops.rms_norm
of q, as before), not folded into cross_attention (weight in the keys, 1/rms(q) as q_scale), for a same-machine
comparison with the default."""
import sys

import ltxbench.inject.ltx_attention as attention
from ltxbench import ops
from ltxbench.cli import main


def unfolded(norm_q, query, key):
    return ops.rms_norm(query, norm_q.weight, attention.eps_of(norm_q)), key, None


attention._norm_q_folded = unfolded
sys.argv[0] = "ltxbench"
main()
