"""`ltxbench report`: README.md tables and PNG plots generated from the result documents of a folder.

Only typer and the standard library at top level; pandas, matplotlib and the result modules load inside the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

EXAMPLES = (
    "Examples:\n\n"
    "  ltxbench report results/h100\n\n"
    "  ltxbench report results/h100 results/h200 --headline docs/headline.png\n\n"
    "Exit codes: 0 written, 2 bad arguments (no such folder, no result in it, a README.md it did not write), "
    "3 a result file it cannot read, 4 matplotlib missing. Nothing is written unless everything could be."
)


def report_command(
    results_dirs: Annotated[list[str], typer.Argument(
        metavar="RESULTS_DIR", help="Folders of result documents (*.json), e.g. results/h100.")],
    headline: str = typer.Option(
        None, "--headline", help="Also draw one PNG here: the step time of each folder's --headline-result, "
        "the folders' GPUs side by side."),
    headline_result: str = typer.Option(
        "e2e-ltx-2b-49f.json", "--headline-result", help="The result file (by name) the headline compares."),
    force: bool = typer.Option(False, "--force", help="Replace a README.md that `ltxbench report` did not write."),
) -> None:
    """Write RESULTS_DIR/README.md (a table per result document) and a PNG per document beside it.

    Every table and figure names its result file, the GPU, and the git commit recorded in the file. Run it
    again after adding, renaming or removing a result: the README is regenerated whole.
    """
    from ltxbench.errors import UsageError
    from ltxbench.results.report import write_reports

    folders = [Path(d) for d in results_dirs]
    if headline is not None and Path(headline).suffix.lower() != ".png":
        raise UsageError(f"--headline {headline} must name a .png file")
    if headline is not None and Path(headline).is_dir():  # found before anything is rendered, not at publishing
        raise UsageError(f"--headline {headline} is a folder; name the .png file to write")
    if len({f.resolve() for f in folders}) != len(folders):
        raise UsageError("RESULTS_DIR: a folder is named twice")
    written = write_reports(folders, force=force, headline=None if headline is None else Path(headline),
                            headline_result=headline_result)
    for path in written:
        typer.echo(f"wrote {path}")
