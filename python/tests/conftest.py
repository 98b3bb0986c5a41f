"""A real HTTP server on 127.0.0.1 standing in for the rdzv agent's report
endpoint, and the worker environment the agent would set."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Iterator, List, Optional

import pytest

import rdzv._core

TOKEN = "ab" * 32


class Request:
    def __init__(self, path: str, headers: Dict[str, str], body: Dict[str, Any]) -> None:
        self.path = path
        self.headers = headers
        self.body = body


class Agent:
    """Records every request; answers with status (204 unless a test sets
    another) and reason."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: List[Request] = []
        self.status = 204
        self.reason = ""
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                with agent.lock:
                    agent.requests.append(Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                    status, reason = agent.status, agent.reason
                self.send_response(status)
                data = reason.encode()
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.addr = "127.0.0.1:%d" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def bodies(self, path: Optional[str] = None) -> List[Dict[str, Any]]:
        with self.lock:
            return [r.body for r in self.requests if path is None or r.path == path]

    def steps(self) -> List[int]:
        return [b["step"] for b in self.bodies("/v1/step")]

    def checkpoints(self) -> List[Dict[str, Any]]:
        return self.bodies("/v1/checkpoint")


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test starts with no rate limit pending, nothing warned and no
    rdzv environment."""
    monkeypatch.setattr(rdzv._core, "_state", rdzv._core._State())
    for name in ("RDZV_AGENT_ADDR", "RDZV_JOB", "RDZV_GENERATION", "RDZV_REPORT_TOKEN",
                 "RDZV_RESUME_FROM", "RDZV_CHECKPOINT_DIR", "RDZV_MEMCKPT_DIR", "RDZV_RESUME_MEMORY", "RDZV_RESUME_MEMORY_WORLD", "RANK",
                 "RDZV_MEMCKPT_PERSIST_EVERY", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    yield


@pytest.fixture
def agent(monkeypatch: pytest.MonkeyPatch) -> Iterator[Agent]:
    a = Agent()
    monkeypatch.setenv("RDZV_AGENT_ADDR", a.addr)
    monkeypatch.setenv("RDZV_JOB", "train")
    monkeypatch.setenv("RDZV_GENERATION", "3")
    monkeypatch.setenv("RDZV_REPORT_TOKEN", TOKEN)
    yield a
    a.close()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    c = FakeClock()
    monkeypatch.setattr(rdzv._core, "_monotonic", c)
    return c
