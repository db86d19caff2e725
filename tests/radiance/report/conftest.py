"""The report channel keeps per-process state (its counter sources, the gathered reports and what was
sent); each test starts from an empty one."""
from __future__ import annotations

import pytest

from radiance.report import channel


@pytest.fixture
def fresh_channel(monkeypatch):
    monkeypatch.setattr(channel, "_SOURCES", [])
    monkeypatch.setattr(channel, "_ranks", {})
    monkeypatch.setattr(channel, "_ranks_version", 0)
    monkeypatch.setattr(channel, "_sent_version", 0)
    return channel
