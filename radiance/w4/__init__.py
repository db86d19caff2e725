"""4-bit weights (W4A16): one quantiser, one packed layout, one GEMM, shared by the w4-drafter
and int4-head features. See ``layout`` for the format and ``quant`` for the quantiser; the GEMM
is ``radiance.kernels.w4a16_gemm``."""
