"""The manager: a tick loop of passes that claims, launches, commits and recovers jobs."""

# every move an operator or a manager makes counts into the dependency sets (§14)
import httk_flow.protocol.release  # noqa: F401
