"""dynamic-draft: each step's MTP draft depth chosen on the host by vLLM's scheduler, from what finished
steps measured.

``acceptance`` estimates how often each draft position is accepted, ``depth_policy`` picks the depth that
has been making the most tokens per second at the step's batch size, ``telemetry`` counts what it chose,
``patch_scheduler`` puts the policy where vLLM's scheduler looks up a step's depth, and ``patch_graphs``
lets every depth's step find the full CUDA graph Model Runner V2 captured for it.
"""
