"""Exactly-once hand-off of a session's episodes to a long-term memory sink."""
