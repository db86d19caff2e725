"""The small description of a GPU that every launcher's choices are made from (standard library
only: the AOT module, which the launcher's tests import, names a device per arch with it)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceInfo:
    """What a launcher's choice of kernel variant, grid and compile options depends on beyond the
    shapes and dtypes of its arguments. A launch is a function of (shapes, dtypes, DeviceInfo), so
    the AOT list can plan, for a target that is not present, exactly the launches a device of
    that description makes (radiance.kernels.aot)."""
    backend: str       # "cuda" (NVIDIA), "hip" (ROCm) or "cpu" (Triton's interpreter, tests)
    arch: str          # "sm90", "gfx1201", ...; "cpu"
    num_sms: int       # SMs / CUs; 0 where there are none (the launchers pick their own stand-in)
    table_key: str     # stem of the per-device config tables (radiance/configs/<kernel>/<key>.json)
    interpret: bool = False  # TRITON_INTERPRET=1: kernels run in Triton's interpreter

    @property
    def capability(self) -> tuple[int, int]:
        """NVIDIA compute capability ((9, 0) for sm90); (0, 0) elsewhere."""
        if self.backend != "cuda":
            return (0, 0)
        n = int(self.arch[2:])
        return (n // 10, n % 10)

    @property
    def has_fp8(self) -> bool:
        """Whether the fp8 kernels serve this device: radiance_fp8 (the fp8-stream contract's
        linears) needs sm_89+ on NVIDIA (Fp8StreamConfig.get_min_capability); every ROCm target
        here has fp8 (gfx94x/95x, gfx12)."""
        return self.backend != "cuda" or self.capability >= (8, 9)

    @property
    def fp8_dtype(self):
        """float8_e4m3fnuz on gfx94x (MI300), float8_e4m3fn everywhere else (gfx12, sm_89+, CPU)."""
        import torch

        if self.backend == "hip" and self.arch.startswith("gfx94"):
            return torch.float8_e4m3fnuz
        return torch.float8_e4m3fn
