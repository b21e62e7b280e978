"""The on-disk protocol (docs/protocol.md): names, states, the journal, the workspace,
the verified transition, submission, leases and the rest every process shares."""
