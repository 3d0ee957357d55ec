from pathlib import Path

import pytest
import torch

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(autouse=True, scope="session")
def _single_thread():
    torch.set_num_threads(1)
