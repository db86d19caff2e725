"""Test-only: plant a scale error in int4-head's 4-bit lm_head, so the gate has a damaged target to catch;
and, separately, force int4-head's speed plan, so a head too small to pass the speed rule runs as a large one.

Loaded through the engine's PYTHONPATH by tests/e2e/test_gate_e2e.py, the calibration runs that measured it
and `benchmarks/h200_inside_vllm.sh headscale`, and nowhere else: the product has no switch for either.

E2E_HEAD_SCALE_ERROR is the factor every output row's first group scale is multiplied by once the head is
quantised, the kind of damage a wrong scale layout or dtype in the quantiser would do: the weights of hidden
dimensions 0..G-1 count that many times over in every logit, the rest as quantised.

E2E_INT4_HEAD_ROWS=N replaces the speed rule's plan, on any device, by "4-bit for head calls of up to N rows,
the bf16 head above": the plan the H200 made for Qwen3.5-27B's head (N = 40, issue 38), under which decode's
calls are 4-bit and a prompt-logprob call over a whole held text is not, unless the scoring scope sends it
through the 4-bit head in chunks. On the trained tiny model's head (4096 x 256) the rule declines int4-head on
a GPU, so without this no GPU run of the tiny model shows which head the gate's target check scores.
"""
import os

_FACTOR = os.environ.get("E2E_HEAD_SCALE_ERROR")
_ROWS = os.environ.get("E2E_INT4_HEAD_ROWS")

if _FACTOR is not None or _ROWS is not None:
    import radiance.plugin as _plugin

    _real_register = _plugin.register

    def register():
        _real_register()
        if getattr(register, "planted", False):
            return  # vLLM loads its plugins more than once per process: one plant, not one per load
        register.planted = True
        try:
            from radiance.lmhead_int4 import patch as head_patch
            from radiance.lmhead_int4 import speed
            from radiance.w4 import convert
        except Exception:
            return
        if _FACTOR is not None:
            real = convert.install_packed

            def install_packed(layer, method, qweight, scales, group_size, method_cls=convert.W4Method, **kw):
                if method_cls is head_patch.Int4HeadMethod:  # the target's head only, never a drafter linear
                    scales = scales.clone()
                    scales[0] *= float(_FACTOR)
                return real(layer, method, qweight, scales, group_size, method_cls=method_cls, **kw)

            convert.install_packed = install_packed
        if _ROWS is not None:
            rows = int(_ROWS)

            def _plan_for(self, method, layer, qweight, scales, act_dtype):
                # lost_at's timings are not measured here: 0 says so in the load line
                return speed.Plan(w4_max_rows=rows, lost_at=(rows + 1, 0.0, 0.0))

            head_patch.Int4HeadPatch._plan_for = _plan_for

    _plugin.register = register
