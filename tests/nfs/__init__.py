"""A shared filesystem's hazards (late names, lingering names, ESTALE, lying renames),
modelled by fault injection at httk_flow.protocol.fsio's FileSystem seam: these machines cannot
mount NFS. Claims must stay exactly-once, registration and claims converge, no job is lost."""
