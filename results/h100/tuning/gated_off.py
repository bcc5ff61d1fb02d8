"""Dev A/B helper (twenty-first session): `ltxbench` with gate_msa NOT folded into attn1's out-projection (the block
runs the gated_residual pass, as before), for a same-machine comparison with the default."""
import sys

import ltxbench.inject.ltx_step as ltx_step
from ltxbench.cli import main

ltx_step.one_timestep = lambda timestep: False
sys.argv[0] = "ltxbench"
main()
