"""The chat-template render process: `python -m engine.http.template_worker PARENT_PID`.

The HTTP frontend runs in a thread of the supervisor; a template rendered there held every
HTTP route while it ran and grew the supervisor without bound (two nested range loops:
~100 MB/s until the OOM killer came). Here it runs in a process of its own, one render at a
time, bounded from outside the template: a CPU timer (the request's `cpu_s`) that ends the
render with a clean answer, RLIMIT_CPU just past it for a render stuck inside one C call
(the kernel ends the process: the parent answers for it), RLIMIT_AS for memory, and a
recursion limit. It dies with the HTTP thread that started it.

Requests on stdin, answers on stdout: a 4-byte big-endian length, then a msgpack map.
Request: origin, source, bos_token, eos_token, messages, cpu_s. Answer: {"text"} or
{"limit", "message"} (a limit was hit) or {"refused"} (the template raised, or did not compile).
"""

from __future__ import annotations

import resource
import signal
import struct
import sys

import msgpack

FRAME = struct.Struct(">I")
MAX_RENDER_CPU_S = 2.0  # CPU per render (serve --chat-render-cpu-s): real templates take milliseconds for 1,024 messages
MAX_FRAME_BYTES = 64 << 20  # a request holds at most 4 MiB of content (32 MiB of JSON body) and a template
MAX_RENDER_MEMORY = 512 << 20  # address space a render may add: 4 MiB of messages copied many times fits
RENDER_RECURSION_LIMIT = 1_000  # Python frames: a macro calling itself stops here (RecursionError), not in a crash
CPU_BACKSTOP_S = 1  # RLIMIT_CPU this far past the timer: kills a render inside one C call, where no handler runs
_budget = {"cpu_s": 0.0}  # the running render's, for the timer's message


def read_frame(stream) -> dict | None:
    """The next request, or None at end of input (the parent closed the pipe)."""
    head = stream.read(FRAME.size)
    if len(head) < FRAME.size:
        return None
    (size,) = FRAME.unpack(head)
    if size > MAX_FRAME_BYTES:
        raise SystemExit(f"template_worker: a request of {size:,} bytes; the limit is {MAX_FRAME_BYTES:,}")
    body = stream.read(size)
    return msgpack.unpackb(body, raw=False) if len(body) == size else None


def frame(message: dict) -> bytes:
    body = msgpack.packb(message, use_bin_type=True)
    return FRAME.pack(len(body)) + body


def _cpu_used_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _limit_memory() -> None:
    """RLIMIT_AS = what this process maps now + MAX_RENDER_MEMORY; past it allocation is a MemoryError."""
    with open("/proc/self/status") as status:
        mapped = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (mapped + MAX_RENDER_MEMORY, mapped + MAX_RENDER_MEMORY))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a render killed by RLIMIT_CPU leaves no core file


def answer(request: dict) -> dict:
    """Render one request inside its CPU budget; every outcome is an answer, never an exception."""
    from jinja2 import TemplateError

    from engine.http.template_sandbox import RenderLimit, render_bounded

    cpu_s = _budget["cpu_s"] = float(request["cpu_s"])
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = int(_cpu_used_s() + cpu_s) + 1 + CPU_BACKSTOP_S
    resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
    signal.setitimer(signal.ITIMER_PROF, cpu_s)
    try:
        return {"text": render_bounded(request["origin"], request["source"], request["messages"],
                                       request.get("bos_token", ""), request.get("eos_token", ""))}
    except RenderLimit as exc:
        return {"limit": exc.limit, "message": str(exc)}
    except RecursionError:
        return {"limit": "recursion", "message": f"calls nest deeper than {RENDER_RECURSION_LIMIT:,} Python frames"}
    except MemoryError:
        return {"limit": "memory", "message": f"the render needed more than {MAX_RENDER_MEMORY >> 20:,} MiB of memory "
                                                f"(MAX_RENDER_MEMORY)"}
    except TemplateError as exc:
        return {"refused": str(exc)}
    except Exception as exc:  # noqa: BLE001 - the template's own failure (1/0, a filter on the wrong type)
        return {"refused": f"{type(exc).__name__}: {exc}"}
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)


def _out_of_cpu(signum, frame_) -> None:
    from engine.http.template_sandbox import RenderLimit

    raise RenderLimit("cpu", f"the render used {_budget['cpu_s']:g} s of CPU, its budget (serve --chat-render-cpu-s)")


def main(argv: list[str]) -> int:
    from engine.parent_watch import die_with_parent

    die_with_parent(int(argv[1]) if len(argv) > 1 else None)
    from engine.http.template_sandbox import RenderLimit, render_bounded

    render_bounded("warm-up", "{{ messages[0].content }}", [{"content": ""}])  # jinja's lazy imports, before the limit
    _limit_memory()
    sys.setrecursionlimit(RENDER_RECURSION_LIMIT)
    signal.signal(signal.SIGPROF, _out_of_cpu)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        request = read_frame(stdin)
        if request is None:
            return 0
        try:
            reply = answer(request)
        except RenderLimit as exc:  # the timer fired between the render's end and its disarming
            reply = {"limit": exc.limit, "message": str(exc)}
        stdout.write(frame(reply))
        stdout.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
