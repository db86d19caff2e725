"""dynamic-draft: a per-request, per-slot MTP draft-depth controller.

``controller`` is the pure decision logic (no torch, no vLLM), ``context_mirror`` keeps each
request's tokens on the device for the n-gram matcher, ``local_vocab`` samples the draft token
and its confidence from vocabulary shards at TP>1, ``telemetry`` counts what the controller did,
and ``patch_proposer`` hooks all of it into vLLM's proposer: per step (``step_control``), per
draft slot (``slot_capture``), across TP ranks (``tp_exchange``), one slot ahead (``lookahead``).
"""
