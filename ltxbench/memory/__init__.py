"""Running a model in less GPU memory than its weights take (`--memory-budget`): the planner (plan.py: what stays on
the GPU, what streams from pinned host memory) and the block streamer (stream.py). Only the standard library here:
the CLI imports the planner before torch loads.
"""

from __future__ import annotations
