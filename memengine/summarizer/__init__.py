"""Summarizers and the summarizer child actor each session runs."""

from .extractive import ExtractiveSummarizer
from .protocol import Summarizer

__all__ = ["ExtractiveSummarizer", "Summarizer"]
