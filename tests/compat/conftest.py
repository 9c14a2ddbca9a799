"""Every compat test ends with the emulation removed, so patches never leak between tests."""
import pytest

from torchair import compat


@pytest.fixture(autouse=True)
def _no_leaked_emulation():
    yield
    leaked = compat.is_emulated()
    compat.restore()
    assert not leaked, "a test left the torch_npu emulation installed"
