"""A chat template compiled once and rendered inside limits it cannot talk its way past.

A checkpoint's `chat_template` is code from whoever published the checkpoint, and the
messages it renders come from any client. Three limits live here, checked while the
template runs, each a RenderLimit naming the value and the limit:

- output: rendered through `generate()` and cut at MAX_RENDER_BYTES (the prompt limit);
- operators: `*`, `**`, `+` and `%` go through `call_binop`, which refuses a result larger
  than the output limit before it is built. Intercepted operators are also never folded at
  compile time (jinja2 folds constants: `'x' * 300000000` in a branch never taken cost 1.1 GB
  per compile), and neither are filters: every filter is wrapped as `pass_context`, which
  jinja2 never folds;
- range(): at most MAX_RENDER_RANGE items.

Time and memory are bounded by the process this runs in (engine/http/template_worker.py:
a CPU timer, RLIMIT_CPU and RLIMIT_AS), not here: a loop that prints nothing, or a filter
that allocates inside C, is only stopped from outside.
"""

from __future__ import annotations

import functools

from jinja2 import TemplateError, pass_context
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import _PassArg

from engine.http.openai_request import MAX_PROMPT_BYTES

MAX_RENDER_BYTES = MAX_PROMPT_BYTES  # the rendered prompt is a prompt: nothing longer could be sent
MAX_RENDER_RANGE = 100_000  # jinja2's own sandbox limit; real templates range over messages (<= 1,024)
MAX_OPERATOR_ITEMS = MAX_RENDER_BYTES  # a `*`/`+` result longer than the output limit cannot be output
MAX_POWER_BITS = 8 * MAX_RENDER_BYTES  # an integer `**` result as large as the output limit, in bits
COMPILED_KEPT = 4  # templates kept compiled: one per model path served, with room for a reload


class RenderLimit(Exception):
    """The template hit a limit: `limit` names it (output, operator, range, cpu, memory, recursion)."""

    def __init__(self, limit: str, message: str):
        super().__init__(message)
        self.limit = limit


def _sized(value) -> int | None:
    return len(value) if isinstance(value, (str, bytes, list, tuple)) else None


def _runtime_only(func):
    """`func` as a pass_context filter: called at render time with what it asked for, never
    at compile time (jinja2 does not fold a filter that needs the context)."""
    kind = _PassArg.from_obj(func)

    @pass_context
    def filter_at_runtime(context, *args, **kwargs):
        if kind is _PassArg.context:
            return func(context, *args, **kwargs)
        if kind is _PassArg.eval_context:
            return func(context.eval_ctx, *args, **kwargs)
        if kind is _PassArg.environment:
            return func(context.environment, *args, **kwargs)
        return func(*args, **kwargs)

    return filter_at_runtime


def bounded_range(*args) -> range:
    items = range(*args)
    if len(items) > MAX_RENDER_RANGE:
        raise RenderLimit("range", f"range({', '.join(map(repr, args))}) has {len(items):,} items; the limit is {MAX_RENDER_RANGE:,}")
    return items


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, with the operator, range and no-folding limits above."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self):
        super().__init__(trim_blocks=True, lstrip_blocks=True)
        self.globals["range"] = bounded_range
        self.globals["raise_exception"] = _raise_exception
        self.filters = {name: _runtime_only(f) for name, f in self.filters.items()}

    def call_binop(self, context, operator: str, left, right):
        _check_operator(operator, left, right)
        return super().call_binop(context, operator, left, right)


def _check_operator(operator: str, left, right) -> None:
    """Refuse a `*`, `+` or `**` whose result would pass its limit, before it is built."""
    size = None
    if operator == "*":
        for seq, times in ((left, right), (right, left)):
            if _sized(seq) is not None and isinstance(times, int):
                size = _sized(seq) * max(times, 0)
    elif operator == "+" and _sized(left) is not None and _sized(right) is not None:
        size = _sized(left) + _sized(right)
    if size is not None and size > MAX_OPERATOR_ITEMS:
        raise RenderLimit("operator", f"'{operator}' would build {size:,} items; the limit is {MAX_OPERATOR_ITEMS:,} "
                                      f"(the rendered prompt's byte limit)")
    if operator in ("*", "**") and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
        bits = left.bit_length() * right if operator == "**" else left.bit_length() + right.bit_length()
        if bits > MAX_POWER_BITS:
            raise RenderLimit("operator", f"'{operator}' would build an integer of about {bits:,} bits; the limit is "
                                          f"{MAX_POWER_BITS:,}")


def _raise_exception(message):
    raise TemplateError(message)


@functools.lru_cache(maxsize=COMPILED_KEPT)
def compiled(origin: str, source: str):
    """The template compiled once per (model path, template text). Raises TemplateError."""
    return BoundedEnvironment().from_string(source)


def render_bounded(origin: str, source: str, messages: list[dict], bos_token: str = "", eos_token: str = "") -> str:
    """The prompt the template writes for `messages`, cut at MAX_RENDER_BYTES. Raises RenderLimit
    (a limit above) or TemplateError (the template refused the messages, or does not compile).
    No CPU or memory bound of its own: call it in the render process."""
    template = compiled(origin, source)
    parts, size = [], 0
    for chunk in template.generate(messages=messages, add_generation_prompt=True, bos_token=bos_token,
                                   eos_token=eos_token):
        size += len(chunk.encode("utf-8", "surrogatepass"))
        if size > MAX_RENDER_BYTES:
            raise RenderLimit("output", f"the rendered prompt passed {MAX_RENDER_BYTES:,} bytes, the prompt limit")
        parts.append(chunk)
    return "".join(parts)
