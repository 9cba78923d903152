"""The offline default: a deterministic extractive summarizer (no model needed)."""

from __future__ import annotations

import functools
import heapq
import math
import re
from collections.abc import Iterable, Sequence, Set

import anyio
import anyio.to_thread
import attrs

from ..episode import Episode

# A sentence ends at . ! ? or … (and any closing quotes or brackets), before
# whitespace and a character that is not a lowercase letter.
_SENTENCE_END = re.compile(r"[.!?\u2026]+[\"'\u2019\u201d)\]]*\s+(?=[^a-z\u00df-\u00ff])")
# Words that end in "." without ending a sentence: titles and common shorthand
# ("Dr. Matos", "approx. 20"), and some only before a number ("No. 5", "Jan. 3":
# "No." and "Jan." end sentences too). Dotted forms ("e.g.", "a.m.", "U.S.") and
# initials ("J.") are recognised by their shape.
_ABBREVIATIONS = frozenset(
    """mr mrs ms mx dr prof sr jr st mt fr rev hon gen col capt lt sgt
    vs etc approx appt apt dept inc ltd corp ave blvd""".split()
)
_ABBREVIATIONS_BEFORE_NUMBERS = frozenset(
    """no nos vol vols fig figs tel ch pt
    jan feb mar apr jun jul aug sep sept oct nov dec""".split()
)
_DOTTED = re.compile(r"(?:[^\W\d_]\.)*[^\W\d_]")
# How this summarizer writes a line: "role: sentence". The role is not content.
_ROLE_PREFIX = re.compile(r"[^\s:][^:\n]{0,39}?: ")
# Words, numbers and compounds ("four-year-old", "1,180", "B1"). An apostrophe
# ends a token, so "dog's" gives "dog" and "don't" gives "don".
_TOKEN = re.compile(r"[^\W_]+(?:[-.,/][^\W_]+)*")
_DIGIT = re.compile(r"\d")
# "..., not X" and "instead of X", X a name or number: the line corrects older lines that said X.
_REPLACED = re.compile(r"(?:,\s*not|\binstead\s+of)\s+((?:[^,.;:!?]|[.,](?=\d))+)", re.IGNORECASE)
_STOPWORDS = frozenset(
    """the and for are but not you your yours with this that these those have has had having was were
    will would could should can cannot what when where which who whom whose how why about into from
    onto they them then than there their theirs our ours its just also very really much more most
    some any all been being does did doing done here okay yes sure thanks thank please let lets get
    got gets getting she her hers him his himself herself myself yourself ourselves themselves
    don doesn didn isn aren wasn weren won wouldn couldn shouldn haven hasn hadn ain
    hi hello hey bye goodbye wow ooh ahh hmm huh yeah yep nope alright great nice cool fine
    good lovely perfect awesome amazing brilliant fantastic excellent congratulations sorry
    now still well like only even over after before because while other another each every
    such same own too again ever never always often soon later once both either neither
    maybe probably perhaps quite pretty rather actually basically anyway though although
    thing things something anything everything nothing someone anyone everyone nobody
    way lot lots bit kind sort stuff one ones
    want wants wanted need needs needed know knows knew think thinks thought say says said
    tell tells told ask asks asked make makes making made take takes took taken give gives gave
    keep keeps kept come comes came going goes went gone see sees saw seen look looks looked
    use uses used try tries tried feel feels felt seem seems seemed mean means meant
    put puts remember remind reminder sound sounds""".split()
)

# Scoring. A name or number weighs double an ordinary word.
_NAME_WEIGHT = 2.0
# A word that recurs across the candidates weighs more, logarithmically: topics that keep coming up.
_RECURRENCE_WEIGHT = 0.5
# A word already said by a kept line adds only this much: the summary covers more topics.
_COVERED_WEIGHT = 0.1
# A line with fewer content words than this scores in proportion: "Hi!" or "What was it?" say little.
_FULL_LINE_WORDS = 3
# A correction ("Bolo, not Bola") counts this much more: it overrides what the summary said.
_CORRECTION_WEIGHT = 1.5
# Only new lines scoring at least this share of the best new line use the reserve for new lines.
_FRESH_CUTOFF = 0.5
# A line sharing this share of its words with a kept line repeats it and is left out.
_REPEAT_SHARE = 0.6


@attrs.define
class _Line:
    """A candidate line of the summary: a line of the previous one, or a new sentence."""

    text: str  # as it will be written: "role: sentence"
    order: int  # position among the candidates, oldest first
    fresh: bool  # from the episodes being folded in
    words: tuple[str, ...]  # distinct content words of the sentence, in order (never the role)
    word_set: frozenset[str]
    names: frozenset[str]  # the words written as names (capitalised mid-sentence) or numbers
    replaces: frozenset[str]  # words this line corrects: {"bola"} for "Bolo, not Bola"
    recency: float = 1.0
    first_score: float = 0.0  # before any line is kept; gains only shrink, so an upper bound after


class ExtractiveSummarizer:
    """Keeps the most informative recent sentences, in conversation order, within ``max_chars``.

    The summary is one sentence a line, written ``role: sentence``. To fold new
    episodes in, the candidates are the previous summary's lines and the new
    episodes' sentences, oldest first. Each is scored on its own words (the
    role prefix never counts):

    * information: its distinct content words, names and numbers counting
      double and words that recur across the candidates a little more, grown
      by the square root of their number; a line of one or two content words
      scores in proportion, and a line of none is kept only if nothing else is;
    * recency: the score halves for every ``half_life`` characters of newer
      text (default: twice ``max_chars``; half of all the candidates' text if
      that is longer, so a large batch is summarized whole, not just its end):
      old lines fade gradually, and dense facts and recurring topics last longer;
    * corrections: a sentence that says "..., not X" or "instead of X", X a
      name or number, counts more, and older lines that said X about the same
      thing are dropped.

    Up to ``fresh_share`` of ``max_chars`` (and always enough for one) first
    goes to the best new sentences, so new facts get in even against a summary
    of strong old lines; the rest goes to the best lines of any age. Each pick
    discounts the words it covers, and a line that mostly repeats a kept line
    is left out, so the summary spans several topics. Kept lines are returned
    in their original order.

    The same input always gives the same summary, never longer than
    ``max_chars`` and never empty when there is input (a sentence too long for
    the budget is clipped). Pure Python: a call with a full summary and a few
    episodes takes a fraction of a millisecond.
    """

    def __init__(
        self,
        max_chars: int = 1200,
        max_sentence_chars: int = 240,
        *,
        fresh_share: float = 0.25,
        half_life: int | None = None,
    ) -> None:
        if max_chars < 1 or max_sentence_chars < 1:
            raise ValueError("max_chars and max_sentence_chars must be at least 1")
        if not 0.0 <= fresh_share <= 1.0:
            raise ValueError("fresh_share must be between 0 and 1")
        if half_life is not None and half_life < 1:
            raise ValueError("half_life must be at least 1 (characters)")
        self.max_chars = max_chars
        self.max_sentence_chars = max_sentence_chars
        self.fresh_share = fresh_share
        self.half_life = half_life if half_life is not None else 2 * max_chars

    def __repr__(self) -> str:
        return (
            f"ExtractiveSummarizer(max_chars={self.max_chars}, max_sentence_chars={self.max_sentence_chars}, "
            f"fresh_share={self.fresh_share}, half_life={self.half_life})"
        )

    async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
        """Fold ``episodes`` into ``previous``, in a worker thread.

        A large batch takes a noticeable share of a second of CPU: run on the
        event loop, it would hold up every writer. If cancelled, the result of
        the thread is discarded.
        """
        return await anyio.to_thread.run_sync(self.summarize_now, previous, episodes, abandon_on_cancel=True)

    def summarize_now(self, previous: str | None, episodes: Sequence[Episode]) -> str:
        """The new summary: ``previous`` with ``episodes`` folded in."""
        lines = _without_superseded(self._candidates(previous or "", episodes))
        if not lines:
            return previous or ""
        weights = _word_weights(lines)
        self._score(lines, weights)
        kept = self._select(lines, weights)
        if not kept:  # not one line says anything: keep the newest
            return lines[-1].text
        return "\n".join(line.text for line in sorted(kept, key=lambda line: line.order))

    def _candidates(self, previous: str, episodes: Sequence[Episode]) -> list[_Line]:
        lines: list[_Line] = []
        for raw in previous.splitlines():
            text = " ".join(raw.split())
            if not text:
                continue
            prefix = _ROLE_PREFIX.match(text)
            role, body = (text[: prefix.end() - 2], text[prefix.end() :]) if prefix else (None, text)
            # This summarizer's lines are single sentences; a longer line came
            # from another summarizer and is split like new text.
            for sentence in [body] if len(text) <= self.max_sentence_chars else _sentences(body):
                lines.append(self._line(role, sentence, len(lines), fresh=False))
        for episode in episodes:
            role = " ".join(episode.role.split())  # a newline in a role would split its line in two
            for sentence in _sentences(episode.content):
                lines.append(self._line(role, sentence, len(lines), fresh=True))
        return lines

    def _line(self, role: str | None, sentence: str, order: int, *, fresh: bool) -> _Line:
        limit = min(self.max_sentence_chars, self.max_chars)  # so that any one line fits on its own
        text = _clip(f"{role}: {sentence}" if role else sentence, limit)
        words, word_set, names, replaces = _analyse(text[len(role) + 2 :] if role else text)
        return _Line(text, order, fresh, words, word_set, names, replaces)

    def _score(self, lines: list[_Line], weights: dict[str, float]) -> None:
        """Set each line's recency, and its score before any line is kept."""
        half_life = max(self.half_life, sum(len(line.text) + 1 for line in lines) / 2)
        newer = 0  # characters of the lines after this one
        for line in reversed(lines):
            line.recency = 0.5 ** (newer / half_life)
            line.first_score = _gain(line, weights, frozenset()) * line.recency
            newer += len(line.text) + 1

    def _select(self, lines: list[_Line], weights: dict[str, float]) -> list[_Line]:
        """The lines to keep: first the best new ones, within the reserve, then the best of all."""
        kept: list[_Line] = []
        covered: set[str] = set()
        budget = self.max_chars + 1  # a line costs its length and a newline; the last needs none
        fresh = [line for line in lines if line.fresh and line.first_score > 0]
        if fresh and self.fresh_share > 0:
            best = max(fresh, key=lambda line: (line.first_score, line.order))
            # The reserve is for the best new lines: a weak one ("Then you only need a sofa later.") waits its turn.
            fresh = [line for line in fresh if line.first_score >= _FRESH_CUTOFF * best.first_score]
            reserve = min(budget, max(int(self.fresh_share * self.max_chars), len(best.text) + 1))
            _pick(fresh, weights, kept, covered, reserve)
        kept_orders = {line.order for line in kept}
        _pick([line for line in lines if line.order not in kept_orders], weights, kept, covered, budget)
        return kept


def _word_weights(lines: list[_Line]) -> dict[str, float]:
    """Each content word's weight: double for a name or number, more for a word that recurs."""
    counts: dict[str, int] = {}  # insertion-ordered, so every sum over it is deterministic
    names: set[str] = set()
    for line in lines:
        names |= line.names
        for word in line.words:
            counts[word] = counts.get(word, 0) + 1
    return {
        word: (_NAME_WEIGHT if word in names else 1.0) * (1.0 + _RECURRENCE_WEIGHT * math.log(count))
        for word, count in counts.items()
    }


def _gain(line: _Line, weights: dict[str, float], covered: Set[str]) -> float:
    """What ``line`` would add to a summary that already says the ``covered`` words."""
    if not line.words:
        return 0.0
    total = 0.0
    for word in line.words:
        total += weights[word] * (_COVERED_WEIGHT if word in covered else 1.0)
    count = len(line.words)
    gain = total / math.sqrt(count) * min(1.0, count / _FULL_LINE_WORDS)
    return gain * _CORRECTION_WEIGHT if line.replaces else gain


def _pick(candidates: list[_Line], weights: dict[str, float], kept: list[_Line], covered: set[str], limit: int) -> None:
    """Keep the best candidates, one at a time, while the kept lines fit in ``limit`` characters.

    Each pick covers its words, which lowers the gain of the lines that share
    them. Gains only shrink, so a candidate is scored again only when it
    reaches the top of the heap (lazy greedy).
    """
    used = sum(len(line.text) + 1 for line in kept)
    # Entries: (-score, -order, how many lines were kept when it was scored, line).
    heap = [(-line.first_score, -line.order, 0, line) for line in candidates if line.first_score > 0]
    heapq.heapify(heap)
    while heap:
        _, negative_order, scored_at, line = heapq.heappop(heap)
        cost = len(line.text) + 1
        if used + cost > limit or _repeats(line, kept):
            continue  # both only get worse as lines are kept
        if scored_at != len(kept):
            score = _gain(line, weights, covered) * line.recency
            heapq.heappush(heap, (-score, negative_order, len(kept), line))
            continue
        kept.append(line)
        covered.update(line.words)
        used += cost


def _sentences(text: str) -> list[str]:
    """The sentences of ``text``, whitespace collapsed; never an empty one."""
    text = " ".join(text.split())
    sentences = []
    start = 0
    for end in _SENTENCE_END.finditer(text):
        if text[end.start()] == "." and _abbreviation_before(text, start, end.start()):
            continue
        sentences.append(text[start : end.end()].rstrip())
        start = end.end()
    sentences.append(text[start:])
    return [sentence for sentence in sentences if sentence]


def _abbreviation_before(text: str, start: int, dot: int) -> bool:
    """Whether the "." at ``dot`` ends an abbreviation rather than the sentence that began at ``start``."""
    word = text[text.rfind(" ", start, dot) + 1 : dot].lstrip("(\"'\u2018\u201c[").lower()
    if word in _ABBREVIATIONS or _DOTTED.fullmatch(word):
        return True
    return word in _ABBREVIATIONS_BEFORE_NUMBERS and text[dot + 1 : dot + 3].strip()[:1].isdigit()


# The previous summary's lines come back on every call: analyse each text once.
@functools.lru_cache(maxsize=4096)
def _analyse(body: str) -> tuple[tuple[str, ...], frozenset[str], frozenset[str], frozenset[str]]:
    """A sentence's content words (as a tuple and a set), its names, and the words it corrects."""
    words, names = _content_words(body)
    replaces: frozenset[str] = frozenset()
    lowered = body.lower()
    if "not" in lowered or "instead" in lowered:  # the regular expression is slower than this test
        replaces = frozenset(
            replaced[0]
            for match in _REPLACED.finditer(body)
            if (replaced := _content_words(match.group(1))[0]) and replaced[0] in names
        )
    return words, frozenset(words), names, replaces


def _content_words(body: str) -> tuple[tuple[str, ...], frozenset[str]]:
    """The distinct content words of a sentence, lowercased, and those that are names or numbers."""
    words: dict[str, bool] = {}  # word -> is a name or number; insertion-ordered
    opening = body.lstrip("\"'([\u2018\u201c")
    for position, token in enumerate(_TOKEN.findall(body)):
        word = token.lower()
        if word.isalpha():
            if len(word) < 3 or word in _STOPWORDS:
                continue
        elif _DIGIT.search(word):
            words[word] = True
            continue
        if word[-1] == "s" and len(word) > 3 and word[-2] != "s":
            word = word[:-1]  # a rough plural: "lessons" and "lesson" are one word
        # A capital is a name's, unless it starts the sentence.
        is_name = token[0].isupper() and (position > 0 or not opening.startswith(token))
        words[word] = words.get(word, False) or is_name
    return tuple(words), frozenset(word for word, is_name in words.items() if is_name)


def _without_superseded(lines: list[_Line]) -> list[_Line]:
    """``lines`` without those a newer line corrects.

    "Bolo, not Bola" supersedes an older line that says "Bola" and shares
    another word with the correction ("my dog, Bola"), not every "Bola".
    """
    superseded: set[int] = set()
    for position, correction in enumerate(lines):
        for replaced in correction.replaces:
            for older in lines[:position]:
                shared = len(older.word_set & correction.word_set) - (replaced in correction.word_set)
                if replaced in older.word_set and shared > 0:
                    superseded.add(older.order)
    if not superseded:
        return lines
    return [line for line in lines if line.order not in superseded]


def _repeats(line: _Line, kept: Iterable[_Line]) -> bool:
    """Whether most of ``line``'s words are in a line already kept."""
    for other in kept:
        shared = len(line.word_set & other.word_set)
        if shared and shared >= _REPEAT_SHARE * min(len(line.words), len(other.words)):
            return True
    return False


def _clip(line: str, limit: int) -> str:
    if len(line) <= limit:
        return line
    return line[: limit - 1].rstrip() + "…"
