"""The OpenAI-compatible HTTP frontend (`serve --http-port N`): /v1/completions, /v1/models.

options.py holds the command-line flags and the loopback rule (no aiohttp import, so
`--help` stays fast); frontend.py runs the aiohttp server in a thread of `serve`;
completions.py has the routes; engine_link.py the asyncio DEALER to the supervisor.
chat.py reads chat bodies and the checkpoint's template; template_renderer.py renders it in
render processes (template_worker.py), inside template_sandbox.py's limits, never on the loop.
"""
