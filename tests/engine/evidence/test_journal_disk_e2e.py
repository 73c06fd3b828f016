"""A journal on a disk that fills up, or turns read-only, raises journal_failing and the engine
goes on serving (a real server in a private mount namespace with a tiny tmpfs of its own)."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from engine.client.local_server import LocalServer, write_config

pytestmark = pytest.mark.e2e


def _can_mount_tmpfs(where) -> str | None:
    if not shutil.which("unshare"):
        return "no unshare(1) here"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=64k none {where}"],
                           capture_output=True, text=True)
    return None if probe.returncode == 0 else f"cannot mount a private tmpfs here: {probe.stderr.strip()}"


def _server(tmp_path, disk, size: str, *, read_only: bool = False) -> LocalServer:
    why = _can_mount_tmpfs(disk)
    if why:
        pytest.skip(why)
    config = write_config(tmp_path / "config.toml", audit={"journal": str(disk / "evidence.sqlite")})
    # the file is there (an earlier run wrote it), then the disk turns read-only
    ro = f" && touch {disk}/evidence.sqlite && mount -o remount,ro {disk}" if read_only else ""

    def wrap(command):  # serve on a disk of `size`, in a mount namespace of its own
        return ["unshare", "-m", "sh", "-c", f'mount -t tmpfs -o size={size} none {disk}{ro} && exec "$@"', "sh",
                *command]

    server = LocalServer(config, wrap=wrap)
    server.wait_workers(server.client())
    return server


def _journal_alert(client, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        status = client.status()
        alerts = [a for a in status["alerts"] if a["kind"] == "journal_failing" and a["state"] == "firing"]
        if alerts:
            return {"alert": alerts[0], "evidence": status["evidence"]}
        assert time.monotonic() < deadline, status["evidence"]
        client.generate([256, *range(1, 200)], max_new_tokens=4, ignore_eos=True, tenant="acme")


def test_a_full_disk_raises_journal_failing_and_serving_goes_on(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    server = _server(tmp_path, disk, "200k")
    try:
        client = server.client()
        seen = _journal_alert(client)
        assert "full" in seen["alert"]["detail"], seen["alert"]["detail"]
        assert seen["evidence"]["lost"] > 0 and "full" in seen["evidence"]["error"]
        done = client.generate([256, 1, 2, 3], max_new_tokens=3, ignore_eos=True)
        assert len(done["token_ids"]) == 3  # serving went on
    finally:
        server.stop()


def test_a_read_only_journal_raises_journal_failing_and_serving_goes_on(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    server = _server(tmp_path, disk, "64m", read_only=True)
    try:
        client = server.client()
        seen = _journal_alert(client)
        assert "read" in seen["alert"]["detail"].lower() and "could not be opened" in seen["alert"]["detail"]
        assert seen["evidence"]["journal"] is None and "read" in seen["evidence"]["error"].lower()
        assert len(client.generate([256, 1, 2, 3], max_new_tokens=3, ignore_eos=True)["token_ids"]) == 3
    finally:
        server.stop()
