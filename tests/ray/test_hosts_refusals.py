"""Load from hosts refused before any run row, with the fix: an unreachable cluster, more
workers than its nodes have CPUs, a node without optlab, a node at another optlab version,
and a step whose nodes' environment differs from its parent's (a hidden variable)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from optlab.store import Store
from tests.support.capabilities import module
from tests.support.files import write
from tests.support.httpsvc import command_experiment
from tests.support.proc import SRC, free_port, run_optlab

module("ray")  # the lane needs Ray: skipped, with the reason, where it is not installed
from tests.support.raycluster import LocalCluster, hosts_experiment  # noqa: E402

QUICK = ("--quick", "--duration", "3", "--warmup", "0.5")


def _refused(path: Path, folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / "optlab.db"
    done = run_optlab("run", str(path), *QUICK, db=db, cwd=folder, timeout=180)
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert not db.exists() or Store.open(f"sqlite:///{db}").list_runs() == []
    return done.stderr


def test_an_unreachable_cluster_is_refused(tmp_path: Path, mmc_port: int) -> None:
    path = hosts_experiment(tmp_path, "nowhere", mmc_port, f"127.0.0.1:{free_port()}")
    err = _refused(path, tmp_path)
    assert "the Ray cluster at 127.0.0.1:" in err and "cannot be reached" in err, err
    assert "ray start --head" in err


def test_more_workers_than_the_nodes_have_cpus_is_refused(
    cluster: LocalCluster, mmc_port: int, tmp_path: Path
) -> None:
    path = hosts_experiment(tmp_path, "crowded", mmc_port, cluster.address, workers=2)
    err = _refused(path, tmp_path)
    assert "3 nodes with 2 CPUs each are asked for" in err, err
    assert "has 0 such nodes of 3 alive" in err and "workers_per_node" in err


def _without_optlab(folder: Path) -> str:
    """A Python environment with Ray (this one's packages on its path) but not optlab: a
    `.pth` line puts site-packages on sys.path without running the `.pth` files there, so
    optlab's editable install is not seen."""
    venv = folder / "no-optlab"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return str(venv / "bin" / "python")


def test_a_changed_node_environment_no_optlab_or_another_version_are_refused(
    tmp_path: Path,
) -> None:
    """One cluster, its second node replaced three times: by one whose environment differs
    (a step on it refused as a hidden variable), one without optlab, one at another version."""
    nodes = LocalCluster(tmp_path / "ray")
    try:
        nodes.head()
        second = nodes.add()
        port = free_port()
        hosts = f"hosts: {{ray: '{nodes.address}', nodes: 2}}"
        base = command_experiment(
            tmp_path, "svc", port, load=f"{{mode: open, rate: 300, arrival: constant, {hosts}}}"
        )
        step = write(tmp_path, "fast.yaml", "name: svc-fast\nparent: svc\nchange: {delay_ms: 1}\n")
        db = tmp_path / "optlab.db"
        # A fresh cluster's first run meets its nodes' idle workers starting (a Python start
        # each): a 3 s warm-up, not 0.5 s, keeps that out of the measured seconds.
        warm = ("--quick", "--duration", "3", "--warmup", "3")
        done = run_optlab("run", str(base), *warm, db=db, cwd=tmp_path, timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
        nodes.remove(second)
        second = nodes.add(env={"OMP_NUM_THREADS": "3"})
        done = run_optlab("run", str(step), *warm, db=db, cwd=tmp_path, timeout=180)
        assert done.returncode == 2, done.stderr[-3000:]
        assert "hosts.nodes." in done.stderr and "OMP_NUM_THREADS" in done.stderr, done.stderr
        assert [r.experiment for r in Store.open(f"sqlite:///{db}").list_runs()] == ["svc"]

        nodes.remove(second)
        second = nodes.add(python=_without_optlab(tmp_path))
        err = _refused(base, tmp_path / "bare")
        assert "cannot import optlab" in err and "install optlab" in err, err

        nodes.remove(second)
        other = tmp_path / "other"
        shutil.copytree(SRC / "optlab", other / "optlab")
        (other / "optlab" / "_version.py").write_text('__version__ = "0.0.1"\n')
        nodes.add(env={"PYTHONPATH": str(other)})
        err = _refused(base, tmp_path / "other-version")
        assert "has optlab 0.0.1" in err and "every node must run the same optlab" in err, err
    finally:
        nodes.stop()
