"""Every Python example in README.md runs as written, alone and in order with the others.

Each ```python block is a complete program, run in a child process with a
timeout: alone, in an empty directory of its own; and all of them one after
another in one shared directory, as a reader trying them in order would (so
two examples cannot share a database file and trip on each other's rows).

A block that is not a complete program says so on its first line, visibly,
with what it needs: ``# a fragment: <context>``, where the context is one the
test knows how to supply:

* ``continues the example above``: run after the block before it, as one program;
* ``the body of "async with open_engine(...) as engine:"``: run inside that,
  on a database file of its own.

There is no other way to leave a block out: a fragment runs too, wrapped.

Where an example calls a model, it reaches a local fake OpenAI-compatible
server through the variables any user sets (``OPENAI_BASE_URL``,
``OPENAI_API_KEY``), and the test checks that the fake was called: the
example really talked to a model, not around it. ``tiktoken`` is replaced by
a stub that counts words (the real one downloads its encoding on first use),
and the test checks that the example's engine counted with it. The
PostgreSQL example reads ``DATABASE_URL``, which the test points at a fresh
schema on the test server.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import attrs
import pytest

from .conftest import postgres_schema, postgres_unreachable

README = Path(__file__).resolve().parent.parent / "README.md"
FRAGMENT = "# a fragment:"
CONTINUES = "continues the example above"
IN_AN_ENGINE = 'the body of "async with open_engine(...) as engine:"'
FENCE = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)
SUMMARY = "The user visited Porto for six days."
ANSWER = "Order 1182 left the warehouse yesterday."
#: Seconds one example may take (a child process); they take one to a few.
TIMEOUT = 180
#: Until the distribution is on PyPI, every install hint in the README installs from a clone.
PUBLISHED = False

TIKTOKEN_STUB = """
import os


class _Encoding:
    def encode_ordinary(self, text):
        with open(os.environ["TIKTOKEN_STUB_LOG"], "a", encoding="utf-8") as log:
            log.write("counted\\n")
        return text.split()


def get_encoding(name):
    assert name == "o200k_base", name
    return _Encoding()
"""


@attrs.frozen
class Block:
    index: int  # 0-based, in README order
    line: int  # where the block starts in README.md
    source: str

    @property
    def first_line(self) -> str:
        return self.source.splitlines()[0] if self.source else ""

    @property
    def context(self) -> str | None:
        """What a fragment needs (the text after ``# a fragment:``), or None for a complete program."""
        if not self.first_line.startswith(FRAGMENT):
            return None
        return self.first_line.removeprefix(FRAGMENT).strip()

    @property
    def continues(self) -> bool:
        return self.context is not None and self.context.startswith(CONTINUES)

    @property
    def in_an_engine(self) -> bool:
        return self.context is not None and self.context.startswith(IN_AN_ENGINE)


def readme_blocks() -> list[Block]:
    text = README.read_text(encoding="utf-8")
    return [
        Block(index, text.count("\n", 0, match.start()) + 1, match.group(1))
        for index, match in enumerate(FENCE.finditer(text))
    ]


BLOCKS = readme_blocks()


def program(block: Block) -> str:
    """The program that runs ``block``: itself, or the fragment wrapped in what it says it needs."""
    if block.continues:
        assert block.index > 0, f"README.md:{block.line} continues no example"
        return program(BLOCKS[block.index - 1]) + "\n" + block.source
    if block.in_an_engine:
        body = textwrap.indent(block.source, " " * 8)
        return (
            "import anyio\nfrom memengine import open_engine\n\n\nasync def main() -> None:\n"
            f"    async with open_engine('fragment-{block.index}.db') as engine:\n{body}\n\nanyio.run(main)\n"
        )
    assert block.context is None, f"README.md:{block.line}: a fragment of an unknown context: {block.first_line}"
    return block.source


def block_id(block: Block) -> str:
    return f"line{block.line}"


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


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory put first on the examples' PYTHONPATH, with the stub ``tiktoken``."""
    directory = tmp_path_factory.mktemp("stubs")
    (directory / "tiktoken.py").write_text(TIKTOKEN_STUB, encoding="utf-8")
    return directory


def run_example(block: Block, directory: Path, fake_model: str, stubs: Path, database_url: str | None) -> str:
    """Run ``block``'s program in ``directory`` (a child process); a message if it failed, else ''."""
    source = program(block)
    script = directory / f"example_{block.index}.py"
    script.write_text(source, encoding="utf-8")
    tokenizer_log = directory / f"tiktoken_{block.index}.log"
    env = {
        **os.environ,
        "OPENAI_BASE_URL": fake_model,
        "OPENAI_API_KEY": "sk-fake-for-the-readme-test",
        "OPENAI_AGENTS_DISABLE_TRACING": "1",  # the SDK would export traces to api.openai.com
        "PYTHONPATH": os.pathsep.join([str(stubs), os.environ.get("PYTHONPATH", "")]),
        "TIKTOKEN_STUB_LOG": str(tokenizer_log),
    }
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    calls_before = len(FakeModel.calls)
    try:
        result = subprocess.run(
            [sys.executable, script.name],
            capture_output=True,
            text=True,
            encoding="utf-8",
            cwd=directory,
            env=env,
            timeout=TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        return f"README.md:{block.line} did not finish within {TIMEOUT} s"
    if result.returncode != 0:
        return f"README.md:{block.line} failed (status {result.returncode}):\n{result.stderr}"
    calls = FakeModel.calls[calls_before:]
    if "OpenAISummarizer(" in source and not (
        any(call.endswith("/chat/completions") for call in calls) and SUMMARY in result.stdout
    ):
        return f"README.md:{block.line} did not summarize with the model"
    if "Runner.run" in source and not (any(call.endswith("/responses") for call in calls) and ANSWER in result.stdout):
        return f"README.md:{block.line} did not run the agent"
    if "import tiktoken" in source and not tokenizer_log.exists():
        return f"README.md:{block.line}: the engine never counted with the example's tiktoken tokenizer"
    return ""


def needs_postgres(block: Block) -> bool:
    return "DATABASE_URL" in program(block)


def test_the_readme_has_examples_and_most_are_complete_programs() -> None:
    assert len(BLOCKS) >= 8
    fragments = [block for block in BLOCKS if block.context is not None]
    assert len(fragments) <= len(BLOCKS) // 4


@pytest.mark.parametrize("block", BLOCKS, ids=block_id)
def test_a_block_is_a_complete_program_or_says_which_fragment_it_is(block: Block) -> None:
    if block.context is None:
        ast.parse(block.source, f"README.md:{block.line}")  # no top-level await: it runs as a file
    else:
        assert block.continues or block.in_an_engine, (
            f"README.md:{block.line}: '{FRAGMENT}' is followed by a context the test knows: "
            f"'{CONTINUES}' or '{IN_AN_ENGINE}'"
        )
        ast.parse(program(block), f"README.md:{block.line} (wrapped)")


@pytest.mark.parametrize("block", BLOCKS, ids=block_id)
def test_an_example_runs_alone_in_an_empty_directory(
    block: Block, fake_model: str, stubs: Path, tmp_path: Path
) -> None:
    if not needs_postgres(block):
        assert not run_example(block, tmp_path, fake_model, stubs, None)
        return
    with postgres_schema() as url:  # skipped, with the reason, when no server answers
        failure = run_example(block, tmp_path, fake_model, stubs, url)
    assert not failure, failure


def test_the_examples_run_one_after_another_in_one_directory(fake_model: str, stubs: Path, tmp_path: Path) -> None:
    """As a reader trying them in order would: no example trips on the files another one left."""
    failures = []
    with postgres_schema() if postgres_unreachable() is None else contextlib.nullcontext() as url:
        for block in BLOCKS:
            if needs_postgres(block) and url is None:
                continue
            failures.append(run_example(block, tmp_path, fake_model, stubs, url))
    failures = [failure for failure in failures if failure]
    assert not failures, "\n\n".join(failures)


# -- the README's navigation and install hints ---------------------------------------------------------

LINK = re.compile(r"\[([^\]]+)\]\(#([^)]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings() -> list[tuple[int, str]]:
    text = README.read_text(encoding="utf-8")
    outside_code = re.sub(r"^```.*?^```$", "", text, flags=re.DOTALL | re.MULTILINE)
    return [(len(m.group(1)), m.group(2)) for m in re.finditer(r"^(#{2,4}) (.+)$", outside_code, re.MULTILINE)]


def contents() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("**Contents**")
    return text[start : text.index("\n\n", start)]


def test_the_contents_at_the_top_link_every_section_and_every_link_in_the_readme_lands() -> None:
    text = README.read_text(encoding="utf-8")
    assert text.index("**Contents**") < text.index("## ")  # before the first section
    anchors = {slug(title) for _, title in headings()}
    assert [target for _, target in LINK.findall(text) if target not in anchors] == []  # every link, anywhere
    linked = {target for _, target in LINK.findall(contents())}
    assert [title for level, title in headings() if level == 2 and slug(title) not in linked] == []


def test_the_first_screen_is_what_it_is_how_to_install_and_the_smallest_program() -> None:
    text = README.read_text(encoding="utf-8")
    first_screen = "\n".join(text.splitlines()[:60])
    assert "pip install ." in first_screen
    assert "```python" in first_screen and "open_engine(" in first_screen
    sections = [title for level, title in headings() if level == 2]
    assert sections[:2] == ["Quick start", "The API at a glance"]


def test_every_install_hint_installs_what_exists() -> None:
    hints = re.findall(r"pip install ([^`;\n]*)", README.read_text(encoding="utf-8"))
    ours = [hint for hint in hints if hint.lstrip("-e ").startswith(("'.", ".")) or "memengine" in hint]
    assert ours
    if not PUBLISHED:  # from a clone: '.' or '-e .', with extras; never the name on PyPI
        assert [hint for hint in ours if not re.match(r"(-e )?'?\.(\[[\w,]+\])?'?", hint)] == []
