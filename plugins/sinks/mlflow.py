"""The ``mlflow`` sink: one MLflow run per fslab run.

The MLflow run is named by the fslab run id and tagged ``fslab.run_id``,
``fslab.method``, ``fslab.loss``, ``fslab.backbone``, ``fslab.dataset``,
``fslab.evaluator``, ``fslab.seed`` (and ``fslab.sweep``); its parameters are the
resolved configuration flattened to dotted keys (``train.lr``); its metrics the
training numbers (``train/loss``, ``train/positives``, ...) and each evaluation
(``val/5way_5shot/accuracy`` and ``.../accuracy_ci95``) on the training step,
stamped with the event's time; its artifacts ``config.json`` and, at the end,
``results.json``; its status FINISHED, FAILED or KILLED as the run ended.

By default it writes to a file store in ``mlruns/`` beside the runs folder
(``mlflow ui --backend-store-uri mlruns`` shows it), experiment ``fslab``;
``tracking_uri`` names any other (a server, ``http://mlflow.lab:5000``; a database needs MLflow's full package;
a relative folder is taken from beside the runs folder, as ``mlruns/`` is). MLflow
keeps its file store in maintenance mode and refuses it unless
``MLFLOW_ALLOW_FILE_STORE`` is set: the sink sets it for its own process when
the URI is a file store. ``fslab export`` writes a new MLflow run and, once it
is whole, deletes the one an earlier export or the live run left for the same
fslab run (an export that fails midway deletes its own instead). ``fslab eval``'s
scores are logged into the MLflow run the fslab run already has (:meth:`MLflowSink.reopen`),
where there is one, ended as the fslab run ended. A file store copied or moved with its project keeps
each experiment's artifact folder where it was made: such an experiment is refused (:func:`artifacts_here`).
Needs ``pip install 'fslab[mlflow]'``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

from fslab_plugins.sinks.common import (
    StepAxis,
    axis_before,
    eval_prefix,
    eval_values,
    installed,
    need,
    project_path,
    train_values,
)

from fslab.plugin import UsageError, dotted, hookimpl

STATUS = {"completed": "FINISHED", "failed": "FAILED", "killed": "KILLED", "lost": "FAILED"}
PARAM_LIMIT = 6000  # characters MLflow keeps of a parameter's value
BATCH = 200  # metrics sent in one call
PROBE_TIMEOUT = 10.0  # seconds a tracking server gets to answer before the sink gives up on it
NAMED_STORES = ("databricks", "databricks-uc", "uc")  # tracking URIs without ':' that are not folders


def metric_key(key: str) -> str:
    """A key MLflow accepts (letters, digits, ``_ - . / `` and spaces): ``knn[k=3]`` -> ``knn_k_3_``."""
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", key)


def answering(uri: str) -> None:
    """A ConnectionError when no server answers at an ``http(s)`` tracking URI
    within :data:`PROBE_TIMEOUT` s. MLflow's client retries a refused or silent
    server for minutes before it gives up, so ``fslab export`` seemed to hang.
    Any answer will do, an error status or a certificate MLflow may be told to
    accept included: the client then says what is wrong."""
    if not uri.startswith(("http://", "https://")):
        return
    import ssl
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=PROBE_TIMEOUT).close()
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, ssl.SSLError):
            return
        raise ConnectionError(f"no MLflow server answers at {uri} ({reason}); start it (mlflow server "
                              f"--port ...), or give the sink's tracking_uri") from None


_EXPORTED: dict[tuple[str, str], dict[str, list[str]]] = {}


def exported(client, uri: str, experiment: str) -> dict[str, list[str]]:
    """The MLflow runs of ``experiment`` by their ``fslab.run_id`` tag, searched
    once per process, kept up to date by the sinks that replay runs into it
    (``fslab export``) and read by those adding to one (``fslab eval``). A file
    store reads every run of the experiment for each search, so searching for
    each exported run took a store of 400 runs 8 minutes on a 2-core machine. A
    live run (or its resume) asks the store."""
    key = (uri, experiment)
    if key not in _EXPORTED:
        records: dict[str, list[str]] = {}
        token = None
        while True:
            page = client.search_runs([experiment], max_results=1000, page_token=token)
            for found in page:
                records.setdefault(found.data.tags.get("fslab.run_id"), []).append(found.info.run_id)
            token = page.token
            if not token:
                break
        _EXPORTED[key] = records
    return _EXPORTED[key]


def store(run, tracking_uri: str):
    """The client of the tracking store ``tracking_uri`` names (the file store ``mlruns/`` beside the
    runs folder where it names none), and its URI."""
    uri = tracking_uri or "mlruns"
    if ":" not in uri and uri not in NAMED_STORES:  # a folder: a relative one from beside runs/, wherever fslab ran
        uri = project_path(uri, run).as_uri()
    if uri.startswith("file:") or "://" not in uri:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    need("mlflow", "mlflow", "mlflow")
    answering(uri)
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri), uri


def artifacts_here(found, uri: str) -> None:
    """A UsageError where ``found``, an experiment of the file store at ``uri``, keeps its artifacts in a folder
    of its id outside the store (``file:///first/machine/mlruns/ID``): the store was copied or moved from there
    with the project, and MLflow would write each new run's config.json and results.json into that place, made
    anew where it is gone, where neither this store nor its ``mlflow ui`` would find them."""
    from urllib.parse import urlparse
    from urllib.request import url2pathname

    place = urlparse(found.artifact_location)
    if not uri.startswith("file:") or place.scheme != "file":
        return
    store, kept = Path(url2pathname(urlparse(uri).path)), Path(url2pathname(place.path))
    own = store / found.experiment_id
    if kept.name != found.experiment_id or not own.is_dir() or kept.parent.resolve() == store.resolve():
        return  # a folder of its own chosen for it, or the store's own
    raise UsageError(f"MLflow experiment '{found.name}' keeps its artifacts in {kept}, outside its store (copied or "
                     f"moved from there), where each new run's would go; log to a new experiment: "
                     f"--set experiment=NAME")


def metrics_of(event: dict, step: int, config: dict) -> list:
    """The MLflow metrics of a train or eval event at ``step``, stamped with its time; none for others."""
    from mlflow.entities import Metric

    kind = event.get("event")
    if kind == "train":
        values = {f"train/{k}": v for k, v in train_values(event).items()}
    elif kind == "eval":
        prefix = eval_prefix(event, config)
        values = {f"{prefix}/{k}": v for k, v in eval_values(event).items()}
    else:
        return []
    stamp = int(float(event.get("time", 0)) * 1000)
    return [Metric(metric_key(k), v, stamp, step) for k, v in values.items()]


class MLflowSink:
    """One fslab run as one MLflow run (see the module)."""

    @classmethod
    def reopen(cls, run, *, tracking_uri: str = "", experiment: str = "fslab"):
        """The fslab run's MLflow run, to log events into (:class:`MLflowAddition`); None where there is
        none, or more than one, or one not ended as the fslab run ended (a live sink cut off midway)."""
        client, uri = store(run, tracking_uri)
        found = client.get_experiment_by_name(experiment)
        records = exported(client, uri, found.experiment_id).get(run.id, []) if found else []
        if len(records) != 1:
            return None
        info = client.get_run(records[0]).info
        if info.lifecycle_stage != "active" or info.status != STATUS.get(run.state, "FAILED"):
            return None
        return MLflowAddition(run, client, records[0])

    def __init__(self, run, *, tracking_uri: str = "", experiment: str = "fslab") -> None:
        from mlflow.entities import Param

        self.client, uri = store(run, tracking_uri)
        self.run = run
        found = self.client.get_experiment_by_name(experiment)
        if found:
            artifacts_here(found, uri)  # a store copied from elsewhere: its artifacts would go back there
        self.experiment = found.experiment_id if found else self.client.create_experiment(experiment)
        tags = {f"fslab.{key}": value for key, value in run.tags().items()}
        self.records = exported(self.client, uri, self.experiment) if run.replay else None
        if self.records is None:
            earlier = [found.info.run_id for found in self.client.search_runs(
                [self.experiment], filter_string=f"tags.`fslab.run_id` = '{run.id}'")]
        else:
            earlier = list(self.records.get(run.id, []))
        self.mlflow_run, self.failed = None, False
        self.stale = earlier if run.replay else []  # an export replaces them, never adds a second copy
        if earlier and not run.replay:  # a resumed run goes on in its MLflow run
            self.mlflow_run = earlier[0]
            self.client.update_run(self.mlflow_run, status="RUNNING")
        else:
            try:
                self.mlflow_run = self.client.create_run(self.experiment, run_name=run.id, tags=tags).info.run_id
                params = [Param(key, (json.dumps(v) if isinstance(v, (list, dict)) else str(v))[:PARAM_LIMIT])
                          for key, v in dotted(run.config).items()]
                for i in range(0, len(params), 100):
                    self.client.log_batch(self.mlflow_run, params=params[i:i + 100])
            except BaseException:
                self.failed = True
                self._settle()
                raise
        self.pending: list = []
        self.steps = StepAxis()

    def write(self, event: dict) -> None:
        step = self.steps.place(event)
        self.pending += metrics_of(event, step, self.run.config)
        if len(self.pending) >= BATCH or event.get("event") in ("eval", "checkpoint", "end"):
            self._flush()

    def _flush(self) -> None:
        for i in range(0, len(self.pending), BATCH):
            self.client.log_batch(self.mlflow_run, metrics=self.pending[i:i + BATCH])
        self.pending = []

    def close(self) -> None:
        try:
            self._flush()
            for name in ("config.json", "results.json"):
                path = Path(self.run.path) / name
                if path.is_file():
                    self.client.log_artifact(self.mlflow_run, str(path))
            self.client.set_terminated(self.mlflow_run, STATUS.get(self.run.state, "FAILED"))
        except BaseException:
            self.failed = True
            raise
        finally:
            self._settle()

    def _settle(self) -> None:
        """An export's MLflow run in place of the earlier ones, once it is whole (metrics, artifacts and
        status written): they are deleted then; one that failed midway (a full disk) is deleted instead,
        and the earlier ones are kept as they were. A live run keeps its MLflow run either way."""
        if not self.run.replay:
            return
        if self.failed or self.run.cut_short:  # cut short: a write that failed, or a Ctrl-C between two
            if self.mlflow_run is not None:
                with contextlib.suppress(Exception):  # a store refusing this too keeps the earlier runs as well
                    self.client.delete_run(self.mlflow_run)
            return
        for stale in self.stale:
            self.client.delete_run(stale)
        if self.records is not None:
            self.records[self.run.id] = [self.mlflow_run]


class MLflowAddition:
    """New events of a finished run (``fslab eval``'s) logged into its MLflow run, on the steps an export
    of the whole run places them at; sent together at ``close()`` (none where cut short), its status and
    artifacts left as they were."""

    def __init__(self, run, client, mlflow_run: str) -> None:
        self.run, self.client, self.mlflow_run = run, client, mlflow_run
        self.steps: StepAxis | None = None
        self.pending: list = []

    def write(self, event: dict) -> None:
        if self.steps is None:
            self.steps = axis_before(self.run.path, [event])
        self.pending += metrics_of(event, self.steps.place(event), self.run.config)

    def close(self) -> None:
        if self.run.cut_short:
            return
        for i in range(0, len(self.pending), BATCH):
            self.client.log_batch(self.mlflow_run, metrics=self.pending[i:i + BATCH])


@hookimpl
def register_sinks(register):
    register(MLflowSink, name="mlflow",
             description="One MLflow run per fslab run: configuration as params, metrics on the step axis, "
                         "tags, config.json and results.json; file store mlruns/ beside runs/ unless tracking_uri.",
             paper="MLflow (pip install 'fslab[mlflow]')",
             check=installed("mlflow", "mlflow", "mlflow"))
