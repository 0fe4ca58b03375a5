"""A diagnosis for people: the terminal text, markdown for a pull request, the HTML report's
section, and the one line `optlab run` prints (docs/diagnose.md). The JSON is
`Diagnosis.to_json()` (docs/diagnose-json.md)."""

from __future__ import annotations

import html
import json
import textwrap
from typing import Any

from optlab.diagnose import Diagnosis, Finding

__all__ = [
    "describe_change",
    "diagnosis_json_line",
    "render_diagnosis",
    "render_diagnosis_html",
    "render_diagnosis_markdown",
    "run_line",
]

WIDTH = 100


def describe_change(finding: Finding, knobs: dict[str, Any] | None = None) -> str | None:
    """ "preprocess: python -> numpy-pooled"; None when the finding has no knob."""
    suggestion = finding.suggestion
    if suggestion is None:
        return None
    new = _value(suggestion.value)
    if knobs is not None and suggestion.knob in knobs:
        return f"{suggestion.knob}: {_value(knobs[suggestion.knob])} -> {new}"
    return f"{suggestion.knob}: {new}"


def _value(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
    return str(value)


def _wrap(text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent) or [indent]


def _headline(d: Diagnosis) -> str:
    verdict = {True: "VALID", False: "INVALID", None: "no verdict"}[d.valid]
    where = f" ({d.source})" if d.source else ""
    return f"run {d.run_id} · {d.experiment} · {d.status} {verdict}{where}"


def render_diagnosis(
    d: Diagnosis, knobs: dict[str, Any] | None = None, command: str | None = None
) -> str:
    """The terminal form: findings ranked, each with its numbers against the thresholds."""
    lines = [_headline(d)]
    if d.partial:
        lines += _wrap(f"partial evidence: {d.partial}; what follows is what it can show", "  ")
    if d.healthy:
        lines.append("healthy: no rule fired (every rule that could be evaluated passed)")
    elif d.state == "no-data":
        lines += _wrap(f"no data: {d.state_reason}; there is nothing to diagnose", "")
    elif d.state == "undecided":
        lines += _wrap(f"not healthy, undecided: {d.state_reason}", "")
    for rank, f in enumerate(d.findings, 1):
        lines.append("")
        head = "bottleneck" if rank == 1 else f"{rank}."
        lines.append(f"{head}: {f.bottleneck} — {f.rule.title} (confidence {f.confidence:.2f})")
        lines += _wrap(f.summary, "  ")
        for m in f.evidence:
            lines.append(f"    {m.describe()}")
        change = describe_change(f, knobs)
        if change is not None and f.suggestion is not None:
            lines.append(f"  next step: {change}")
            lines += _wrap(f"why: {f.suggestion.why}", "    ")
            if rank == 1 and command:
                lines.append(f"    write it: {command} --write-step")
        elif f.advice:
            lines += _wrap(f"try: {f.advice}", "  ")
    lines += _profile_lines(d)
    if d.passed:
        lines.append("")
        lines += _wrap("checked, nothing found: " + ", ".join(r for r, _ in d.passed), "")
    if d.not_evaluated:
        lines.append("not evaluated (missing evidence):")
        for rule, why in d.not_evaluated:
            lines += _wrap(f"{rule}: {why}", "  ")
    return "\n".join(lines)


def _profile_lines(d: Diagnosis, threads: int = 3) -> list[str]:
    """py-spy's view (`optlab run --profile`): the GIL and idle shares, and the top frame of
    the busiest threads."""
    profile = d.profile
    if profile is None:
        return []
    shares = []
    if profile.gil_pct is not None:
        shares.append(f"the GIL held in {profile.gil_pct:.0f}% of samples")
    if profile.idle_pct is not None:
        shares.append(f"threads idle (waiting) {profile.idle_pct:.0f}%")
    lines = ["", f"profile (py-spy, {profile.samples} samples): " + ", ".join(shares)]
    seen: list[str] = []
    for frame in profile.frames:
        if frame.thread in seen:
            continue
        seen.append(frame.thread)
        lines += _wrap(f"{frame.thread}: {frame.frame} ({frame.share_pct:.0f}%)", "  ")
        if len(seen) == threads:
            break
    return lines


def render_diagnosis_markdown(d: Diagnosis, knobs: dict[str, Any] | None = None) -> str:
    """Markdown for a pull request: the findings table, then each finding's evidence."""
    lines = [f"### Diagnosis: {_headline(d)}", ""]
    if d.partial:
        lines += [f"> Partial evidence: {d.partial}", ""]
    if d.healthy:
        lines.append("**Healthy**: no rule fired.")
        return "\n".join(lines) + "\n"
    if not d.findings:
        label = "No data" if d.state == "no-data" else "Undecided"
        lines.append(f"**{label}**: {d.state_reason}")
        return "\n".join(lines) + "\n"
    lines += ["| # | bottleneck | rule | confidence | next step |", "|---|---|---|---:|---|"]
    for rank, f in enumerate(d.findings, 1):
        change = describe_change(f, knobs) or "—"
        lines.append(
            f"| {rank} | `{f.bottleneck}` | {f.rule.title} | {f.confidence:.2f} | {change} |"
        )
    for rank, f in enumerate(d.findings, 1):
        lines += ["", f"**{rank}. {f.rule.title}** ({f.bottleneck}): {f.summary}", ""]
        lines += [f"- {m.describe()}" for m in f.evidence]
        if f.suggestion is not None:
            lines.append(f"- next step: `{describe_change(f, knobs)}`: {f.suggestion.why}")
        elif f.advice:
            lines.append(f"- try: {f.advice}")
    if d.not_evaluated:
        lines += ["", "Not evaluated: " + "; ".join(f"{r} ({w})" for r, w in d.not_evaluated)]
    return "\n".join(lines) + "\n"


def render_diagnosis_html(rows: list[tuple[str, Diagnosis]]) -> str:
    """The HTML report's section: one row per step (its newest run's diagnosis)."""
    if not rows:
        return ""
    out = [
        '<section id="diagnosis"><h2>Diagnosis</h2>',
        "<p>Each step's newest run read by <code>optlab diagnose</code>: the bottleneck, the "
        "numbers that show it, and the next one-variable step.</p>",
        "<table><thead><tr><th>step</th><th>run</th><th>bottleneck</th><th>confidence</th>"
        "<th>evidence</th><th>next step</th></tr></thead><tbody>",
    ]
    for step, d in rows:
        top = d.top
        if top is None:
            said = "no rule fired" if d.healthy else html.escape(d.state_reason or "")
            cells = [d.state, "", said, ""]
        else:
            evidence = "<br>".join(html.escape(m.describe()) for m in top.evidence)
            change = describe_change(top) or (top.advice or "")
            cells = [
                f"<code>{html.escape(top.bottleneck)}</code><br>{html.escape(top.rule.title)}",
                f"{top.confidence:.2f}",
                evidence,
                html.escape(change),
            ]
        partial = " (partial)" if d.partial else ""
        out.append(
            f"<tr><td>{html.escape(step)}</td><td>{d.run_id}{partial}</td>"
            + "".join(f"<td>{c}</td>" for c in cells)
            + "</tr>"
        )
    out.append("</tbody></table></section>")
    return "\n".join(out)


def run_line(d: Diagnosis, knobs: dict[str, Any] | None = None) -> str:
    """The line `optlab run` prints under a run: the top finding and the next step."""
    top = d.top
    if top is None and d.healthy:
        return f"diagnosis: healthy, no rule fired (`optlab diagnose {d.run_id}`)"
    if top is None:
        return f"diagnosis: {d.state}: {d.state_reason} (`optlab diagnose {d.run_id}`)"
    change = describe_change(top, knobs)
    tail = f"; next: {change}" if change else ""
    return (
        f"diagnosis: {top.bottleneck} — {top.rule.title} ({top.confidence:.2f}){tail} "
        f"(`optlab diagnose {d.run_id}`)"
    )


def diagnosis_json_line(d: Diagnosis) -> str:
    return json.dumps(d.to_json(), allow_nan=False)
