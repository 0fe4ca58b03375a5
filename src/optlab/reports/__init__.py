"""Reports: the stacked-gains DataFrame (`table`) and its renderers (`terminal`)."""
