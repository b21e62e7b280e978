"""What operators do with a workspace: find and show jobs, status, steering, waiting,
logs, fsck, gc, bulk submission input and the demo."""

# every move an operator or a manager makes counts into the dependency sets (§14)
import httk_flow.protocol.release  # noqa: F401
