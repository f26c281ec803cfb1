"""Does the model choose to call a tool under ``tool_choice="auto"``?

The grammar makes every call well-formed, but under ``"auto"`` whether to call at all is the
model's choice. This asks a fixed set of requests with four tools bound (``ChatRagSpec.bind_tools``,
greedy): six that a bound tool answers and six that no tool fits. It prints, for each request,
what the model did, and the counts: requests that needed a tool and got a call of the right tool,
requests that needed none and got text. Run it on any chat model ragspec loads, e.g. a larger
instruct model saved locally, to see whether agents built on it can work under ``"auto"``.

    python benchmarks/tool_choice_eval.py [--model default] [--backend auto] [--tool-choice auto|any] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langchain_core.messages import HumanMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402

from ragspec.lc import ChatRagSpec  # noqa: E402


@tool
def get_weather(location: str) -> str:
    """Get the weather at a location."""
    return "sunny"


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def get_stock_price(symbol: str) -> float:
    """Get the current stock price of a company by its ticker symbol."""
    return 1.0


@tool
def send_email(to: str, body: str) -> str:
    """Send an email to an address."""
    return "sent"


TOOLS = [get_weather, add, get_stock_price, send_email]
NEEDS_TOOL = {
    "What is the weather in San Francisco, CA?": "get_weather",
    "What's the weather like in Paris today?": "get_weather",
    "What is 3 + 4? Use the add function.": "add",
    "Add 12 and 30.": "add",
    "What is the stock price of AAPL?": "get_stock_price",
    "Send an email to bob@example.com saying hi.": "send_email",
}
NO_TOOL = [
    "Tell me a joke about cats.",
    "What is the capital of France?",
    "Hi, how are you?",
    "Write a haiku about the sea.",
    "Who wrote Hamlet?",
    "Explain what photosynthesis is.",
]


def evaluate(model: ChatRagSpec, tool_choice: str = "auto") -> dict:
    llm = model.bind_tools(TOOLS, tool_choice=tool_choice)
    rows = []
    for request in [*NEEDS_TOOL, *NO_TOOL]:
        message = llm.invoke([HumanMessage(request)])
        called = [c["name"] for c in message.tool_calls]
        expected = NEEDS_TOOL.get(request)
        right = called[:1] == [expected] if expected else not called and not message.invalid_tool_calls
        rows.append({"request": request, "expected": expected, "calls": message.tool_calls,
                     "text": message.content if isinstance(message.content, str) else str(message.content),
                     "unfinished_call": [c["args"] for c in message.invalid_tool_calls],
                     "right": right})
    return {
        "tool_requests_with_the_right_call": sum(r["right"] for r in rows if r["expected"]),
        "tool_requests": len(NEEDS_TOOL),
        "other_requests_answered_in_text": sum(r["right"] for r in rows if not r["expected"]),
        "other_requests": len(NO_TOOL),
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default", help="a model name or path ragspec loads")
    parser.add_argument("--backend", default="auto", help="torch, llamacpp or auto")
    parser.add_argument("--max-tokens", type=int, default=64, help="new tokens per answer (room for one call)")
    parser.add_argument("--tool-choice", default="auto", choices=("auto", "any"),
                        help="'any' forces a call: then only which tool and which values are the model's")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args()
    result = evaluate(ChatRagSpec(model=args.model, backend=args.backend, max_tokens=args.max_tokens), args.tool_choice)
    for row in result["rows"]:
        did = "; ".join(f"{c['name']}({json.dumps(c['args'])})" for c in row["calls"]) or (
            f"unfinished call {row['unfinished_call'][0][:60]!r}" if row["unfinished_call"] else repr(row["text"][:60]))
        print(f"{'ok ' if row['right'] else 'BAD'} {row['request']!r:50} -> {did}")
    print(f"needs a tool: {result['tool_requests_with_the_right_call']}/{result['tool_requests']} called the right tool; "
          f"needs none: {result['other_requests_answered_in_text']}/{result['other_requests']} answered in text")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
