"""`radiance bench`: a profile's model timed stock and with its feature sets (vLLM's offline engine)."""
