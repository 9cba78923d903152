"""What a caller may pass in: every documented limit, and its check, in one place.

Whatever passes these checks, both stores hold exactly (DESIGN.md, invariant
11). What either could not hold is refused here, at the edge, with a
``TypeError`` or ``ValueError`` that names the field and the limit, before
anything is stored. The README's "Limits" section lists the same numbers.

- Text that is stored as text (role, content, episode id, session id, owner)
  may not contain NUL: PostgreSQL's ``text`` cannot hold it, so SQLite must
  not take it either. It must also be valid Unicode (no lone surrogates),
  since both stores keep UTF-8. Metadata needs no NUL rule: it is stored as
  JSON text, and ``json.dumps`` writes NUL as the escape ``\\u0000``.
- Names that are index keys (session id, episode id, owner) are bounded in
  UTF-8 bytes, which is what an index entry holds. PostgreSQL refuses a btree
  entry over 2,704 bytes; the entry of ``episodes_by_id`` carries the episode
  id and the session id plus 16 bytes of headers (measured on PostgreSQL 15
  with incompressible text: 2,688 bytes of names fit, 2,696 do not). 1,024
  bytes each fits with room to spare, and takes 1,024 ASCII characters or
  256 characters of 4-byte UTF-8 (emoji, rare CJK).
- Seqs are signed 64-bit integers in both stores.
"""

from __future__ import annotations

#: Session ids, in UTF-8 bytes (a session id is part of every key).
MAX_SESSION_ID_BYTES = 1024
#: Episode ids, in UTF-8 bytes (unique per session: indexed with the session id).
MAX_EPISODE_ID_BYTES = 1024
#: ``open_engine(owner=...)``, in UTF-8 bytes (indexed in the session leases).
MAX_OWNER_BYTES = 1024
#: Episode roles, in characters: "user", "assistant", "tool", or a tool's name, never a document.
MAX_ROLE_CHARS = 256
#: The highest seq (a signed 64-bit integer, what both stores' seq columns hold).
MAX_SEQ = 2**63 - 1
#: The most hits one ``Engine.recall`` returns: a page of a search, not a dump of the store.
MAX_RECALL_LIMIT = 10_000


def require_text(what: str, value: object, *, max_chars: int | None = None, max_bytes: int | None = None) -> str:
    """``value`` if it is a non-blank str both stores keep exactly, within the given bounds.

    Otherwise ``TypeError`` (not a str) or ``ValueError`` (blank, NUL, not
    valid Unicode, too long), naming ``what``.
    """
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    # Length in characters first: a 5 MB string is refused without being scanned further.
    if max_chars is not None and len(value) > max_chars:
        raise ValueError(f"{what} is at most {max_chars} characters, got {len(value)}")
    if not value.strip():
        raise ValueError(f"{what} must be a non-empty string")
    if "\x00" in value:
        raise ValueError(f"{what} must not contain NUL (\\x00) characters, which PostgreSQL cannot store")
    size = len(require_utf8(what, value))
    if max_bytes is not None and size > max_bytes:
        raise ValueError(f"{what} is at most {max_bytes} bytes of UTF-8, got {size}")
    return value


def require_utf8(what: str, value: str) -> bytes:
    """``value`` as UTF-8, or ``ValueError`` naming ``what`` (a lone surrogate cannot be stored)."""
    # Refused here, with a clear message, rather than deep in the store after other episodes were written.
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} is not valid Unicode text: {exc.reason}") from None


def require_int(what: str, value: object, minimum: int, maximum: int) -> int:
    """``value`` if it is an int (not a bool) within ``minimum..maximum``; else ``TypeError``/``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if not minimum <= value <= maximum:
        raise ValueError(f"{what} must be between {minimum} and {maximum}, got {value}")
    return value


def require_seq(what: str, value: object) -> int:
    """A seq: an int within ``1..MAX_SEQ``."""
    return require_int(what, value, 1, MAX_SEQ)
