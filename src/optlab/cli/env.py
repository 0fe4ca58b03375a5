"""`optlab env`: the photograph of the system that every run records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from optlab.cli.common import EXPERIMENT_PATH
from optlab.targets.service_env import describe_service, service_rows


def _fmt_bytes(value: Any) -> str:
    if not isinstance(value, int | float):
        return "n/a"
    return f"{value / 2**30:.1f} GiB"


def _machine_rows(fp: dict[str, Any]) -> list[tuple[str, str]]:
    """Hardware and system software, one (label, value) each."""
    hw, sw = fp.get("hardware", {}), fp.get("software", {})
    cpu = hw.get("cpu", {})
    gpus = hw.get("gpus") or []
    nvidia = sw.get("nvidia") or {}
    return [
        (
            "CPU",
            f"{cpu.get('model')} ({cpu.get('physical_cores')} physical, "
            f"{cpu.get('logical_cores')} logical)",
        ),
        ("memory", _fmt_bytes((hw.get("memory") or {}).get("total_bytes"))),
        (
            "GPUs",
            ", ".join(f"{g.get('name')} {_fmt_bytes(g.get('memory_total_bytes'))}" for g in gpus)
            or "none",
        ),
        ("CPU cores per GPU", str(hw.get("cpu_per_gpu") or "n/a")),
        (
            "disk",
            f"{(hw.get('disk') or {}).get('path')}: "
            f"{_fmt_bytes((hw.get('disk') or {}).get('total_bytes'))}",
        ),
        (
            "OS",
            f"{(sw.get('os') or {}).get('distro') or (sw.get('os') or {}).get('system')} "
            f"kernel {(sw.get('os') or {}).get('release')}",
        ),
        ("Python", str((sw.get("python") or {}).get("version"))),
        (
            "NVIDIA driver / CUDA",
            f"{nvidia.get('driver_version') or 'none'} / "
            f"{nvidia.get('cuda_driver_version') or 'none'}",
        ),
    ]


def _rows(fp: dict[str, Any]) -> list[tuple[str, str]]:
    sw = fp.get("software", {})
    pkgs = sw.get("packages", {})
    code = fp.get("code", {})
    git = (fp.get("provenance") or {}).get("git") or {}
    rows = _machine_rows(fp)
    for name, version in pkgs.items():
        if name == "torch_cuda":
            shown = version or ("none (CPU build)" if pkgs.get("torch") else "n/a")
            rows.append(("torch built for CUDA", shown))
        else:
            rows.append((name, str(version or "not installed")))
    rows.append(
        (
            "git",
            f"{git.get('commit') or 'not a git repository'}"
            f"{' (dirty)' if git.get('dirty') else ''}",
        )
    )
    if code.get("target"):
        rows.append(("target code", json.dumps(code["target"], sort_keys=True)))
    rows += service_rows(fp.get("service"))
    rows += hosts_rows(fp.get("hosts"))
    if not fp.get("service"):
        # A service optlab does not start (http) is out of sight: say so. (A command target's
        # service always has its section here; in-process targets have no service.)
        unseen = describe_service(None, (code.get("target") or {}).get("kind"))
        if unseen is not None:
            rows.append(("service environment", unseen))
    return rows


def hosts_rows(hosts: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The node set a load is sent from (workload.load.hosts), one row per node."""
    if not hosts:
        return []
    rows = [
        (
            "load from",
            f"{len(hosts['nodes'])} Ray nodes (Ray {hosts['ray']}), "
            f"{hosts['workers_per_node']} workers each",
        )
    ]
    for i, node in enumerate(hosts["nodes"]):
        cpu = node.get("cpu", {})
        packages = node.get("software", {}).get("packages", {})
        rows.append(
            (
                f"  node {i + 1}",
                f"{node.get('host')} {node.get('ip')}: {cpu.get('model')}, "
                f"{cpu.get('logical_cores')} cores, optlab {packages.get('optlab')}",
            )
        )
    return rows


@click.command()
@click.argument("experiment", required=False, type=EXPERIMENT_PATH)
@click.option("--json", "as_json", is_flag=True, help="Print the fingerprint as JSON.")
def env(experiment: str | None, as_json: bool) -> None:
    """Fingerprint this machine: hardware, software, versions, and code identity.

    With EXPERIMENT, also the code identity of that experiment's target and, for a command
    target, the service's environment: its interpreter, its version and its installed
    packages (or its executable's path, size and sha256), as `optlab run` records them.
    """
    from optlab.env.collect import collect_fingerprint
    from optlab.env.compare import material_hash
    from optlab.run.fingerprint import baseline_hosts, code_section, service_section

    fp = collect_fingerprint(data_dir=Path.cwd(), repo_dir=Path.cwd())
    service, _ = service_section(Path(experiment) if experiment else None)
    if service is not None:
        fp["service"] = service
    hosts = baseline_hosts(Path(experiment) if experiment else None)
    if hosts is not None:
        fp["hosts"] = hosts
    # The hash `optlab run` stores for this experiment's runs: the code part is not in it.
    fp["material_hash"] = material_hash(fp)
    fp["code"] = code_section(Path(experiment) if experiment else None)
    if as_json:
        click.echo(json.dumps(fp, indent=2, sort_keys=True))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(show_header=False, box=None)
    for key, value in _rows(fp):
        table.add_row(f"[bold]{key}[/bold]", value)
    console = Console()
    console.print(table)
    for warning in fp.get("warnings", []):
        console.print(f"[yellow]warning:[/yellow] {warning}")
