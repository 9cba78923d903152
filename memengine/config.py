"""Per-session settings, validated when constructed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from .clipping import ToolClipping


def _positive_int(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"SessionConfig.{attribute.name} must be an int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"SessionConfig.{attribute.name} must be at least 1, got {value}")


def _positive_seconds(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"SessionConfig.{attribute.name} must be a number of seconds, not {type(value).__name__}")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"SessionConfig.{attribute.name} must be a positive, finite number of seconds, got {value}")


def _non_negative_seconds(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or value != 0:
        _positive_seconds(instance, attribute, value)


def _optional_positive_int(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        _positive_int(instance, attribute, value)


def _fraction(instance: object, attribute: attrs.Attribute[float], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"SessionConfig.{attribute.name} must be a number, not {type(value).__name__}")
    if not 0 < value <= 1:
        raise ValueError(f"SessionConfig.{attribute.name} must be more than 0 and at most 1, got {value}")


def _optional_callable(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not callable(value):
        raise TypeError(f"SessionConfig.{attribute.name} must be a callable (str -> int) or None, not {value!r}")


def _clipping_from_dict(value: object) -> object:
    """A recorded config (replay) holds the setting as a dict: it is read back as the class."""
    if isinstance(value, dict):
        return ToolClipping(**value)
    return value


def _optional_clipping(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not isinstance(value, ToolClipping):
        raise TypeError(
            f"SessionConfig.{attribute.name} must be a memengine.ToolClipping or None, not {type(value).__name__}"
        )


def _bool(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"SessionConfig.{attribute.name} must be True or False, not {value!r}")


def _optional_seconds(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        _positive_seconds(instance, attribute, value)


@attrs.frozen(kw_only=True)
class SessionConfig:
    """How every session of an engine behaves.

    ``max_episodes``, ``max_chars`` and ``max_tokens`` (``None``: no token
    bound) bound the raw window, whichever binds first. When an added episode
    makes the window overflow, the oldest episodes are evicted (handed to the
    session's summarizer) until what stays fits ``evict_to`` of every bound:
    with the default 0.5, the window holds between half and all of its budget,
    and one summarizer call covers about half a window instead of one episode
    per turn. ``evict_to=1.0`` evicts only what overflows (a fuller window, an
    LLM call per turn at human pace). A tool call and its results are always
    evicted together (see :mod:`memengine.tool_calls`). ``tokenizer`` counts
    an episode's tokens (any ``str -> int``; default
    :func:`memengine.tokens.estimate_tokens`, offline); each episode is counted
    once, when added or loaded, and ``Context.tokens`` reports what a read
    returns. A content of 16,384 characters or more is counted in a worker
    thread, so the tokenizer must be safe to call from any thread (tiktoken's
    is); images and other base64 parts are not given to it (see
    :mod:`memengine.attachments`).
    ``retain_every`` is the batch size of the hand-off to long-term memory.
    ``passivate_after`` is how long (seconds) an idle session stays in memory;
    ``None`` keeps it until the engine closes. The ``summarize_*`` settings
    control retries of the summarizer: ``summarize_attempts`` tries with
    exponential backoff (starting at ``summarize_backoff``, capped at
    ``summarize_backoff_max``, with jitter), then the batch stays pending and is
    tried again ``summarize_retry_later`` seconds later. ``summarize_batch_max``
    caps how many episodes go into one summarizer call, and
    ``summarize_input_max_chars`` (with a ``tokenizer``, also
    ``summarize_input_max_tokens``) how much text, the previous summary
    included: a larger backlog takes several calls. The episodes of a call
    get at least half of the bound: a previous summary longer than what they
    leave reaches the summarizer with its middle cut out and a marker saying
    so (logged; ask the summarizer for shorter summaries), and an episode
    larger than the episodes' share on its own reaches it cut, with a marker
    saying so (it stays stored whole); ``summarize_timeout``
    bounds one call (a call that takes longer counts as a failed attempt).
    After ``summarize_set_aside_after`` failed rounds in a row (a round is
    ``summarize_attempts`` tries), the batch is *set aside*: recorded in the
    store, no more automatic tries for the session (its episodes stay stored
    and shown raw), and the session may passivate, until
    :meth:`~memengine.Engine.retry_set_aside` (or ``memengine set-aside
    retry``); ``None`` never sets aside. The ``retain_*``
    settings do the same for deliveries to the retain sink: ``retain_timeout``
    bounds one sink call (it is cancelled then, and the batch is retried), and a
    refused batch waits out its backoff, then ``retain_retry_later``, recorded in
    the store, so every process sharing it waits too; other sessions go on meanwhile.
    After ``retain_set_aside_after`` failed rounds (of ``retain_attempts``
    calls each) the batch is set aside: it stays in the outbox, with its
    session's later batches behind it, and is not sent again until retried or
    discarded (:meth:`~memengine.Engine.retry_set_aside`,
    :meth:`~memengine.Engine.discard_set_aside`); ``None`` never sets aside.
    ``retain_claim_seconds`` is how long a process's claim on a batch lasts
    while it is alive but cut off from the store (the claim is extended every
    third of it while the sink call runs; a call whose claim could not be kept
    is cancelled before the claim lapses, and the batch counts as not
    delivered); a dead process's batch is sent by another process once its
    claim lapses, so this is also how long such a batch waits.
    ``max_content_chars`` and ``max_metadata_bytes`` (metadata as UTF-8 JSON)
    bound what one episode may hold: ``add`` refuses a larger one with
    ``ValueError`` and stores nothing of that call.

    ``tool_clipping`` (a :class:`~memengine.ToolClipping`; ``None``, the
    default: off) shows tool results older than the newest
    ``ToolClipping.keep_turns`` episodes and longer than
    ``ToolClipping.over_chars`` characters as a head and a tail around a marker
    naming the seq that holds the whole output (see :mod:`memengine.clipping`).
    Only the view is clipped, and counted clipped by the budgets: the store,
    recall, export, the retain sink and the summarizer get the whole output.
    It is off by default because it changes what the model reads: an agent
    that needs an old output again (to quote a file it read ten turns ago)
    must be able to fetch it by seq, a tool the application provides; and an
    upgrade should not change the prompts of agents that worked. Turn it on
    for tool-heavy agents (file readers, search, shells), where old outputs
    are most of the tokens and their middle rarely matters; the default
    ``ToolClipping()`` is conservative.

    ``max_context_tokens`` is the ceiling on what ``context()`` returns
    (``Context.tokens``: the summary, the raw episodes, and the note on what is
    left out); ``None``, the default, means twice ``max_tokens`` (and no
    ceiling when ``max_tokens`` is ``None`` too). The window stays within
    ``max_tokens``, but episodes that left it stay shown raw until their
    summary is stored, so a lagging summarizer would otherwise let a context
    grow without bound. A read that would pass the ceiling first waits up to
    ``max_context_wait`` seconds (default 2; ``0``: never waits) for the
    summarizer; past that it returns the newest episodes within the ceiling
    and says what it left out (``Context.omitted``: episodes neither
    summarized nor shown). Writers never wait for it.

    ``segment_summaries`` (default ``False``) keeps a session's summarized past
    as a tree of summaries rather than one rolling summary (see
    :mod:`memengine.store.segments`): each batch of evicted episodes is
    summarized on its own (``summarize(None, batch)``, so a batch's summary
    does not read the ones before it), and two neighbouring summaries of the
    same size are merged by one more call (``Summarizer.fold`` if the
    summarizer has one, else ``summarize`` given the second as an episode).
    The summary a read gets is the few largest summaries that cover the past,
    oldest first. A delete of an old episode then costs about ``log2`` of the
    number of batches in summarizer calls (the batch that held it, and the
    merges above it), and meanwhile the read gets every other summary and, in
    the deleted episode's batch's place, its live episodes as they were said
    (``Context.resummarizing`` lists the range), instead of every episode since
    the delete raw. The price is a merge call per batch (on short inputs: two
    summaries), and summaries written without the ones before them. Use it
    where deletes of old episodes happen (users who may remove a message,
    erasure requests) in long sessions. It applies to sessions summarized from
    their start with it on (a session with a rolling summary keeps it); a
    segmented session stays so until it is cleared.

    ``mailbox_capacity`` bounds the calls waiting for one session: when that
    many are queued unhandled, a further call waits for room before it is sent
    (back-pressure; a call cancelled while it waits was not sent).

    ``lease_ttl`` is how long a process's ownership of an active session lasts
    unless renewed (the engine renews every third of it): after a process
    dies, its sessions are taken over within about this long. ``lease_wait``
    is how long a call waits for a session another process owns before
    raising :class:`~memengine.errors.SessionBusyError`; keep it above
    ``lease_ttl`` so that a dead owner's sessions are taken over, not refused.
    """

    max_episodes: int = attrs.field(default=20, validator=_positive_int)
    max_chars: int = attrs.field(default=8000, validator=_positive_int)
    max_tokens: int | None = attrs.field(default=None, validator=_optional_positive_int)
    tokenizer: Callable[[str], int] | None = attrs.field(default=None, validator=_optional_callable)
    evict_to: float = attrs.field(default=0.5, validator=_fraction)
    retain_every: int = attrs.field(default=20, validator=_positive_int)
    passivate_after: float | None = attrs.field(default=300.0, validator=_optional_seconds)
    summarize_attempts: int = attrs.field(default=4, validator=_positive_int)
    summarize_backoff: float = attrs.field(default=0.5, validator=_positive_seconds)
    summarize_backoff_max: float = attrs.field(default=30.0, validator=_positive_seconds)
    summarize_retry_later: float = attrs.field(default=60.0, validator=_positive_seconds)
    summarize_batch_max: int = attrs.field(default=200, validator=_positive_int)
    summarize_timeout: float = attrs.field(default=120.0, validator=_positive_seconds)
    summarize_input_max_chars: int = attrs.field(default=1_000_000, validator=_positive_int)
    summarize_input_max_tokens: int | None = attrs.field(default=None, validator=_optional_positive_int)
    summarize_set_aside_after: int | None = attrs.field(default=5, validator=_optional_positive_int)
    max_content_chars: int = attrs.field(default=4_000_000, validator=_positive_int)
    max_metadata_bytes: int = attrs.field(default=16_384, validator=_positive_int)
    retain_attempts: int = attrs.field(default=5, validator=_positive_int)
    retain_backoff: float = attrs.field(default=0.5, validator=_positive_seconds)
    retain_backoff_max: float = attrs.field(default=30.0, validator=_positive_seconds)
    retain_retry_later: float = attrs.field(default=60.0, validator=_positive_seconds)
    retain_timeout: float = attrs.field(default=60.0, validator=_positive_seconds)
    retain_claim_seconds: float = attrs.field(default=60.0, validator=_positive_seconds)
    retain_set_aside_after: int | None = attrs.field(default=5, validator=_optional_positive_int)
    lease_ttl: float = attrs.field(default=10.0, validator=_positive_seconds)
    lease_wait: float = attrs.field(default=12.0, validator=_non_negative_seconds)
    mailbox_capacity: int = attrs.field(default=1000, validator=_positive_int)
    tool_clipping: ToolClipping | None = attrs.field(
        default=None, converter=_clipping_from_dict, validator=_optional_clipping
    )
    max_context_tokens: int | None = attrs.field(default=None, validator=_optional_positive_int)
    max_context_wait: float = attrs.field(default=2.0, validator=_non_negative_seconds)
    segment_summaries: bool = attrs.field(default=False, validator=_bool)

    @property
    def context_ceiling(self) -> int | None:
        """The token ceiling of ``context()``: ``max_context_tokens``, else twice ``max_tokens`` (None: none)."""
        if self.max_context_tokens is not None:
            return self.max_context_tokens
        return None if self.max_tokens is None else 2 * self.max_tokens
