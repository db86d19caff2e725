"""The one type both ends of the engine-core channel must agree on: vLLM's ``SpecDecodingStats`` with
one more field, the report channel's payload (``channel.FIELD``). A default keeps every message that
lacks it decodable."""
from __future__ import annotations

from dataclasses import dataclass, field

from vllm.v1.spec_decode.metrics import SpecDecodingStats


@dataclass
class RadianceSpecDecodingStats(SpecDecodingStats):
    radiance: dict = field(default_factory=dict)
