"""The offline default: a deterministic extractive summarizer (no model needed)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from ..episode import Episode

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"[^\W\d_]{3,}", re.UNICODE)
_STOPWORDS = frozenset(
    """the and for are but not you your with this that have has had was were will would
    could should can what when where which who whom how why about into from they them then
    than there their our ours its just also very really much more most some any all been
    being does did doing done here okay yes sure thanks thank please let lets get got""".split()
)


class ExtractiveSummarizer:
    """Keeps the most informative sentences, in order, within ``max_chars``.

    Candidates are the previous summary's lines and one line per sentence of the
    new episodes (``role: sentence``). Each is scored by how often its content
    words occur across all candidates, so recurring topics survive; ties favour
    newer lines. The kept lines are returned in their original order. The same
    input always gives the same summary.
    """

    def __init__(self, max_chars: int = 1200, max_sentence_chars: int = 240) -> None:
        if max_chars < 1 or max_sentence_chars < 1:
            raise ValueError("max_chars and max_sentence_chars must be at least 1")
        self.max_chars = max_chars
        self.max_sentence_chars = max_sentence_chars

    async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
        return self.summarize_now(previous, episodes)

    def summarize_now(self, previous: str | None, episodes: Sequence[Episode]) -> str:
        candidates = [line for line in (previous or "").splitlines() if line.strip()]
        for episode in episodes:
            for sentence in _SENTENCE_END.split(" ".join(episode.content.split())):
                if sentence:
                    candidates.append(self._clip(f"{episode.role}: {sentence}"))
        if not candidates:
            return previous or ""
        frequency = Counter(word for line in candidates for word in _words(line))
        ranked = sorted(
            range(len(candidates)),
            key=lambda i: (-_score(candidates[i], frequency), -i),
        )
        kept: set[int] = set()
        used = 0
        for index in ranked:
            cost = len(candidates[index]) + 1
            if used + cost <= self.max_chars:
                kept.add(index)
                used += cost
        if not kept:  # even the best line is too long: keep a clipped piece of it
            return candidates[ranked[0]][: self.max_chars]
        return "\n".join(candidates[i] for i in sorted(kept))

    def _clip(self, line: str) -> str:
        if len(line) <= self.max_sentence_chars:
            return line
        return line[: self.max_sentence_chars - 1].rstrip() + "…"


def _words(line: str) -> set[str]:
    return {word for word in (w.lower() for w in _WORD.findall(line)) if word not in _STOPWORDS}


def _score(line: str, frequency: Counter[str]) -> float:
    words = _words(line)
    if not words:
        return 0.0
    return sum(frequency[word] for word in words) / (len(words) ** 0.5)
