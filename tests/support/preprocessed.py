"""The reference classifier's preprocess output as a numpy array, whichever variant made it."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt


def as_array(image: Any) -> npt.NDArray[np.float32]:
    """A private copy as numpy: the pooled variant's result is overwritten by its next call."""
    if hasattr(image, "detach"):  # a torch tensor (torch is imported only where it is used)
        return np.array(image.detach().cpu().numpy(), dtype=np.float32, copy=True)
    return np.array(image, dtype=np.float32, copy=True)
