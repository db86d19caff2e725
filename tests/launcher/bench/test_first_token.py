"""The bench's first-token time, which it takes off a timed run to leave the decode time."""
from launcher.bench import worker


class _PausingLLM:
    """vLLM's LLM with a clock of its own: every generate takes 0.1 s, the ones named in ``pauses`` 9.6 s
    (a dynamic-draft engine on the H100 once waited that long before a run's first step)."""

    def __init__(self, pauses):
        self.now, self.calls, self.pauses = 0.0, 0, set(pauses)

    def reset_prefix_cache(self):
        pass

    def generate(self, inputs, params, use_tqdm=False):
        self.calls += 1
        self.now += 9.6 if self.calls in self.pauses else 0.1


def test_one_paused_first_token_run_does_not_become_the_batchs_prefill_time(monkeypatch):
    llm = _PausingLLM(pauses={1})
    monkeypatch.setattr(worker.time, "perf_counter", lambda: llm.now)
    assert abs(worker._first_token_s(llm, [], None) - 0.1) < 1e-9
    assert llm.calls == worker.FIRST_TOKEN_RUNS


def test_a_pause_in_every_first_token_run_is_still_measured(monkeypatch):
    llm = _PausingLLM(pauses={1, 2})
    monkeypatch.setattr(worker.time, "perf_counter", lambda: llm.now)
    assert abs(worker._first_token_s(llm, [], None) - 9.6) < 1e-9
