"""Shared test setup: every test starts and ends with a fresh Dynamo cache."""
import pytest
import torch._dynamo


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
