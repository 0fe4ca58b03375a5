"""Reports: the stacked-gains table (`stacked.StackedTable`, built by `table`) and its renderers
(terminal, markdown, HTML, CSV, JSON), the capacity column, audit, check and diagnose's forms."""
