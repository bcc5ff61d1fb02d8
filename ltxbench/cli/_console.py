"""Rich consoles for the commands' output.

Rich renders at 80 columns whenever stdout is not a terminal (CI logs, pipes, files), which cuts the tables'
names (`base…`). There, unless COLUMNS says otherwise, the console is as wide as the widest table needs.
"""

from __future__ import annotations

import os

# Wide enough for every table the commands print (bench micro's, with all five providers, is the widest).
PIPE_WIDTH = 240


def console(stderr: bool = False):
    from rich.console import Console

    out = Console(stderr=stderr, highlight=False, soft_wrap=True)
    if not out.is_terminal and not os.environ.get("COLUMNS"):
        out.width = PIPE_WIDTH
    return out
