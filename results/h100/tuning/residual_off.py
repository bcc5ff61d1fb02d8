"""Dev A/B helper (twenty-first session): `ltxbench` with attn2's residual kept out of its out-projection GEMM (the
block adds it with add_rms_norm_modulate, as before), for a same-machine comparison with the default."""
import sys

import ltxbench.inject.ltx_forward as ltx  # the block forward moved out of inject/ltx.py in the 23rd session
from ltxbench.cli import main

ltx.takes_residual = lambda attn: False
sys.argv[0] = "ltxbench"
main()
