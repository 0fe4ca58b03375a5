"""What one kind of target is to the rest of optlab.

Each kind (`optlab.targets.kinds.<name>`) says, in one module, how its knobs are checked, what
its inputs must be, what identifies its code, whether a service environment belongs in the
fingerprint, how it is built into a target the load generator drives, and what its knobs mean to
`optlab diagnose` (its stages' order, its wait stage, whether it batches or uses a GPU, how busy
its engine was by its own figures, and the knob that answers a finding: docs/diagnose.md "From
a finding to the next step"). The other layers ask the kind (`optlab.targets.registry.kind_of`)
instead of switching on `target.kind` or reading knobs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel

from optlab.config.models import ResolvedConfig, Target, Workload
from optlab.config.source import SourceFile
from optlab.targets.base import LoadedTarget
from optlab.targets.remedies import Remedy, check_declared, declared_remedy
from optlab.targets.templates import Secrets

__all__ = ["Remedy", "TargetKind"]


class TargetKind(ABC):
    """One kind of target. The defaults fit a kind without templates, inputs of its own or a
    service apart from optlab's process; each kind overrides what differs."""

    name: ClassVar[str]
    # Called from optlab's own threads (one load-generator process, a thread per request in
    # flight); otherwise measured over the network by asynchronous clients.
    in_process: ClassVar[bool]
    # What reports say of the service's environment when the run recorded none; None where the
    # target runs in optlab's process and optlab's own environment is its environment.
    service_note: ClassVar[str | None] = None
    # optlab starts the target's service and samples its process tree (a command target); an
    # http target's is sampled only when it happens to listen on this host.
    starts_service: ClassVar[bool] = False
    # The order reports list the target's stages in (the others follow by name): by default a
    # serving pipeline's usual request order, which a service's Server-Timing stages (`optlab
    # serve`'s, many others') follow; a kind that knows its own overrides it.
    stage_order: ClassVar[tuple[str, ...]] = ("queue", "preprocess", "infer", "postprocess")
    # The stage a request waits in for a batch to close (docs/run-json.md "batching": a target
    # that reports `batching` figures times that wait as its `queue` stage).
    batch_wait_stage: ClassVar[str | None] = "queue"
    # The section of the target's own figures (its metrics()) that reports its batches:
    # `mean_batch_size` and `max_batch_size` (docs/run-json.md "batching").
    batch_figures: ClassVar[str | None] = "batching"

    def knob_model(self, target: Target, paths: Sequence[Path]) -> type[BaseModel] | None:
        """The model the knobs are validated against; None takes free-form knobs."""
        return None

    def check_knobs(self, target: Target, knobs: dict[str, Any]) -> None:
        """Refuse, at load, knobs the target's other fields cannot use (a template naming a
        knob the config lacks, a declared remedy's knob it lacks). ConfigError without a
        location: the loader adds it."""
        check_declared(getattr(target, "remedies", ()), knobs)

    def check_code(self, target: Target, paths: Sequence[Path], source: SourceFile) -> None:
        """Refuse, at load, references to user code that does not resolve (a misspelt
        factory), before anything is stored; errors name the file and line."""
        return None

    def resolve_inputs(self, workload: Workload, source: SourceFile) -> Workload:
        """`workload.inputs` checked at load (errors name the file and line), with defaults."""
        return workload

    @abstractmethod
    def identity(self, target: Mapping[str, Any], paths: Sequence[Path]) -> dict[str, Any]:
        """A JSON-able identity of the target's code (`target` as stored); equal identities
        mean the same code."""

    def service_environment(
        self, target: Mapping[str, Any], folder: Path, environ: Mapping[str, str] | None
    ) -> dict[str, Any] | None:
        """The fingerprint's `service` section: None unless optlab starts the service."""
        return None

    def preflight(self, config: ResolvedConfig, where: str) -> None:
        """Refuse, before a run row exists, a target that cannot be measured now (an http
        target with nothing listening at its URL); `where` names the experiment."""
        return None

    @abstractmethod
    def build(
        self, config: ResolvedConfig, paths: Sequence[Path], secrets: Secrets
    ) -> LoadedTarget:
        """The target, ready to be driven. `${ENV_VAR}` values it resolves go into `secrets`."""

    # -- what the knobs mean to `optlab diagnose` (docs/diagnose.md) ----------------------------

    def batching_on(self, config: ResolvedConfig) -> bool:
        """Whether the target batches requests. The default reads the convention the reference
        classifier's knobs set and a service of it (`optlab serve`) takes: a `batching` knob
        whose `mode` is not off."""
        batching = config.knobs.get("batching")
        return isinstance(batching, dict) and batching.get("mode") not in (None, "off")

    def uses_gpu(self, config: ResolvedConfig) -> bool:
        """Whether the target runs on a GPU (so a run without GPU readings lacks them). The
        default reads the same convention: a `device` knob set to cuda."""
        return config.knobs.get("device") == "cuda"

    def engine_busy(self, figures: Mapping[str, Any] | None) -> tuple[float, int] | None:
        """(how long the target's engine was busy over the measured phase, in ms summed over
        its instances; those instances), from the figures the target reported about itself
        (the summary's `target`: its metrics(), or a service's `metrics_url`, docs/run-json.md).
        None where the kind reports no such figure (the default): the rules that would read it
        go on without it (docs/diagnose.md)."""
        return None

    def remedy(
        self, rule: str, stage: str | None, config: ResolvedConfig, cores: int | None
    ) -> Remedy | None:
        """The one knob that answers rule `rule` firing on `stage`, and its new value; None
        where the kind knows none (the finding's advice says what to try). The default: what
        the experiment file declares (`target.remedies`, docs/experiment-files.md)."""
        declared = getattr(config.target, "remedies", ())
        return declared_remedy(declared, rule, stage, config.knobs)
