"""POST /v1/chat/completions (issue 16, part 5) on a real `serve --http-port 0`, asked with
the official `openai` client (it got a 404 before), whole and streamed; the prompt is the
chat template's rendering, so the same prompt through /v1/completions gives the same text."""

from __future__ import annotations

import json

import pytest

from engine.client.local_server import LocalServer as ServerProcess
from engine.client.local_server import write_config
from engine.http.chat import DEFAULT_TEMPLATE, load_template, parse_chat
from engine.http.openai_request import HttpError
from engine.http.template_sandbox import render_bounded
from tests.engine.http.test_http_completions import post

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.e2e  # real engine processes

MESSAGES = [{"role": "system", "content": "Copy exactly."},
            {"role": "user", "content": [{"type": "text", "text": "Invoice 2026-11-04: "},
                                         {"type": "text", "text": "ACME Corp owes $4,120.50"}]}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    config = write_config(tmp_path_factory.mktemp("chat") / "config.toml", engine={"context_window": 512},
                          pools={"prefill": {"pages": 64}, "decode": {"pages": 128}}, canaries={"enabled": False})
    server = ServerProcess(config, "--http-port", "0")
    server.wait_workers(server.client())
    yield server
    server.stop()


def client_of(server):
    return openai.OpenAI(base_url=server.ready["http"] + "/v1", api_key="unused", timeout=180, max_retries=0)


def render(t, messages):
    return render_bounded(t.origin, t.source, messages, t.bos_token, t.eos_token)


def test_the_default_template_and_a_checkpoint_template(tmp_path):
    from jinja2 import TemplateError

    t = load_template(tmp_path)  # no tokenizer_config.json
    assert t.origin == "default" and t.source == DEFAULT_TEMPLATE
    assert render(t, [{"role": "user", "content": "hi"}]) == "<|user|>\nhi\n<|assistant|>\n"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": {"content": "</s>"}, "bos_token": "<s>",
        "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}"
                         "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"}))
    t = load_template(tmp_path)
    assert t.origin.endswith("tokenizer_config.json")
    assert render(t, [{"role": "user", "content": "hi"}]) == "<s>[user]hi</s>[assistant]"
    strict = "{% if messages[0].role != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    with pytest.raises(TemplateError, match="user first"):
        render_bounded("x", strict, [{"role": "system", "content": "s"}])
    # the sandbox: a template cannot reach Python's internals
    with pytest.raises(TemplateError):
        render_bounded("evil", "{{ messages.__class__.__mro__[1].__subclasses__() }}", [{"role": "user", "content": "x"}])


@pytest.mark.parametrize("body, message", [
    ({}, "'messages' is required"),
    ({"messages": []}, "'messages' is required"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "text only"),
    ({"messages": [{"role": "user", "content": "x"}], "prompt": "y"}, "not a chat field"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "max_completion_tokens": 4},
     "differs from max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": 9}, "'temperature' = 9"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "'n' = 2 is invalid: not supported by this engine: "
                                                              "only 1 is served"),
    ({"messages": [{"role": "user", "content": "x"}], "n": True}, "'n' = True is invalid"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "'tools' is not supported"),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "auto"}, "'tool_choice' is not supported"),
    ({"messages": [{"role": "user", "content": "x"}], "echo": False}, "unknown field 'echo'"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": True}, "'logprobs' = True is invalid"),
    ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}},
     "no structured output"),
    ({"messages": [{"role": "user", "content": "\ud800"}]}, "'messages[0].content' is not valid Unicode"),
])
def test_bad_chat_bodies_name_the_field(body, message):
    with pytest.raises(HttpError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_chat(body)


def test_the_neutral_chat_fields_clients_send_are_accepted():
    chat = parse_chat({"messages": [{"role": "user", "content": "x"}], "n": 1, "logprobs": False, "top_logprobs": None,
                       "response_format": {"type": "text"}, "user": "u", "seed": 1, "logit_bias": {},
                       "presence_penalty": 0, "frequency_penalty": 0.0, "tools": None, "stream_options": None,
                       "max_completion_tokens": 5})
    assert chat.messages == [{"role": "user", "content": "x"}]
    req = chat.completion("rendered")
    assert req.prompt == "rendered" and req.max_tokens == 5 and req.user == "u" and req.seed == 1


def test_the_official_client_whole_and_streamed(server):
    client = client_of(server)
    model = client.models.list().data[0].id
    whole = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=24, temperature=0)
    text = whole.choices[0].message.content
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    assert whole.usage.completion_tokens > 0 and whole.choices[0].finish_reason in ("stop", "length")

    pieces, roles, reasons = [], [], []
    for chunk in client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=24, temperature=0,
                                                stream=True):
        assert chunk.object == "chat.completion.chunk"
        delta = chunk.choices[0].delta
        roles += [delta.role] if delta.role else []
        pieces.append(delta.content or "")
        reasons += [chunk.choices[0].finish_reason] if chunk.choices[0].finish_reason else []
    assert "".join(pieces) == text and roles == ["assistant"] and reasons == [whole.choices[0].finish_reason]

    # the prompt is the template's rendering: the same prompt through /v1/completions agrees
    prompt = render_bounded("default", DEFAULT_TEMPLATE, [
        {"role": "system", "content": "Copy exactly."},
        {"role": "user", "content": "Invoice 2026-11-04: ACME Corp owes $4,120.50"}], "", "</s>")
    status, plain = post(server, {"prompt": prompt, "max_tokens": 24, "temperature": 0})
    assert status == 200 and plain["choices"][0]["text"] == text


def test_bad_chat_input_is_a_400_and_the_server_keeps_serving(server):
    status, body = post(server, {"messages": [{"role": "user"}], "max_tokens": 100_000_000},
                        path="/v1/chat/completions")
    assert status == 400 and "max_tokens" in body["error"]["message"]
    status, body = post(server, {"messages": "hello"}, path="/v1/chat/completions")
    assert status == 400 and body["error"]["param"] == "messages"
    client = client_of(server)
    with pytest.raises(openai.BadRequestError, match="exceeds|window|context"):
        client.chat.completions.create(model=client.models.list().data[0].id,
                                       messages=[{"role": "user", "content": "x" * 2_000}], max_tokens=8)
    status, body = post(server, {"messages": [{"role": "user", "content": "ok"}], "max_tokens": 2},
                        path="/v1/chat/completions")
    assert status == 200 and body["choices"][0]["message"]["role"] == "assistant"
