"""The chat-template sandbox as a fuzz target: a template (bytes as UTF-8 text) rendered for a
few messages must return text within the output limit or raise an Exception (the render
process answers every Exception as a refusal or a named limit); it must never run past its
CPU budget, escape the sandbox (reach a module, a file, an attribute starting with "_"), or
raise a BaseException that is not an Exception. The CPU budget is armed here the way the
render process arms it (a SIGPROF timer), never with an rlimit, which would stay on the test
process."""

from __future__ import annotations

import signal

from engine.http.template_sandbox import MAX_RENDER_BYTES, RenderLimit, render_bounded

CPU_S = 0.5  # a real template renders in milliseconds; the fuzz's own bound on one render
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi {{ 7*7 }}"},
            {"role": "assistant", "content": "49"}, {"role": "user", "content": "again"}]
# pieces that real chat templates are made of, and the hostile ones the sandbox bounds
FRAGMENTS = ("{{ ", " }}", "{% ", " %}", "{%- ", " -%}", "for m in messages", "endfor", "if ", "endif", "else",
             "m['content']", "m.role", "messages[0]", "loop.index", "bos_token", "eos_token", "add_generation_prompt",
             "range(", ")", "100000", "10", "'x'", " * ", " ** ", " + ", " ~ ", "|join", "|length", "|upper",
             "|replace('a', 'bb')", "raise_exception('no')", "set x = ", "x", "namespace(n=0)", "[", "]", ",",
             "macro f(a)", "endmacro", "f(1)", "recursive", "loop(m)", "__class__", "__globals__", "cycler",
             "lipsum", "dict", "self", "joiner", "'%s' % ", "9999999", "{# c #}", "\n", "text")


def _out_of_cpu(signum, frame) -> None:
    raise RenderLimit("cpu", f"the render used {CPU_S} s of CPU")


def chat_template(data: bytes) -> None:
    source = data.decode("utf-8", "replace")
    previous = signal.signal(signal.SIGPROF, _out_of_cpu)
    signal.setitimer(signal.ITIMER_PROF, CPU_S)
    try:
        text = render_bounded("fuzz", source, MESSAGES, "<s>", "</s>")
    except Exception:  # noqa: BLE001 - a limit, a refusal or the template's own failure: all answered
        return
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)
    if len(text.encode("utf-8", "surrogatepass")) > MAX_RENDER_BYTES:
        raise AssertionError(f"a render of {len(text):,} characters passed the output limit")


TEMPLATE_TARGETS = {"chat-template": chat_template}
