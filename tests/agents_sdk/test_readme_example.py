"""The README's Agents SDK example runs as printed, with a scripted model in place of the real one."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import anyio
import pytest
from agents.testing import ScriptedModel, assistant_message, function_call

README = Path(__file__).parents[2] / "README.md"

pytestmark = pytest.mark.anyio


def _example() -> str:
    section = README.read_text(encoding="utf-8").split("### OpenAI Agents SDK", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


async def test_the_readme_example_runs_and_remembers_the_first_turn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _example()
    assert 'model="gpt-4.1-mini"' in code and "asyncio.run(main())" in code
    model = ScriptedModel()
    model.extend(
        [
            [function_call("order_status", {"order_id": "1182"}, call_id="call_1")],
            [assistant_message("It left the warehouse yesterday.", item_id="msg_1")],
            [assistant_message("Order 1182.", item_id="msg_2")],
        ]
    )
    code = code.replace('model="gpt-4.1-mini"', "model=scripted_model")
    database = re.search(r'open_engine\("([^"]+)"', code).group(1)  # the example's own file, kept in tmp_path
    code = code.replace(f'"{database}"', repr(str(tmp_path / database)))

    def run() -> None:  # asyncio.run needs a thread without a running loop
        try:
            exec(compile(code, "README.md", "exec"), {"__name__": "readme", "scripted_model": model})
        finally:
            asyncio.set_event_loop(None)

    await anyio.to_thread.run_sync(run)
    assert capsys.readouterr().out == "It left the warehouse yesterday.\nOrder 1182.\n"
    second_question = [item.get("content") for item in model.calls[-1].input if item.get("role") == "user"]
    assert second_question == ["Where is order 1182?", "Which order did I ask about?"]
    assert [item.get("output") for item in model.calls[-1].input if item.get("type") == "function_call_output"] == [
        "Order 1182 left the warehouse yesterday."
    ]
    assert (tmp_path / database).exists()
