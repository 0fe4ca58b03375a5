"""The SLO type moved to `optlab.config.slo` (one definition for sweep, store and reports);
this name stays until every import has switched."""

from optlab.config.slo import PERCENTILES, Slo, parse_slo

__all__ = ["PERCENTILES", "Slo", "parse_slo"]
