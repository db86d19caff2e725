"""RADIANCE: a vLLM plugin with four performance patches for Qwen3-Next and their kernels."""
from .versions import RADIANCE_VERSION as __version__

__all__ = ["__version__"]
