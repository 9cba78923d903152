"""What one append costs while a tool call waits for its result (issue #25, defect 10).

A window of 2,000 episodes (``max_episodes=2000``) whose oldest episode is a
call no result has answered yet: the call holds the window open (up to twice
its budget), so every append finds the window over budget and asks whether it
may evict. That question should cost what changed, not a rescan of the
window. Printed side by side, in one run: the cost per append in that state,
and in the same window with the call answered (nothing pinned, the usual
chunked evictions), in microseconds.

    .venv/bin/python benchmarks/open_call_append.py [--window 2000] [--appends 2000]
"""

from __future__ import annotations

import argparse
import time

from memengine import Episode
from memengine.episode import with_seq
from memengine.session.window import Budget, RawWindow
from memengine.tokens import estimate_tokens
from memengine.tool_calls import CALLS_KEY, RESULT_OF_KEY


def per_append_us(window_size: int, appends: int, *, answered: bool) -> float:
    window = RawWindow(Budget(window_size, 10**9), 0.5, estimate_tokens)
    seq = 1
    window.append([with_seq(Episode("assistant", "calling", metadata={CALLS_KEY: ["slow"]}), seq)])
    if answered:
        seq += 1
        window.append([with_seq(Episode("tool", "done", metadata={RESULT_OF_KEY: "slow"}), seq)])
    for _ in range(window_size):  # fill: the window is now at (or over) its budget
        seq += 1
        window.append([with_seq(Episode("user", f"turn {seq}"), seq)])
    episodes = [with_seq(Episode("user", f"turn {n}"), n) for n in range(seq + 1, seq + 1 + appends)]
    started = time.perf_counter()
    for episode in episodes:
        window.append([episode])
        if window.evicted > 1000:
            window.drop_through(window.evicted_through)  # the summary lands: keeps the pinned case pinned
    return (time.perf_counter() - started) / appends * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=2000, help="max_episodes (default 2000)")
    parser.add_argument("--appends", type=int, default=2000, help="appends timed (default 2000, within 2x the window)")
    args = parser.parse_args()
    appends = min(args.appends, args.window - 1)  # past twice the budget the call no longer holds the window
    for _ in range(2):  # the first round warms up
        pinned = per_append_us(args.window, appends, answered=False)
        free = per_append_us(args.window, appends, answered=True)
    print(f"window {args.window} episodes, {appends} appends timed")
    print(f"  a call waits for its result: {pinned:8.1f} us per append")
    print(f"  the call is answered:        {free:8.1f} us per append")
    print(f"  ratio waiting / answered:    {pinned / free:8.2f}")


if __name__ == "__main__":
    main()
