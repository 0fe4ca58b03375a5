"""`workload.load.hosts` refused before any run row where it cannot work, whether or not Ray
is installed: Ray missing (the extra to install named), a target in optlab's own process,
`processes` beside `hosts`, an address that is not one (docs/hosts.md)."""

from __future__ import annotations

from pathlib import Path

from optlab.store import Store
from tests.support.files import write
from tests.support.proc import run_python

# `optlab ARGS` with Ray made unimportable (as on a machine without the `ray` extra).
WITHOUT_RAY = (
    "import sys; sys.modules['ray'] = None\n"
    "from optlab.cli.main import main\n"
    "sys.argv = ['optlab', *sys.argv[1:]]\n"
    "main()\n"
)


def _http(folder: Path, load: str) -> Path:
    return write(
        folder,
        "svc.yaml",
        "name: svc\n"
        "target: {kind: http, url: 'http://127.0.0.1:9/', method: POST, code_version: v1}\n"
        "knobs: {}\n"
        f"workload:\n  load: {load}\n  inputs: {{template: {{id: '{{i}}'}}, count: 5}}\n",
    )


def _refused(path: Path, tmp_path: Path) -> str:
    db = tmp_path / "optlab.db"
    done = run_python(
        WITHOUT_RAY,
        env={"OPTLAB_DB": f"sqlite:///{db}"},
        cwd=tmp_path,
        args=("run", str(path), "--quick"),
    )
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert not db.exists() or Store.open(f"sqlite:///{db}").list_runs() == []
    return done.stderr


def test_hosts_without_ray_name_the_extra_to_install(tmp_path: Path) -> None:
    path = _http(tmp_path, "{mode: open, rate: 100, hosts: {ray: '127.0.0.1:6379', nodes: 2}}")
    err = _refused(path, tmp_path)
    assert "load from several hosts runs on Ray, which is not installed here" in err, err
    assert "pip install 'optlab[ray]'" in err


def test_hosts_with_processes_or_a_bad_address_are_refused(tmp_path: Path) -> None:
    both = _http(
        tmp_path,
        "{mode: open, rate: 100, processes: 2, hosts: {ray: '127.0.0.1:6379', nodes: 2}}",
    )
    err = _refused(both, tmp_path)
    assert "svc.yaml" in err and "set hosts.workers_per_node instead of processes" in err, err
    bad = _http(tmp_path, "{mode: open, rate: 100, hosts: {ray: 'head-node', nodes: 2}}")
    err = _refused(bad, tmp_path)
    assert "svc.yaml" in err and "'head-node' is not a Ray address" in err, err
    assert "HOST:PORT" in err


def test_hosts_for_a_target_in_optlabs_process_are_refused(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "synth.yaml",
        "name: synth\n"
        "target: {kind: builtin, name: synthetic}\n"
        "knobs: {distribution: exponential, service_ms: 2, servers: 1}\n"
        "workload:\n  load: {mode: open, rate: 100, hosts: {ray: '127.0.0.1:6379', nodes: 2}}\n",
    )
    err = _refused(path, tmp_path)
    assert (
        "synth.yaml:5: workload.load.hosts: load from other hosts needs a target measured "
        "over the network" in err
    ), err
