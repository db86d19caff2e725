"""The suite's conftest gives every test the dispatch state the session started with: a test that
leaves torch's Python dispatch key excluded (as a leaked no_dispatch() guard does) cannot fail the
fake-tensor tests after it. The two tests run in this order, in one process."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
_LEAKED: list = []


def test_a_guard_left_entered_excludes_the_python_key():
    guard = torch._C._DisableTorchDispatch()
    guard.__enter__()
    _LEAKED.append(guard)  # held, never exited: a guard that outlives its test
    assert torch._C._dispatch_tls_local_exclude_set().has(torch._C.DispatchKey.Python)


def test_b_next_test_starts_clean_and_opcheck_passes():
    assert _LEAKED, "runs after test_a"
    # what the CI run's 27 failures were: opcheck's aot-dispatch step refuses an excluded Python key
    torch.library.opcheck(torch.ops.aten.mm.default, (torch.randn(4, 8), torch.randn(8, 2)))
    assert not torch._C._dispatch_tls_local_exclude_set().has(torch._C.DispatchKey.Python)
