"""What operators do with a workspace: find and show jobs, status, steering, waiting,
logs, fsck, gc, bulk submission input and the demo."""
