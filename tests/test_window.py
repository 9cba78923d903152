"""The incremental window agrees with its definition, whatever the sequence of events."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from memengine import Episode
from memengine.session.window import RawWindow, window_start

lengths = st.lists(st.integers(min_value=1, max_value=30), min_size=1, max_size=6)
events = st.lists(st.one_of(st.tuples(st.just("append"), lengths), st.tuples(st.just("summarize"), st.floats(0, 1))))


@given(max_episodes=st.integers(1, 8), max_chars=st.integers(1, 80), script=events)
def test_incremental_window_matches_definition(max_episodes: int, max_chars: int, script) -> None:
    window = RawWindow(max_episodes, max_chars)
    next_seq = 1
    for action, argument in script:
        if action == "append":
            new = []
            for length in argument:
                new.append(Episode("user", "x" * length, seq=next_seq))
                next_seq += 1
            before = window.evicted
            window.append(new)
            assert window.evicted >= before  # eviction never goes back
        elif window.evicted:
            # A summary covers some prefix of the evicted episodes.
            through = window.raw[int(argument * (window.evicted - 1))].seq
            dropped = window.drop_through(through)
            assert dropped >= 1 and all(e.seq > through for e in window.raw)
        # The window is exactly the longest newest run that fits the bounds.
        shown = window.raw[window.evicted :]
        assert len(shown) <= max_episodes
        assert sum(len(e.content) for e in shown) <= max_chars
        assert window.evicted == window_start(window.raw, max_episodes, max_chars)
        fresh = RawWindow(max_episodes, max_chars)
        fresh.reset(window.raw)
        assert fresh.evicted == window.evicted
