"""fslab's built-in studies: one TOML file per paper table or figure, in this folder.

Each file names its paper, the sweeps that reproduce the table or figure and the
published numbers (schema: README, "Reproducing the papers"). They register
through the same hook and helper a third-party package uses.
"""

from pathlib import Path

from fslab.plugin import hookimpl, register_study_files


@hookimpl
def register_studies(register):
    register_study_files(register, Path(__file__).parent)
