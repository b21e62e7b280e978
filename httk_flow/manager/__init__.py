"""The manager: a tick loop of passes that claims, launches, commits and recovers jobs."""
