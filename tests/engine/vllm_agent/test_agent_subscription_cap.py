"""The vLLM agent's telemetry XPUB lives inside vLLM's scheduler process: a subscriber must not
be able to grow that process. libzmq keeps every distinct subscription in a trie (~48 bytes
per topic byte); 10,000 distinct topics of 460 bytes grew the agent's process 36 -> 245 MiB
before the cap. Past TelemetryPublisher.limit distinct topics the agent now resets its
publisher, as PageWarden's own supervisor does (the same code, engine/server/telemetry.py).

The agent runs in a child process of its own (no vLLM needed), which reports its peak RSS when
asked: VmHWM, not ru_maxrss, which a child started from this (large) test process inherits
across exec and so starts at pytest's own size. The flood comes from another child."""

from __future__ import annotations

import json
import subprocess
import sys

from engine.client.engine_client import EngineClient
from engine.client.subscriber import TelemetrySubscriber
from engine.config import REPO_ROOT
from tests.waiting import wait_for

TOPICS = 10_000
TOPIC_BYTES = 460  # under the publisher's 480-byte frame limit: every one reaches the trie

# An agent as vLLM's connector starts it, minus vLLM; one JSON line per line read on stdin.
AGENT = """
import json, sys
from engine.vllm_agent.agent_server import AgentServer
from engine.vllm_agent.checks import capacity_finding
server = AgentServer("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", num_blocks=16, block_size=32,
                     facts={"vllm_version": "0.32.0"}, capacity=capacity_finding(4096, 16, 32))
print(json.dumps({"control": server.control_endpoint, "telemetry": server.telemetry_endpoint}), flush=True)
for line in sys.stdin:
    status = dict(row.split(":", 1) for row in open("/proc/self/status").read().splitlines() if ":" in row)
    print(json.dumps({"peak_mib": int(status["VmHWM"].split()[0]) / 1024, "rss_mib": int(status["VmRSS"].split()[0]) / 1024,
                      "alive": server._thread.is_alive()}), flush=True)
server.close()
"""

# Distinct topics in rounds of 500, servicing the socket between rounds so that, like a real
# client, it reconnects and subscribes again after each reset of the publisher.
FLOOD = """
import os, sys, zmq
ctx = zmq.Context()
sub = ctx.socket(zmq.SUB)
sub.connect(sys.argv[1])
for _ in range(int(sys.argv[2]) // 500):
    for _ in range(500):
        sub.setsockopt(zmq.SUBSCRIBE, os.urandom(int(sys.argv[3]) // 2).hex().encode())
    sub.poll(100)
sub.close(linger=0)
ctx.term()
"""


def ask(agent: subprocess.Popen) -> dict:
    agent.stdin.write("report\n")
    agent.stdin.flush()
    return json.loads(agent.stdout.readline())


def test_distinct_topics_past_the_cap_reset_the_publisher_and_do_not_grow_vllm():
    agent = subprocess.Popen([sys.executable, "-c", AGENT], cwd=REPO_ROOT, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        endpoints = json.loads(agent.stdout.readline())
        with EngineClient(endpoints["control"]) as client:
            honest = TelemetrySubscriber(endpoints["telemetry"], ("metrics",))
            try:
                wait_for(lambda: client.status()["telemetry"]["subscription_count"] == 1, 60,
                         "the honest subscription to reach the agent")
                before = ask(agent)["peak_mib"]
                flood = subprocess.run([sys.executable, "-c", FLOOD, endpoints["telemetry"], str(TOPICS),
                                        str(TOPIC_BYTES)], check=False, timeout=300)
                assert flood.returncode == 0
                # the flooder is gone: once its unsubscriptions are read, every subscription was
                wait_for(lambda: client.status()["telemetry"]["subscription_count"] <= 1, 120,
                         "the agent to read the flood and the flooder's leaving")
                report = ask(agent)
                telemetry = client.status()["telemetry"]
                grown = report["peak_mib"] - before
                bomb_mib = TOPICS * TOPIC_BYTES / 2**20
                print(f"agent peak {before:.1f} -> {report['peak_mib']:.1f} MiB ({bomb_mib:.1f} MiB of topics); "
                      f"telemetry {telemetry}")
                # uncapped, the trie costs ~48 bytes per topic byte: +212 MiB for this flood (measured).
                # Capped, it holds the limit plus what libzmq read ahead (~1,000 topics) until the
                # reset: +22..33 MiB measured, whatever the flood's size.
                assert grown < 64, f"the agent's process grew {grown:.0f} MiB for {bomb_mib:.1f} MiB of topics"
                assert telemetry["refused_subscriptions"] > 0 and telemetry["publisher_resets"] >= 1, telemetry
                assert telemetry["subscription_limit"] == 256
                alerts = [a for a in client.status()["alerts"] if a["kind"] == "telemetry_subscriptions_capped"]
                assert alerts and alerts[0]["severity"] == "warning" and "256" in alerts[0]["detail"], alerts
                assert report["alive"], "the agent's thread ended"
                # the honest subscriber reconnected and subscribed again by itself
                wait_for(lambda: (msg := honest.recv(timeout_s=1)) is not None and msg.topic == "metrics", 60,
                         "metrics to reach the honest subscriber again")
            finally:
                honest.close()
    finally:
        agent.stdin.close()  # the agent's cue to close and exit
        agent.wait(timeout=30)
        agent.stdout.close()
