"""run_gate against a FAKE OpenAI-compatible server (aiohttp, in-process).

A unit test of the gate faking the endpoint boundary only: HTTP, retries, counters, scoring and the
report are real; the "model" answers GSM8K from the gold answers and bumps spec-decode counters by a
fixed amount per completion, scores prompts at a fixed log-likelihood per character and answers greedy
requests with token ids derived from the prompt (vLLM's prompt_logprobs and return_token_ids). The
end-to-end gate against real vLLM lives in tests/e2e.
"""
from __future__ import annotations

import asyncio
import json
import socket
import threading
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from launcher.gate import EndpointUnreachable, GateConfig, acceptance, client, gsm8k, run_gate, run_gate_async
from launcher.gate.report import render_html

MODEL = "fake-model"
# The gate's defaults without the target and speed checks (which need a reference; test_gate_target.py and
# test_gate_speed.py have them)
OFF = GateConfig(target={"enabled": False}, speed={"enabled": False})
SECRET = "sk-test-0123456789abcdef"


@dataclass
class FakeOpenAI:
    api_key: str | None = None
    drafter: bool = True
    # per completion: drafts, draft tokens, accepted, accepted per position
    per_completion: tuple = (4, 12, 6, (3, 2, 1))
    correct: callable = lambda i: i % 4 != 0
    fail_first: int = 0          # the first N completions answer 503
    always_fail_question: int | None = None
    smoke_text: str = " Paris."
    models: tuple = (MODEL,)
    nll: float = 1.5              # nats per token of every scored prompt token
    diverge_at: int | None = None  # greedy outputs differ from the undamaged ones from this token on
    diverge_prompts: int = 10**6   # ... in this many prompts (the first ones asked)
    # seconds per token of an ignore_eos completion (the speed check's rounds): the fake's decode speed
    token_s: float = 0.005
    counters: dict = field(default_factory=lambda: {"drafts": 0, "tokens": 0, "accepted": 0, "pos": [0, 0, 0]})
    requests: list = field(default_factory=list)

    def __post_init__(self):
        rows = [json.loads(line) for line in (gsm8k.PACKAGED_DIR / "test.jsonl").read_text().splitlines()]
        self._gold = {r["question"]: (i, gsm8k.gold_answer(r["answer"])) for i, r in enumerate(rows)}
        self._failed = 0

    # -- handlers
    def _authorized(self, request: web.Request) -> bool:
        return self.api_key is None or request.headers.get("Authorization") == f"Bearer {self.api_key}"

    async def models_handler(self, request):
        if not self._authorized(request):
            return web.json_response({"error": {"message": "Unauthorized"}}, status=401)
        return web.json_response({"object": "list", "data": [{"id": m, "object": "model"} for m in self.models]})

    async def completions(self, request):
        if not self._authorized(request):
            return web.json_response({"error": {"message": "Unauthorized"}}, status=401)
        body = await request.json()
        self.requests.append(body)
        if self._failed < self.fail_first:
            self._failed += 1
            return web.json_response({"error": {"message": "busy"}}, status=503)
        prompt = body["prompt"]
        if body.get("prompt_logprobs") is not None or body.get("return_token_ids"):
            return web.json_response(self._token_answer(body))
        if "\nAnswer:" in prompt and prompt.endswith("Answer:"):
            question = prompt.rsplit("Question: ", 1)[1][: -len("\nAnswer:")]
            i, gold = self._gold[question]
            if i == self.always_fail_question:
                return web.json_response({"error": {"message": "boom"}}, status=500)
            answer = gold if self.correct(i) else str(int(gold) + 1)
            text = f" Some steps, {i} things.\n#### {answer}\n\n"
        elif body.get("ignore_eos"):  # a speed round: exactly max_tokens, at the fake's decode speed
            await asyncio.sleep(self.token_s * body["max_tokens"])
            return web.json_response({"choices": [{"index": 0, "text": "x" * body["max_tokens"],
                                                   "finish_reason": "length"}],
                                      "usage": {"completion_tokens": body["max_tokens"]}})
        elif prompt == GateConfig().smoke.prompt:
            text = self.smoke_text
        else:
            text = " and so on, and so on."
        if self.drafter:
            d, t, a, pos = self.per_completion
            c = self.counters
            c["drafts"] += d
            c["tokens"] += t
            c["accepted"] += a
            c["pos"] = [x + y for x, y in zip(c["pos"], pos, strict=True)]
        return web.json_response({"choices": [{"index": 0, "text": text, "finish_reason": "stop"}],
                                  "usage": {"completion_tokens": 7}})

    def _token_answer(self, body: dict) -> dict:
        """vLLM's shape: prompt_token_ids + prompt_logprobs (first entry null), or the output's token_ids.
        One token per character; the greedy tokens follow from the prompt alone."""
        prompt = body["prompt"]
        ids = [ord(c) % 4096 for c in prompt]
        choice = {"index": 0, "text": "x", "finish_reason": "length", "prompt_token_ids": ids}
        if body.get("prompt_logprobs") is not None:
            choice["prompt_logprobs"] = [None] + [{str(t): {"logprob": -self.nll, "rank": 1, "decoded_token": "c"}}
                                                  for t in ids[1:]]
            choice["token_ids"] = [1]
        else:
            seed = sum(ids) % 4096
            out = [(seed + 7 * i) % 4096 for i in range(body["max_tokens"])]
            self._greedy_seen = getattr(self, "_greedy_seen", 0) + 1
            if self.diverge_at is not None and self._greedy_seen <= self.diverge_prompts:
                out = out[:self.diverge_at] + [(t + 1) % 4096 for t in out[self.diverge_at:]]
            choice["token_ids"] = out
        return {"choices": [choice], "usage": {"completion_tokens": len(choice["token_ids"])}}

    async def chat(self, request):
        # Like vLLM serving a model without a chat template.
        return web.json_response({"error": {"message": "no chat template", "code": 400}}, status=400)

    async def metrics_handler(self, request):
        lines = ["# HELP python_info Python platform information", "# TYPE python_info gauge",
                 'python_info{implementation="CPython"} 1.0']
        if self.drafter:
            c = self.counters
            for name, value in (("drafts", c["drafts"]), ("draft_tokens", c["tokens"]),
                                ("accepted_tokens", c["accepted"])):
                lines += [f"# TYPE vllm:spec_decode_num_{name}_total counter",
                          f'vllm:spec_decode_num_{name}_total{{engine="0",model_name="{MODEL}"}} {value}.0']
            lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter")
            lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="{MODEL}",'
                      f'position="{p}"}} {v}.0' for p, v in enumerate(c["pos"])]
            lines += ["# TYPE radiance:draft_steps_total counter", f"radiance:draft_steps_total {c['drafts']}"]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    # -- lifecycle: its own loop in a thread, like a separate server process
    def __enter__(self) -> str:
        started = threading.Event()
        self._loop = asyncio.new_event_loop()

        async def boot():
            app = web.Application()
            app.router.add_get("/v1/models", self.models_handler)
            app.router.add_post("/v1/completions", self.completions)
            app.router.add_post("/v1/chat/completions", self.chat)
            app.router.add_get("/metrics", self.metrics_handler)
            self._runner = web.AppRunner(app)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            self.port = self._runner.addresses[0][1]

        def serve():
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(boot())
            started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()
        assert started.wait(10)
        return f"http://127.0.0.1:{self.port}/v1"

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@pytest.fixture(autouse=True)
def _fast_waits(monkeypatch):
    monkeypatch.setattr(acceptance, "_SETTLE_INTERVAL_S", 0.01)


def _cfg(**sections) -> GateConfig:
    # The target and speed checks have their own tests (test_gate_target.py, test_gate_speed.py); off here
    # unless a test turns them on.
    base = {"target": {"enabled": False}, "speed": {"enabled": False},
            "acceptance": {"min_mean_acceptance_length": 2.0, "min_per_position": [0.7, 0.4]},
            "gsm8k": {"enabled": True, "threshold": 0.75, "tolerance": 0.1, "num_questions": 40, "seed": 3}}
    for k, v in sections.items():
        base[k] = {**base.get(k, {}), **v}
    return GateConfig.model_validate(base)


def test_fake_endpoint_gate_passes_with_reachable_thresholds():
    fake = FakeOpenAI()
    with fake as url:
        report = run_gate(_cfg(), url, model=MODEL, progress=False,
                          context={"profile": "tiny", "profile_hash": "abc123", "drafter": "mtp"})
    assert report.passed, report.reason
    assert [c.status for c in report.checks] == ["pass", "skipped", "skipped", "pass", "pass"]
    acc = report.check("acceptance").metrics
    assert acc["mean_acceptance_length"] == pytest.approx(2.5)
    assert acc["acceptance_rate"] == pytest.approx(0.5)
    assert acc["per_position"] == pytest.approx([0.75, 0.5, 0.25])
    assert set(acc["by_kind"]) == {"code", "json", "prose", "chat"}
    assert acc["num_drafts"] == 16 * 4  # the smoke completion happened before the first read
    assert acc["radiance"]["delta"] == {"radiance:draft_steps_total": 64}
    chat = [g for g in acc["generations"] if g["kind"] == "chat"]
    assert chat and all(g["endpoint"].startswith("completions") for g in chat)
    g = report.check("gsm8k").metrics
    subset = gsm8k.select(1319, 40, seed=3)
    assert g["num_questions"] == 40 and g["subset"]
    assert g["correct"] == sum(i % 4 != 0 for i in subset)
    assert g["strict_accuracy"] == g["flexible_accuracy"] == g["accuracy"]
    lo, hi = g["wilson95"]
    assert lo < g["accuracy"] < hi
    # every GSM8K request follows the CI protocol
    gs = [r for r in fake.requests if r["prompt"].endswith("\nAnswer:")]
    assert len(gs) == 40
    assert all(r["temperature"] == 0 and r["max_tokens"] == 256 and r["model"] == MODEL
               and r["stop"] == ["Question", "Assistant:", "<|separator|>"] for r in gs)
    assert report.context["profile_hash"] == "abc123"
    assert report.endpoint == f"http://127.0.0.1:{fake.port}"


def test_fake_endpoint_gate_fails_with_unreachable_thresholds():
    with FakeOpenAI() as url:
        report = run_gate(_cfg(acceptance={"min_mean_acceptance_length": 3.5},
                               gsm8k={"threshold": 0.99, "tolerance": 0.0}), url, model=MODEL, progress=False)
    assert not report.passed
    assert [c.status for c in report.checks] == ["pass", "skipped", "skipped", "fail", "fail"]
    assert report.reason.startswith("acceptance fail: mean acceptance length 2.500 < 3.5")
    assert "< 0.99 − 0 = 0.990" in report.check("gsm8k").reason


def test_fake_endpoint_without_drafter_skips_acceptance():
    with FakeOpenAI(drafter=False) as url:
        report = run_gate(OFF, url, model=MODEL, progress=False)
    assert report.passed
    assert report.check("acceptance").status == "skipped"
    assert "without a drafter" in report.check("acceptance").reason
    # thresholds without counters: a misconfigured server must not pass silently
    with FakeOpenAI(drafter=False) as url:
        report = run_gate(_cfg(gsm8k={"enabled": False}), url, model=MODEL, progress=False)
    assert report.check("acceptance").status == "fail"


def test_fake_endpoint_drafter_none_in_context_skips_without_requests():
    fake = FakeOpenAI()
    with fake as url:
        report = run_gate(OFF, url, model=MODEL, progress=False, context={"drafter": "none"})
    assert report.check("acceptance").status == "skipped"
    assert len(fake.requests) == 1  # only the smoke completion


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_endpoint_raises_not_fails():
    with pytest.raises(EndpointUnreachable, match="did not answer"):
        run_gate(OFF, f"http://127.0.0.1:{_free_port()}", model=MODEL, progress=False)


def test_fake_endpoint_api_key_is_sent_and_never_serialized():
    with FakeOpenAI(api_key=SECRET) as url:
        with pytest.raises(EndpointUnreachable, match="rejected the API key"):
            run_gate(OFF, url, model=MODEL, api_key="wrong", progress=False)
        report = run_gate(_cfg(), url, model=MODEL, api_key=SECRET, progress=False,
                          context={"api_key": SECRET, "note": f"started with {SECRET}", "api_key_env": "K"})
    assert report.passed, report.reason
    text = report.to_json() + render_html(report)
    assert SECRET not in text
    assert report.context["api_key"] == "***" and report.context["note"] == "started with ***"
    assert report.context["api_key_env"] == "K"


def test_fake_endpoint_retries_transient_errors_and_counts_permanent_ones():
    subset = gsm8k.select(1319, 40, seed=3)
    fake = FakeOpenAI(fail_first=2, always_fail_question=subset[5], correct=lambda i: True)
    with fake as url:
        report = run_gate(_cfg(gsm8k={"retries": 1}), url, model=MODEL, progress=False)
    g = report.check("gsm8k")
    assert report.check("smoke").status == "pass"  # survived two 503s
    assert g.metrics["request_errors"] == 1 and "HTTP 500" in g.metrics["first_error"]
    assert g.metrics["correct"] == 39 and g.status == "pass"
    assert "1 request(s) failed" in g.reason


def test_fake_endpoint_smoke_failure_skips_the_rest():
    with FakeOpenAI(smoke_text="") as url:
        report = run_gate(_cfg(), url, model=MODEL, progress=False)
    assert [c.status for c in report.checks] == ["fail", "skipped", "skipped", "skipped", "skipped"]
    assert report.reason == "smoke fail: the completion returned no text"


def test_fake_endpoint_model_not_served():
    with FakeOpenAI(models=("other",)) as url:
        report = run_gate(_cfg(), url, model=MODEL, progress=False)
    assert not report.passed and "not served here (served: other)" in report.reason


def test_fake_endpoints_baseline_comparison():
    on, off = FakeOpenAI(), FakeOpenAI(per_completion=(4, 12, 10, (4, 3, 3)))
    cfg = _cfg(acceptance={"baseline": True, "max_drop_vs_baseline": 0.5}, gsm8k={"enabled": False})
    with on as url, off as base_url:
        report = run_gate(cfg, url, model=MODEL, progress=False, baseline_url=base_url)
    a = report.check("acceptance")
    assert a.metrics["baseline"]["mean_acceptance_length"] == pytest.approx(3.5)
    assert a.status == "fail" and "below the baseline's 3.500" in a.reason
    assert "<polyline" in render_html(report) and "baseline (features off)" in render_html(report)


def test_run_gate_inside_a_running_loop():
    async def caller():
        with FakeOpenAI() as url:
            sync = run_gate(OFF, url, model=MODEL, progress=False)
            native = await run_gate_async(OFF, url, model=MODEL, progress=False)
        return sync, native

    sync, native = asyncio.run(caller())
    assert sync.passed and native.passed


def test_fake_endpoint_report_round_trips_and_progress_is_silent_off_a_tty(capsys):
    with FakeOpenAI() as url:
        report = run_gate(_cfg(), url, model=MODEL, progress=True)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""  # not a terminal: no bar
    from launcher.gate import GateReport
    assert GateReport.from_json(report.to_json()) == report


@pytest.mark.parametrize("given, root, shown", [
    ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000", "http://127.0.0.1:8000"),
    ("127.0.0.1:8000", "http://127.0.0.1:8000", "http://127.0.0.1:8000"),
    ("https://user:pw@host.example:443/v1?token=x", "https://user:pw@host.example:443/v1?token=x",
     "https://***@host.example:443/v1"),
])
def test_endpoint_root_and_redaction(given, root, shown):
    assert client.endpoint_root(given) == root
    assert client.redact_url(client.endpoint_root(given)) == shown
