"""Plain-text rendering of sessions, summaries and episodes for the terminal."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from ..context import Context
from ..episode import Episode
from ..store.base import SetAside

LINE_WIDTH = 100
INDENT = "    "


def one_line(text: str, width: int | None = LINE_WIDTH) -> str:
    """``text`` with its whitespace collapsed, clipped to ``width`` characters (``None``: not clipped)."""
    flat = " ".join(text.split())
    if width is None or len(flat) <= width:
        return flat
    return flat[: width - 1].rstrip() + "…"


def indented(lines: Iterable[str], indent: str = INDENT) -> list[str]:
    return [indent + line for line in lines]


def summary_lines(summary: str | None, *, max_lines: int | None = None, width: int | None = LINE_WIDTH) -> list[str]:
    """The summary's lines, each clipped to ``width`` (``None``: whole); at most ``max_lines`` of them."""
    if not summary:
        return ["(no summary yet)"]
    lines = [one_line(line, width) for line in summary.splitlines() if line.strip()]
    if max_lines is not None and len(lines) > max_lines:
        hidden = len(lines) - max_lines
        lines = [*lines[:max_lines], f"… ({hidden} more line{'s' if hidden != 1 else ''})"]
    return lines


def episode_lines(episodes: Sequence[Episode], width: int | None = LINE_WIDTH) -> list[str]:
    """One line per episode: its seq, its role and the start of its content.

    With ``width=None``, the whole content instead, its own lines kept (indented under the first).
    """
    if not episodes:
        return ["(no raw episodes)"]
    seq_width = max(len(str(episode.seq)) for episode in episodes)
    role_width = max(len(one_line(episode.role, 12)) for episode in episodes)
    lines = []
    for episode in episodes:
        prefix = f"#{episode.seq:<{seq_width}}  {one_line(episode.role, 12):<{role_width}}  "
        if width is None:
            first, *rest = episode.content.splitlines() or [""]
            lines.append(prefix + first)
            lines.extend(" " * len(prefix) + line for line in rest)
        else:
            lines.append(prefix + one_line(episode.content, width))
    return lines


def awaiting_summary(context: Context) -> int:
    """How many of the context's raw episodes have left the window and wait for their summary."""
    return sum(1 for episode in context.episodes if (episode.seq or 0) <= context.evicted_through)


def context_lines(context: Context) -> list[str]:
    """A context as an agent would receive it: the summary, then the raw episodes after it."""
    pending = awaiting_summary(context)
    return [
        f"summary (covers seqs up to {context.summarized_through}):",
        *indented(summary_lines(context.summary)),
        f"raw episodes after the summary ({len(context.episodes)}, of which {pending} wait for a summary):",
        *indented(episode_lines(context.episodes)),
    ]


def set_aside_lines(set_aside: Sequence[SetAside], width: int | None = LINE_WIDTH) -> list[str]:
    """Two lines per piece of set-aside work: what, whose, since when, and its last error."""
    lines = []
    for work in set_aside:
        since = datetime.fromtimestamp(work.set_aside_at, UTC).isoformat(timespec="seconds")
        what = "summary of episodes" if work.kind == "summary" else "retain batch of seqs"
        session = one_line(repr(work.session_id)[1:-1], 40)
        attempts = f"{work.attempts} failed attempt{'s' if work.attempts != 1 else ''}"
        lines.append(
            f"{work.kind:<7}  session {session}: {what} {work.first_seq}..{work.last_seq}, {attempts}, since {since}"
        )
        lines.append(f"{'':<7}  last error: {one_line(work.error, width)}")
    return lines
