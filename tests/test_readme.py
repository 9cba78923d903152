"""Every Python example in README.md runs as written.

Each ```python block is run as a program of its own, in a child process with
a timeout, in an empty directory. A block whose first line is
``# continues the example above`` runs after the block before it, as one
program. A block that cannot run here says so on its first line, visibly:
``# not run by the tests: <why>``; it is still compiled (top-level ``await``
allowed), so its syntax cannot drift either. There is no other way to leave
a block out.

Where an example calls a model, it reaches a local fake OpenAI-compatible
server through the variables any user sets (``OPENAI_BASE_URL``,
``OPENAI_API_KEY``), and the test checks that the fake was called: the
example really talked to a model, not around it.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import attrs
import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
NOT_RUN = "# not run by the tests:"
CONTINUES = "# continues the example above"
FENCE = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)
SUMMARY = "The user visited Porto for six days."
ANSWER = "Order 1182 left the warehouse yesterday."


@attrs.frozen
class Block:
    line: int  # where the block starts in README.md
    source: str

    @property
    def first_line(self) -> str:
        return self.source.splitlines()[0] if self.source else ""

    @property
    def not_run(self) -> bool:
        return self.first_line.startswith(NOT_RUN)

    @property
    def continues(self) -> bool:
        return self.first_line.startswith(CONTINUES)


def readme_blocks() -> list[Block]:
    text = README.read_text(encoding="utf-8")
    return [Block(text.count("\n", 0, match.start()) + 1, match.group(1)) for match in FENCE.finditer(text)]


BLOCKS = readme_blocks()


def program(block: Block) -> str:
    """The block's source, after the block it continues."""
    index = BLOCKS.index(block)
    if not block.continues:
        return block.source
    assert index > 0 and not BLOCKS[index - 1].not_run, f"README.md:{block.line} continues no runnable example"
    return program(BLOCKS[index - 1]) + "\n" + block.source


# -- a fake OpenAI-compatible endpoint -------------------------------------------


class FakeModel(BaseHTTPRequestHandler):
    """Answers chat completions with a fixed summary, and responses with a fixed answer."""

    calls: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        json.loads(body or b"{}")
        FakeModel.calls.append(self.path)
        if self.path.endswith("/chat/completions"):
            reply = {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": "fake",
                "choices": [
                    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": SUMMARY}}
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        elif self.path.endswith("/responses"):
            reply = {
                "id": "resp_1",
                "object": "response",
                "created_at": 0,
                "model": "fake",
                "status": "completed",
                "output": [
                    {
                        "type": "message",
                        "id": "msg_1",
                        "status": "completed",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": ANSWER, "annotations": []}],
                    }
                ],
                "parallel_tool_calls": True,
                "tool_choice": "auto",
                "tools": [],
                "usage": {
                    "input_tokens": 1,
                    "output_tokens": 1,
                    "total_tokens": 2,
                    "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens_details": {"reasoning_tokens": 0},
                },
            }
        else:
            self.send_error(404)
            return
        payload = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def fake_model() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeModel)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


# -- the tests -------------------------------------------------------------------


def test_the_readme_has_examples_and_runs_most_of_them() -> None:
    assert len(BLOCKS) >= 8
    skipped = [block for block in BLOCKS if block.not_run]
    assert len(skipped) <= len(BLOCKS) // 2


@pytest.mark.parametrize("block", [block for block in BLOCKS if block.not_run], ids=lambda block: f"line{block.line}")
def test_an_example_not_run_says_why_and_compiles(block: Block) -> None:
    reason = block.first_line.removeprefix(NOT_RUN).strip()
    assert len(reason) >= 10, f"README.md:{block.line}: say why the example is not run"
    compile(block.source, f"README.md:{block.line}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


@pytest.mark.parametrize(
    "block", [block for block in BLOCKS if not block.not_run], ids=lambda block: f"line{block.line}"
)
def test_an_example_runs_as_written(block: Block, fake_model: str, tmp_path: Path) -> None:
    source = program(block)
    (tmp_path / "example.py").write_text(source, encoding="utf-8")
    env = {
        **os.environ,
        "OPENAI_BASE_URL": fake_model,
        "OPENAI_API_KEY": "sk-fake-for-the-readme-test",
        "OPENAI_AGENTS_DISABLE_TRACING": "1",  # the SDK would export traces to api.openai.com
    }
    calls_before = len(FakeModel.calls)

    result = subprocess.run(
        [sys.executable, "example.py"],
        capture_output=True,
        text=True,
        encoding="utf-8",
        cwd=tmp_path,
        env=env,
        timeout=120,
    )

    assert result.returncode == 0, f"README.md:{block.line} failed:\n{result.stderr}"
    calls = FakeModel.calls[calls_before:]
    if "OpenAISummarizer(" in source:
        assert any(call.endswith("/chat/completions") for call in calls)
        assert SUMMARY in result.stdout
    if "Runner.run" in source:
        assert any(call.endswith("/responses") for call in calls)
        assert ANSWER in result.stdout
