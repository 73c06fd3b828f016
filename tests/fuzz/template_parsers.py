"""The chat-template sandbox as a fuzz target, rendered where serving renders it: in a render
process (engine/http/template_renderer.py), with its CPU timer, RLIMIT_CPU, RLIMIT_AS and
recursion limit. A template (bytes as UTF-8 text) rendered for a few messages must come back
as text within the output limit, or as a 400: a named limit or a refusal (the template raised,
did not compile, or reached for something the sandbox keeps from it). A 500 (a render process
that died another way) or a 503 (one that said nothing for its wall-clock bound) is a finding.

The render processes and their event loop live for the whole run, as a server's do; `close()`
ends them (the tests' module fixture, bench/fuzz.py at exit)."""

from __future__ import annotations

import asyncio

from engine.http.chat import ChatTemplate
from engine.http.openai_request import HttpError
from engine.http.template_sandbox import MAX_RENDER_BYTES
from engine.http.template_renderer import TemplateRenderer

CPU_S = 0.5  # a real template renders in milliseconds; the fuzz's own bound on one render
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi {{ 7*7 }}"},
            {"role": "assistant", "content": "49"}, {"role": "user", "content": "again"}]
# pieces that real chat templates are made of, and the hostile ones the sandbox bounds
FRAGMENTS = ("{{ ", " }}", "{% ", " %}", "{%- ", " -%}", "for m in messages", "endfor", "if ", "endif", "else",
             "m['content']", "m.role", "messages[0]", "loop.index", "bos_token", "eos_token", "add_generation_prompt",
             "range(", ")", "100000", "10", "'x'", " * ", " ** ", " + ", " ~ ", "|join", "|length", "|upper",
             "|replace('a', 'bb')", "raise_exception('no')", "set x = ", "x", "namespace(n=0)", "[", "]", ",",
             "macro f(a)", "endmacro", "f(1)", "recursive", "loop(m)", "__class__", "__globals__", "cycler",
             "lipsum", "dict", "self", "joiner", "'%s' % ", "9999999", "{# c #}", "\n", "text", "|sort",
             "|center(", "|wordwrap(", "|batch(", "|list", "x|attr('__init__')", "''.__class__.__mro__")
_state: dict = {}


def _renderer() -> tuple[asyncio.AbstractEventLoop, TemplateRenderer]:
    if "renderer" not in _state:
        _state["loop"] = asyncio.new_event_loop()
        _state["renderer"] = TemplateRenderer(cpu_s=CPU_S)
    return _state["loop"], _state["renderer"]


def chat_template(data: bytes) -> None:
    loop, renderer = _renderer()
    template = ChatTemplate(source=data.decode("utf-8", "replace"), origin="fuzz", bos_token="<s>", eos_token="</s>")
    try:
        text = loop.run_until_complete(renderer.render(template, MESSAGES))
    except HttpError as exc:
        if exc.status != 400:
            raise AssertionError(f"a render answered {exc.status} ({exc.code}): {exc}") from None
        return
    if len(text.encode("utf-8", "surrogatepass")) > MAX_RENDER_BYTES:
        raise AssertionError(f"a render of {len(text):,} characters passed the output limit")


def close() -> None:
    if "renderer" in _state:
        loop, renderer = _state.pop("loop"), _state.pop("renderer")
        loop.run_until_complete(renderer.close())
        loop.close()


TEMPLATE_TARGETS = {"chat-template": chat_template}
