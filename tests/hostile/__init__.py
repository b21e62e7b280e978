"""Hostile input: fuzzed parsers, planted garbage, symlinks, traversal, a deleted job, a
full disk and a skewed clock. Each bad input gets a clear outcome, and a manager in the
same workspace keeps serving the other jobs."""
