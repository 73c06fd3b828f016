"""TemplateRenderer's own limit paths, on real render processes (no server around them): a
render stuck inside one C call is ended by RLIMIT_CPU and answered as a 400; a render that
says nothing past its wall-clock bound, too many waiting renders, and a render process that
dies are 503s and a 500, each naming what happened; after each, the next render is served
by a fresh process. The hostile templates through a whole server: test_http_hostile.py."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from engine.http.chat import ChatTemplate
from engine.http.openai_request import HttpError
from engine.http.template_renderer import TemplateRenderer

SPIN = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
# One C call: sorting 100,000 references to two equal 4 MB strings (each comparison a 4 MB
# memcmp inside list.sort, which runs no signal handler; tens of seconds of CPU); every
# operator in it is inside its limit. The CPU timer's handler cannot run until the sort
# returns, so only RLIMIT_CPU ends it.
ONE_C_CALL = ("{% set a = 'x' * 4000000 %}{% set b = 'x' * 3999999 + 'x' %}"
              "{{ ([a, b] * 50000)|sort(case_sensitive=true)|length }}")
HELLO = [{"role": "user", "content": "hello"}]


def template(source: str) -> ChatTemplate:
    return ChatTemplate(source=source, origin="test", eos_token="</s>")


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def run(loop, coro):
    return loop.run_until_complete(coro)


def render_error(loop, renderer, source: str) -> HttpError:
    with pytest.raises(HttpError) as caught:
        run(loop, renderer.render(template(source), HELLO))
    return caught.value


def test_a_render_stuck_in_one_c_call_is_ended_by_rlimit_cpu_and_is_a_400(loop):
    renderer = TemplateRenderer(processes=1, cpu_s=0.2)
    try:
        assert run(loop, renderer.render(template("{{ messages[0].content }}"), HELLO)) == "hello"
        [first] = renderer.pids()
        error = render_error(loop, renderer, ONE_C_CALL)
        assert error.status == 400 and error.code == "chat_template_limit" and error.param == "messages"
        assert "hit its cpu limit" in str(error) and "more than 0.2 s of CPU" in str(error), str(error)
        assert renderer.counts["killed"] == 1 and renderer.counts["limited"] == 1
        assert not os.path.exists(f"/proc/{first}") or first not in renderer.pids()
        # the next render starts a fresh process, and is served
        assert run(loop, renderer.render(template("{{ messages[0].content }}!"), HELLO)) == "hello!"
        assert renderer.pids() and renderer.pids() != [first]
    finally:
        run(loop, renderer.close())


def test_a_render_silent_past_its_wall_clock_bound_is_a_503_and_its_process_goes(loop):
    renderer = TemplateRenderer(processes=1, cpu_s=3600)
    renderer.wall_s = 1.0  # the constructor keeps it >= 60 s; a starved render is what is simulated
    try:
        error = render_error(loop, renderer, SPIN)
        assert error.status == 503 and error.code == "render_timeout", str(error)
        assert "answered nothing within 1 s" in str(error)
        assert renderer.counts["killed"] == 1 and renderer.pids() == []
        assert run(loop, renderer.render(template("{{ messages[0].role }}"), HELLO)) == "user"
    finally:
        run(loop, renderer.close())


def test_past_max_waiting_renders_a_chat_is_a_503_naming_the_limit(loop):
    renderer = TemplateRenderer(processes=1, cpu_s=3600, max_waiting=1)

    async def scenario():
        busy = asyncio.ensure_future(renderer.render(template(SPIN), HELLO))  # holds the only process
        while not renderer.pids():
            await asyncio.sleep(0.01)
        queued = asyncio.ensure_future(renderer.render(template("{{ 1 }}"), HELLO))  # waits for it
        while renderer.waiting < 1:
            await asyncio.sleep(0.01)
        with pytest.raises(HttpError) as caught:
            await renderer.render(template("{{ 2 }}"), HELLO)
        busy.cancel()  # its client hangs up: its process is killed, and the queued one is served
        answered = await queued
        with pytest.raises(asyncio.CancelledError):
            await busy
        return caught.value, answered

    try:
        error, answered = run(loop, scenario())
        assert error.status == 503 and error.code == "render_busy"
        assert "1 chat requests are waiting for a template render already; the limit is 1" in str(error)
        assert answered == "1" and renderer.counts["busy"] == 1 and renderer.counts["killed"] == 1
    finally:
        run(loop, renderer.close())


def test_a_render_process_killed_from_outside_is_a_500_and_the_next_render_is_served(loop):
    renderer = TemplateRenderer(processes=1, cpu_s=3600)

    async def scenario():
        spinning = asyncio.ensure_future(renderer.render(template(SPIN), HELLO))
        while not renderer.pids():
            await asyncio.sleep(0.01)
        os.kill(renderer.pids()[0], signal.SIGKILL)
        with pytest.raises(HttpError) as caught:
            await spinning
        return caught.value

    try:
        error = run(loop, scenario())
        assert error.status == 500 and "render process ended (signal SIGKILL)" in str(error)
        assert run(loop, renderer.render(template("{{ messages|length }}"), HELLO)) == "1"
    finally:
        run(loop, renderer.close())
