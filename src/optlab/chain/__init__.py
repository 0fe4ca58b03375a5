"""The one-variable rule and the chain it builds: plan, lineage, split, comparability."""
