"""DemoLoad: prompts in the default model's copy form, each with its own ticket, within the window."""

from __future__ import annotations

from engine.guard.canaries import PROMPT_FORM
from gui.demo_load import DemoLoad


def test_demo_requests_ask_to_repeat_their_own_ticket_and_fit_the_window():
    demo = DemoLoad(context_window=512, seed=3)
    head, tail = PROMPT_FORM.split("{text}")
    tickets = set()
    for _ in range(200):
        fields = demo.next_request()
        prompt = fields["prompt"]
        assert prompt.startswith(head) and prompt.endswith(tail)
        text = prompt[len(head):len(prompt) - len(tail)]
        assert len(text) <= 256 and " ticket " in text
        tickets.add(text.split(" ticket ")[1][:12])
        assert len(prompt.encode()) + 1 + fields["max_new_tokens"] <= 512 or fields["max_new_tokens"] == 8
    assert len(tickets) == 200 and demo.sent == 200
