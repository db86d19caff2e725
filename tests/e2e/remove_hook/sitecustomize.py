"""Test-only: make one vLLM hook point vanish while the radiance plugin looks for it.

Loaded through PYTHONPATH by tests/e2e/test_plugin_declines.py. E2E_REMOVE_HOOK names the
dotted path. The attribute is removed just for the plugin's register() and put back after,
which is what the plugin sees when vLLM renames something it hooks, while vLLM itself keeps
working, so the test can show the server still serves stock.
"""
import os

_HOOK = os.environ.get("E2E_REMOVE_HOOK")

if _HOOK:
    import radiance.plugin as _plugin
    from radiance.patching import resolve

    _real_register = _plugin.register

    def register():
        owner, attr, _ = resolve(_HOOK)
        definer = owner
        if isinstance(owner, type):
            definer = next(c for c in owner.__mro__ if attr in c.__dict__)
        saved = definer.__dict__[attr] if isinstance(definer, type) else getattr(definer, attr)
        delattr(definer, attr)
        try:
            _real_register()
        finally:
            setattr(definer, attr, saved)

    _plugin.register = register
