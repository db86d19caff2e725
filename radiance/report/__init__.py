"""One truth across ranks, processes and containers: what the patches did, and their counters, served
by the engine itself through vLLM's own channels -- no side files.

* after the model load, every TP rank's patch report is gathered (the TP group's CPU communicator);
  a feature whose ranks disagree is reconciled there (``Patch.on_ranks_disagree``: fp8-stream takes
  itself off on every rank) and merges as ``mixed`` (``patch_worker``);
* every step, TP rank 0 attaches what changed (counter increases, the gathered reports when they
  changed) to its model-runner output (``patch_worker``); the engine core moves it into that step's
  ``SpecDecodingStats`` -- a subclass with one more field, which vLLM's msgpack channel carries to the
  API server (``patch_engine``); there vLLM's Prometheus logger exports it: the counters as
  ``radiance:*``, the reports as ``radiance:patch_status{rank,feature,patch,status,reason} 1``
  (``patch_server``).
So the engine's ``/metrics`` says the same thing whoever reads it: the local gateway, a container's,
compose's gateway service.
"""
