"""The `flow` command line: parses and renders, and calls the package for everything else."""
