"""The offline token estimate: its speed on each kind of text, its growth, its error.

For each kind of text in ``tests/token_samples`` (repeated to about 2 MB), the
best of five runs of :func:`memengine.tokens.estimate_tokens`, in MB of UTF-8
per second, beside the naive ``len(text) / 4`` (which costs nothing: its
column is its error against ``o200k_base``, beside the estimate's). Then the
time of one 1,400-character message, and the growth on ``a+a+...`` (the input
that made the old regular expression quadratic) at 250K, 1M and 4M
characters: linear means a constant time per million characters.

With ``--accuracy``, the error of the estimate (and of ``len(text) / 4``)
against the counts recorded from ``o200k_base`` and ``cl100k_base``, in total
per kind and per message (median, 5th and 95th percentile).

Run: ``.venv/bin/python benchmarks/tokens.py [--accuracy]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.token_samples

from memengine.tokens import estimate_tokens
from tests.token_samples import SAMPLE_FILES, messages, references

SIZE = 2_000_000


def naive(text: str) -> int:
    return max(1, round(len(text) / 4)) if text else 0


def best_of(runs: int, work: Callable[[], object]) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def error(estimated: int, real: int) -> str:
    return f"{estimated / real - 1:+.1%}"


def speed() -> None:
    recorded = references()
    print(f"{'kind':<14}{'MB/s':>8}{'Mchar/s':>9}   error vs o200k: estimate  len/4")
    for kind in SAMPLE_FILES:
        parts = messages(kind)
        sample = "\n\n".join(parts)
        text = sample * (SIZE // len(sample.encode()) + 1)
        seconds = best_of(5, lambda text=text: estimate_tokens(text))  # type: ignore[misc]
        real = sum(recorded[kind]["o200k_base"])
        print(
            f"{kind:<14}{len(text.encode()) / seconds / 1e6:>8.0f}{len(text) / seconds / 1e6:>9.0f}"
            f"   {error(sum(map(estimate_tokens, parts)), real):>24}  {error(sum(map(naive, parts)), real):>5}"
        )
    message = " ".join(messages("conversation"))[:1400]
    per_call = best_of(5, lambda: [estimate_tokens(message) for _ in range(1000)]) / 1000
    print(f"one 1,400-character message (conversation turns): {per_call * 1e6:.1f} us")
    print("a+a+... (linear: the same time per million characters)")
    for chars in (250_000, 1_000_000, 4_000_000):
        text = "a+" * (chars // 2)
        seconds = best_of(3, lambda text=text: estimate_tokens(text))  # type: ignore[misc]
        print(f"  {chars:>9,} chars: {seconds * 1e3:8.1f} ms, {seconds / (chars / 1e6) * 1e3:6.1f} ms per M chars")


def accuracy() -> None:
    recorded = references()
    print("error against the recorded counts (positive: counts more); per message over o200k_base")
    print(f"{'kind':<14}{'msgs':>5}{'o200k':>8}{'cl100k':>8}{'median':>8}{'p5':>8}{'p95':>8}   len/4 vs o200k")
    for kind in SAMPLE_FILES:
        parts = messages(kind)
        estimated = [estimate_tokens(text) for text in parts]
        o200k, cl100k = recorded[kind]["o200k_base"], recorded[kind]["cl100k_base"]
        relative = sorted(estimate / real - 1 for estimate, real in zip(estimated, o200k, strict=True))
        p5, p95 = relative[int(len(relative) * 0.05)], relative[min(len(relative) - 1, int(len(relative) * 0.95))]
        print(
            f"{kind:<14}{len(parts):>5}{error(sum(estimated), sum(o200k)):>8}{error(sum(estimated), sum(cl100k)):>8}"
            f"{statistics.median(relative):>+8.1%}{p5:>+8.1%}{p95:>+8.1%}   {error(sum(map(naive, parts)), sum(o200k))}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--accuracy", action="store_true", help="print the error against the recorded counts")
    if parser.parse_args().accuracy:
        accuracy()
    else:
        speed()


if __name__ == "__main__":
    main()
