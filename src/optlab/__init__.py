"""optlab: an optimization experiment tracker that enforces one variable at a time.

Target code marks its stages with `optlab.stage("preprocess")`; a batching thread
attributes one batch to each of its requests with `stage("forward", requests=[...])`,
where each request was captured by `optlab.current_request()` on the submitting side.
"""

from optlab._version import __version__
from optlab.metrics.stages import current_request, stage

__all__ = ["__version__", "current_request", "stage"]
