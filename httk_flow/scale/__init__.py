"""Keeping managers alive on a cluster: the allocation reconciler, its records, and the
backends that submit allocations."""
