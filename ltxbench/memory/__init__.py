"""Running a model in less GPU memory than its weights take (`--memory-budget`): the planner (plan.py: what stays on
the GPU, what streams from pinned host memory) and the block streamer (stream.py). Only the standard library here:
the CLI imports the planner before torch loads.
"""

from __future__ import annotations

STREAMER_ATTR = "_ltxbench_block_streamer"  # in a streamed ModuleList's __dict__: its stream.BlockStreamer


def streamer_of(blocks):
    """The BlockStreamer serving `blocks` (a ModuleList), or None. Code that reads a block's weights other than
    through the block's own call (LTX-Video's chained model forward) asks it to load the block first."""
    return vars(blocks).get(STREAMER_ATTR)
