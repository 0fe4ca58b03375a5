"""The `optlab diagnose --json` document (docs/diagnose-json.md): its models live with the
diagnosis that builds them (`optlab.diagnose.document`); named here for the schema generator and
the reports that show it."""

from __future__ import annotations

from optlab.diagnose.document import DiagnoseDocument, DiagnoseFinding

__all__ = ["DiagnoseDocument", "DiagnoseFinding"]
