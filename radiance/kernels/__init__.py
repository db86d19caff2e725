"""Portable kernels: each op is a Triton kernel plus a PyTorch reference with the same
signature (the reference is what runs on CPU), registered as ``torch.ops.radiance.<name>``."""
