"""Plumbing shared by every actor: its mailbox and one-shot reply slots."""
