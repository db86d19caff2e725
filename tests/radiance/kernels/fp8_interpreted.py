"""What the fp8 epilogue tests' interpreter scripts share. The scripts run in a fresh process with
this folder importable (conftest's ``run_interpreted``); pytest never collects this file."""
from __future__ import annotations

import torch
from radiance.kernels import fp8_common as fc


def same_fp8(got, want) -> bool:
    """The fp8 codes bit for bit (compared as bytes: the interpreter has no fp8 comparison) and
    every other output equal."""
    return (torch.equal(got[0].view(torch.uint8).cpu(), want[0].view(torch.uint8).cpu())
            and all(torch.equal(g.cpu(), w.cpu()) for g, w in zip(got[1:], want[1:], strict=True)))


def check_fp8_cases(cases, pair) -> None:
    """For every case, fp8 format and group size, ``pair(case, fmt, group)`` gives (kernel output,
    reference output), or None where the combination does not apply; prints OK, or MISMATCH and
    the (case..., format, group) that differ."""
    bad = []
    for case in cases:
        for fmt in fc.FP8_DTYPES:
            for group in fc.SUPPORTED_GROUPS:
                outs = pair(case, fmt, group)
                if outs is not None and not same_fp8(*outs):
                    bad.append((*case, str(fmt), group))
    print("MISMATCH", bad) if bad else print("OK")
