"""The session actor, its messages, and the client handle that sends them."""
