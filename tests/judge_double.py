"""A loopback LLM judge speaking OpenAI's chat-completions wire format, with faults on a fixed schedule.

It grades by its own rule, independent of agentroll: 1 when the last `\\boxed{...}` of the "Answer to grade"
section holds the reference answer, else 0; in group mode (a prompt listing `Answer i:` sections) each answer so,
one `Score i: X` line each. `fail_every` N: every N-th request is a 500; `no_score_every` M: every M-th reply
says no score. A request's place in the count decides its fault, so retries of one sample meet other faults.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ANSWER = re.compile(r"Answer to grade:\n(.*)\Z", re.S)
GROUP = re.compile(r"Answer (\d+):\n(.*?)(?=\n\nAnswer \d+:\n|\n\nReason briefly|\Z)", re.S)
REFERENCE = re.compile(r"Reference answer:\n(.*?)\n\nAnswer to grade:", re.S)
GROUP_REFERENCE = re.compile(r"Reference or rubric \(may be empty\):\n(.*?)\n\n", re.S)


def grade(answer: str, label: str) -> float:
    tail = answer.rsplit("\\boxed{", 1)
    return 1.0 if len(tail) == 2 and tail[1].split("}", 1)[0].strip() == label.strip() else 0.0


class JudgeDouble:
    def __init__(
        self,
        fail_every: int = 0,
        no_score_every: int = 0,
        scale: float = 1.0,
        key: str | None = None,
        latency_s: float = 0.0,
    ) -> None:
        self.fail_every, self.no_score_every, self.scale, self.key = fail_every, no_score_every, scale, key
        self.latency_s = latency_s  # how long it thinks over each request (requests in flight overlap)
        self.in_flight = self.peak_in_flight = 0
        self.requests: list[dict[str, Any]] = []
        self.verdicts: list[dict[str, Any]] = []  # the requests answered with a score
        self.failed = self.unscored = 0
        self.keys: list[str | None] = []
        self._lock = threading.Lock()
        double = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                with double._lock:
                    double.in_flight += 1
                    double.peak_in_flight = max(double.peak_in_flight, double.in_flight)
                if double.latency_s:
                    time.sleep(double.latency_s)  # the judge's own latency, not a synchronisation
                status, reply = double.answer(self.path, body, self.headers.get("authorization"))
                with double._lock:
                    double.in_flight -= 1
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> JudgeDouble:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, path: str, body: dict[str, Any], key: str | None) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.requests.append(body)
            self.keys.append(key)
            n = len(self.requests)
        if path != "/v1/chat/completions":
            return 404, {"error": {"message": f"no route {path}"}}
        if self.key is not None and key != f"Bearer {self.key}":
            return 401, {"error": "Unauthorized"}
        if self.fail_every and n % self.fail_every == 0:
            self.failed += 1
            return 500, {"error": {"message": "judge overloaded", "type": "InternalServerError", "code": 500}}
        prompt = body["messages"][-1]["content"]
        if self.no_score_every and n % self.no_score_every == 0:
            self.unscored += 1
            text = "I cannot decide on this one."
        elif "Answer 1:\n" in prompt:
            label = GROUP_REFERENCE.search(prompt).group(1)
            lines = [f"Score {i}: {grade(a, label) * self.scale:g}" for i, a in GROUP.findall(prompt)]
            text = "Compared them.\n" + "\n".join(lines)
        else:
            label, answer = REFERENCE.search(prompt).group(1), ANSWER.search(prompt).group(1)
            text = f"The final result is checked.\nScore: {grade(answer, label) * self.scale:g}"
        if "Score" in text:
            with self._lock:
                self.verdicts.append(body)
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(text.split())}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return 200, {
            "id": f"chatcmpl-{n}",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": usage,
        }
