"""RADIANCE launcher: validate a profile, probe the machine, start vLLM with the plugin,
gate it, and expose the endpoint only once the gate has passed."""
