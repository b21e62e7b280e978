"""httk_flow: a filesystem-marker workflow engine for HPC clusters."""

__version__ = "0.1.0"
