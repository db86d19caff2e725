"""Test-only: a sampler that sleeps, so the gate's speed check has a real slowdown to catch.

Put on the shared tiny engine's PYTHONPATH by tests/e2e/conftest.py and nowhere else: the product has no
such switch. E2E_SLOW_SAMPLER_FLAG names a file; while it exists, every call of vLLM's Sampler (once per
engine step: directly, or for the bonus token under speculative decoding) first sleeps the seconds the file
holds. Read at every step, so one engine serves the stock-speed and the slowed runs of the same test, and
with no file (the other tests) it costs a stat per step.
"""
import os

_FLAG = os.environ.get("E2E_SLOW_SAMPLER_FLAG")

if _FLAG:
    import radiance.plugin as _plugin

    _real_register = _plugin.register

    def register():
        _real_register()
        if getattr(register, "planted", False):
            return  # vLLM loads its plugins more than once per process: one sleep per step, not one per load
        register.planted = True
        try:
            from vllm.v1.sample.sampler import Sampler
        except Exception:
            return
        import time

        real = Sampler.forward

        def forward(self, *args, **kwargs):
            try:
                with open(_FLAG, encoding="utf-8") as fh:
                    time.sleep(float(fh.read().strip() or 0))
            except (OSError, ValueError):
                pass
            return real(self, *args, **kwargs)

        Sampler.forward = forward

    _plugin.register = register
