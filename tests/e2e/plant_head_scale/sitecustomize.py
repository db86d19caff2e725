"""Test-only: plant a scale error in int4-head's 4-bit lm_head, so the gate has a damaged target to catch.

Loaded through the engine's PYTHONPATH by tests/e2e/test_gate_e2e.py (and the calibration runs that
measured it) and nowhere else: the product has no switch for this. E2E_HEAD_SCALE_ERROR is the factor
every output row's first group scale is multiplied by once the head is quantised, the kind of damage a
wrong scale layout or dtype in the quantiser would do: the weights of hidden dimensions 0..G-1 count that
many times over in every logit, the rest as quantised.
"""
import os

_FACTOR = os.environ.get("E2E_HEAD_SCALE_ERROR")

if _FACTOR is not None:
    import radiance.plugin as _plugin

    _real_register = _plugin.register

    def register():
        _real_register()
        if getattr(register, "planted", False):
            return  # vLLM loads its plugins more than once per process: one error, not one per load
        register.planted = True
        try:
            from radiance.lmhead_int4 import patch as head_patch
            from radiance.w4 import convert
        except Exception:
            return
        real = convert.install_packed

        def install_packed(layer, method, qweight, scales, group_size, method_cls=convert.W4Method, **kw):
            if method_cls is head_patch.Int4HeadMethod:  # the target's head only, never a drafter linear
                scales = scales.clone()
                scales[0] *= float(_FACTOR)
            return real(layer, method, qweight, scales, group_size, method_cls=method_cls, **kw)

        convert.install_packed = install_packed

    _plugin.register = register
